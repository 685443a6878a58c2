"""LongSpecTrainer on tiny random targets: loss goes down, only draft weights train and save, resume, bf16."""

import pytest
import torch
from safetensors.torch import load_file
from transformers import TrainingArguments

from transformers_longspec import LongSpecDraft
from transformers_longspec.trainers import (
    LongSpecTrainer,
    LongSpecTrainingArguments,
    TokenCollator,
    target_greedy_labels,
    target_last_layer_kv,
)

from tiny_models import make_target

ROWS = [{"input_ids": torch.randint(3, 99, (32,), generator=torch.Generator().manual_seed(i))} for i in range(4)]


def _args(tmp_path, **overrides):
    base = {"output_dir": str(tmp_path), "use_cpu": True, "report_to": [], "disable_tqdm": True,
            "per_device_train_batch_size": 4, "per_device_eval_batch_size": 4, "learning_rate": 1e-2, "max_steps": 3,
            "logging_steps": 1, "save_strategy": "no", "seed": 0}
    return LongSpecTrainingArguments(**{**base, **overrides})


def _trainer(target, args, draft=None, rows=ROWS):
    draft = draft if draft is not None else LongSpecDraft.from_target(target)
    return LongSpecTrainer(model=draft, target_model=target, args=args, train_dataset=rows, eval_dataset=rows,
                           data_collator=TokenCollator(pad_token_id=0))


def test_three_steps_lower_the_loss_and_train_only_the_draft(tmp_path, family):
    target = make_target(family)
    trainer = _trainer(target, _args(tmp_path))
    before = trainer.evaluate()["eval_loss"]
    trainer.train()
    after = trainer.evaluate()["eval_loss"]
    assert after < before - 0.3, (before, after)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 3 and losses[-1] < losses[0]
    draft_ids = {id(p) for p in trainer.model.parameters()}
    optimised = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert optimised == draft_ids
    assert not target.training and all(not p.requires_grad and p.grad is None for p in target.parameters())


def test_greedy_labels_are_the_targets_argmax():
    target = make_target("qwen2")
    ids = torch.stack([row["input_ids"] for row in ROWS[:2]])
    positions = torch.arange(32).expand_as(ids)
    _, _, hidden = target_last_layer_kv(target, ids, positions, return_hidden=True)
    labels = ids.clone()
    labels[1, 20:] = -100
    greedy = target_greedy_labels(target, hidden, labels, chunk=7)  # chunks that do not divide the length
    expected = target(ids).logits.argmax(-1)
    assert greedy[0, 0] == -100 and torch.equal(greedy[0, 1:], expected[0, :-1])
    assert torch.equal(greedy[1, 1:20], expected[1, :19]) and (greedy[1, 20:] == -100).all()
    assert not torch.equal(greedy[0, 1:], ids[0, 1:])  # a random text is not what the target would write


def test_distilled_training_fits_the_targets_greedy_choices(tmp_path):
    """With distill_labels the draft learns the target's argmax: measured against those labels (the distilled
    evaluation loss), it ends far below a draft trained for as long on the text."""
    target = make_target("llama")
    losses = {}
    for distill in (False, True):
        trained = _trainer(target, _args(tmp_path / str(distill), distill_labels=distill, max_steps=6))
        trained.train()
        judge = _trainer(target, _args(tmp_path / "eval", distill_labels=True), draft=trained.model)
        losses[distill] = judge.evaluate()["eval_loss"]
    assert losses[True] < losses[False] - 0.3, losses


def test_checkpoint_holds_only_the_draft_and_generates_like_greedy(tmp_path):
    target = make_target("llama")
    trainer = _trainer(target, _args(tmp_path, save_strategy="steps", save_steps=3))
    trainer.train()
    checkpoint = tmp_path / "checkpoint-3"
    saved = load_file(checkpoint / "model.safetensors")
    assert set(saved) == set(trainer.model.state_dict())
    assert not any(target.config.vocab_size in t.shape for t in saved.values())  # no embedding / LM head copy
    loaded = LongSpecDraft.from_pretrained(checkpoint, target_model=target)
    for name, tensor in trainer.model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    ids = torch.randint(3, 99, (1, 20), generator=torch.Generator().manual_seed(7))
    plain = target.generate(ids, do_sample=False, max_new_tokens=10)
    assert torch.equal(target.generate(ids, assistant_model=loaded, do_sample=False, max_new_tokens=10), plain)


def test_resume_repeats_the_uninterrupted_run(tmp_path):
    rows = [{"input_ids": torch.randint(3, 99, (24,), generator=torch.Generator().manual_seed(10 + i))}
            for i in range(8)]
    target = make_target("llama")
    full = _trainer(target, _args(tmp_path / "a", max_steps=4, save_strategy="steps", save_steps=2), rows=rows)
    full.train()
    resumed = _trainer(target, _args(tmp_path / "b", max_steps=4), rows=rows)
    resumed.train(resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-2"))
    for (name, a), b in zip(full.model.state_dict().items(), resumed.model.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=name)


def test_positions_and_noise_follow_the_options(tmp_path):
    target = make_target("llama")
    seen = []
    target.get_decoder().register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["position_ids"].clone()), with_kwargs=True
    )
    trainer = _trainer(target, _args(tmp_path, max_steps=1, gradient_accumulation_steps=2,
                                     per_device_train_batch_size=2, max_position=4096, anchor_sinks=3))
    trainer.train()
    assert len(seen) == 2  # two micro-steps, each with its own draw
    for pos in seen:
        assert pos[:, :3].tolist() == [[0, 1, 2]] * 2
        offsets = pos[:, 3:] - torch.arange(3, 32)
        assert (offsets == offsets[:, :1]).all() and int(pos.max()) <= 4095
    assert not torch.equal(seen[0], seen[1])
    seen.clear()
    trainer.evaluate()
    assert all(torch.equal(p, torch.arange(32).expand_as(p)) for p in seen)  # eval: natural positions


def test_noise_weights_choose_the_offset_and_the_run_learns(tmp_path):
    target = make_target("llama")
    trainer = _trainer(target, _args(tmp_path, max_steps=4, noise_weights=[0, 0, 1, 0]))
    offsets = []
    trainer.model.register_forward_pre_hook(lambda module, args, kwargs: offsets.append(kwargs["noise_offset"]),
                                            with_kwargs=True)
    before = trainer.evaluate()["eval_loss"]
    offsets.clear()
    trainer.train()
    assert offsets == [3, 3, 3, 3]  # all the weight on j = 3
    offsets.clear()
    after = trainer.evaluate()["eval_loss"]
    assert offsets == [1] and after < before - 0.3, (offsets, before, after)  # evaluation stays at j = 1


def test_several_offsets_per_step_share_one_target_pass_and_average_their_losses(tmp_path):
    target = make_target("llama")
    args = _args(tmp_path, noise_offsets_per_step=2, noise_weights=[1, 1, 0, 0], anchor_offset=False,
                 soft_labels_topk=4, soft_labels_weight=0.5, distill_labels=True)
    trainer = _trainer(target, args)
    offsets, target_passes = [], []
    trainer.model.register_forward_pre_hook(lambda module, a, kwargs: offsets.append(kwargs["noise_offset"]),
                                            with_kwargs=True)
    target.get_decoder().register_forward_pre_hook(lambda module, a: target_passes.append(1))
    batch = TokenCollator(pad_token_id=0)(ROWS)
    trainer.model.train()
    loss = trainer.compute_loss(trainer.model, batch)
    assert sorted(offsets) == [1, 2] and len(target_passes) == 1
    singles = []
    for j in (1, 2):  # each offset alone, through the same helper, on the same target pass
        keys, values, hidden, labels, top = trainer._target_pass(batch["input_ids"], torch.arange(32).expand(4, 32),
                                                                 None, batch["input_ids"])
        targets = trainer._loss_targets(trainer.model, batch["input_ids"], labels, top)
        singles.append(trainer._draft_loss(trainer.model, batch["input_ids"], torch.arange(32).expand(4, 32), keys,
                                           values, hidden, targets, j).loss)
    torch.testing.assert_close(loss, (singles[0] + singles[1]) / 2)
    assert not torch.isclose(singles[0], singles[1])  # the two offsets are two different losses
    before = trainer.evaluate()["eval_loss"]
    trainer.train()
    assert trainer.evaluate()["eval_loss"] < before - 0.3
    with pytest.raises(ValueError, match=r"noise_offsets_per_step must be an int in \[1, 2\]"):
        _args(tmp_path, noise_offsets_per_step=3, noise_weights=[1, 1, 0, 0])


def test_long_sequences_keep_natural_positions(tmp_path):
    target = make_target("llama")
    seen = []
    target.get_decoder().register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["position_ids"].clone()), with_kwargs=True
    )
    _trainer(target, _args(tmp_path, max_steps=1, anchor_max_length=32)).train()
    assert torch.equal(seen[0], torch.arange(32).expand(4, 32))


def test_attention_sinks_stay_visible_to_later_tokens():
    """With an anchor-offset jump, the target must not treat the sinks as another packed sequence."""
    target = make_target("llama")
    ids = torch.randint(3, 99, (1, 10), generator=torch.Generator().manual_seed(0))
    pos = torch.tensor([[0, 1, 2, 3] + list(range(900, 906))])
    keys, _ = target_last_layer_kv(target, ids, pos)
    changed = ids.clone()
    changed[0, 0] = (ids[0, 0] + 1) % 99
    keys2, _ = target_last_layer_kv(target, changed, pos)
    assert not torch.allclose(keys[:, :, -1], keys2[:, :, -1])


def test_bf16_autocast_keeps_fp32_draft(tmp_path):
    target = make_target("qwen2")
    draft = LongSpecDraft.from_target(target)
    trainer = _trainer(target, _args(tmp_path, max_steps=1, bf16=True), draft=draft)
    trainer.train()
    assert next(target.parameters()).dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in draft.parameters())
    assert torch.isfinite(torch.tensor(trainer.state.log_history[0]["loss"]))


def test_plain_training_arguments_get_longspec_defaults(tmp_path):
    target = make_target("llama")
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, max_steps=1, report_to=[], disable_tqdm=True,
                             per_device_train_batch_size=4, save_strategy="no")
    trainer = _trainer(target, args)
    assert args.remove_unused_columns is False
    trainer.train()


def test_user_errors_are_explained(tmp_path):
    target = make_target("llama")
    draft = LongSpecDraft.from_target(target)
    with pytest.raises(ValueError, match="needs the frozen target"):
        LongSpecTrainer(model=draft, args=_args(tmp_path))
    with pytest.raises(TypeError, match="LongSpecDraft"):
        LongSpecTrainer(model=make_target("llama"), target_model=target, args=_args(tmp_path))
    with pytest.raises(ValueError, match="Set bf16=True"):
        _trainer(target, _args(tmp_path), draft=draft.to(torch.bfloat16))
    with pytest.raises(ValueError, match="remove_unused_columns"):
        _args(tmp_path, remove_unused_columns=True)
    with pytest.raises(ValueError, match="noise_max"):
        _args(tmp_path, noise_max=0)
    with pytest.raises(ValueError, match="noise_weights has 3 entries but noise_max is 4"):
        _args(tmp_path, noise_weights=[0.5, 0.3, 0.2])
    with pytest.raises(ValueError, match="noise_max must be an int >= 1"):
        _args(tmp_path, noise_max=2.5, noise_weights=[1, 1])
    with pytest.raises(ValueError, match="noisy_training=False turns off"):
        _args(tmp_path, noisy_training=False, noise_weights=[1, 1, 1, 1])


def test_batch_without_supervised_tokens_is_a_zero_step(tmp_path):
    target = make_target("llama")
    rows = [{"input_ids": r["input_ids"], "labels": torch.full((32,), -100)} for r in ROWS]
    draft = LongSpecDraft.from_target(target)
    before = {k: v.clone() for k, v in draft.state_dict().items()}
    _trainer(target, _args(tmp_path, max_steps=1, weight_decay=0.0), draft=draft, rows=rows).train()
    assert all(torch.equal(before[k], v) for k, v in draft.state_dict().items())


def test_time_budget_ends_training_at_the_first_step_past_it(tmp_path):
    from transformers_longspec.trainers import TimeBudgetCallback

    target = make_target("llama")
    budget = TimeBudgetCallback(1e-9)  # over as soon as the first step ends
    trainer = _trainer(target, _args(tmp_path, max_steps=3))
    trainer.add_callback(budget)
    result = trainer.train()
    assert result.global_step == 1 and budget.stopped_at_step == 1
    roomy = TimeBudgetCallback(3600)
    trainer = _trainer(target, _args(tmp_path, max_steps=3))
    trainer.add_callback(roomy)
    assert trainer.train().global_step == 3 and roomy.stopped_at_step is None
    for bad in (0, -1.0, "10", True):
        with pytest.raises(ValueError, match="positive number of seconds"):
            TimeBudgetCallback(bad)


def test_time_budget_anneals_the_schedule_by_the_clock(tmp_path):
    """A run cut by its budget ends its cosine schedule anyway: the learning rate follows the clock when the steps
    fall behind max_steps, and the step count when they keep pace."""
    from transformers_longspec.trainers import TimeBudgetCallback

    target = make_target("llama")
    args = _args(tmp_path, max_steps=1000, lr_scheduler_type="cosine", logging_steps=1)
    slow = TimeBudgetCallback(1e-9)  # the clock is at the budget's end after the first step
    trainer = _trainer(target, args)
    trainer.add_callback(slow)
    trainer.train()
    assert slow.stopped_at_step == 1 and slow.schedule_step(1) == 1000
    assert trainer.lr_scheduler.get_last_lr()[0] == pytest.approx(0.0, abs=1e-12)  # the cosine's end
    roomy = TimeBudgetCallback(3600)
    trainer = _trainer(target, _args(tmp_path, max_steps=4, lr_scheduler_type="cosine"))
    trainer.add_callback(roomy)
    trainer.train()
    assert roomy.stopped_at_step is None and roomy.schedule_step(2) == 2  # in steps: unchanged
    plain = _trainer(target, _args(tmp_path, max_steps=4, lr_scheduler_type="cosine"))
    plain.train()
    assert trainer.lr_scheduler.get_last_lr() == plain.lr_scheduler.get_last_lr()
    fixed = TimeBudgetCallback(1e-9, anneal=False)
    trainer = _trainer(target, args)
    trainer.add_callback(fixed)
    trainer.train()
    assert trainer.lr_scheduler.get_last_lr()[0] > 0.99 * 1e-2  # one step of 1,000 in steps: near the peak
