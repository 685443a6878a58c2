"""Drafts that read the target's hidden state (`LongSpecConfig.target_hidden_input`): exact decoding, the state fed at
inference is the one training feeds, and the trainer learns from it."""

import pytest
import torch
from test_generation_exact import _OracleTree, _prompt

from transformers_longspec import LongSpecDraft, static_step
from transformers_longspec import generation as generation_module
from transformers_longspec.modeling import sliding_window_causal_mask
from transformers_longspec.trainers import LongSpecTrainer, LongSpecTrainingArguments, TokenCollator
from transformers_longspec.trainers.trainer import target_last_layer_kv

from tiny_models import make_target


def _feature_draft(target, seed: int = 0, **overrides) -> LongSpecDraft:
    """A feature draft whose hidden projection is random (zero at init would make the state irrelevant)."""
    draft = LongSpecDraft.from_target(target, target_hidden_input=True, **overrides)
    with torch.no_grad():
        draft.block.hidden_proj.weight.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(seed))
    return draft


@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
@pytest.mark.parametrize("widths", [(4, 16, 16, 16, 16), (1, 1, 1), (3, 2)], ids=str)
def test_feature_draft_matches_greedy(family, widths, static, small_tail):
    target = make_target(family)
    draft = _feature_draft(target)
    options = {"longspec_beam_widths": list(widths), "longspec_static_shapes": static}
    for seed, length in [(2, 300), (0, 5)]:
        ids = _prompt(seed, length)
        plain = target.generate(ids, do_sample=False, max_new_tokens=24)
        spec = target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=24, **options)
        assert torch.equal(plain, spec), (family, widths, static, seed)


@pytest.fixture
def small_tail(monkeypatch):
    monkeypatch.setattr(static_step, "TAIL", 8)


@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
def test_each_tree_reads_the_state_that_chose_its_root(static, small_tail, monkeypatch):
    """Every tree gets the target's final hidden state at root_position - 1 (after the prefill, after rejected and
    after deep accepted paths alike): compared with one plain forward over the final sequence."""
    target = make_target("llama")
    draft = _feature_draft(target)
    ids = _prompt(3, 50)
    continuation = target.generate(ids, do_sample=False, max_new_tokens=40)[0]
    widths = (2, 2, 2)
    oracle, seen = _OracleTree(continuation, widths), []

    def spy(*args, target_hidden=None, **kwargs):
        seen.append((int(args[3]), target_hidden.clone()))
        if len(seen) % 2:  # every other tree carries the true continuation (deep acceptance), the rest are random
            return oracle(*args, **kwargs)
        return real(*args, target_hidden=target_hidden, **kwargs)

    real = generation_module.grow_tree
    monkeypatch.setattr(generation_module, "grow_tree", spy)
    monkeypatch.setattr(static_step, "grow_tree", spy)
    out = target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=40,
                          longspec_beam_widths=list(widths), longspec_static_shapes=static, longspec_retrieval=0)
    assert torch.equal(out[0], continuation)
    assert max(draft.last_generation_stats.accepted_lengths) == len(widths) + 1  # deep paths were accepted
    hidden = target.model(out).last_hidden_state[0]
    assert len(seen) == len(draft.last_generation_stats.accepted_lengths)
    for root_position, feature in seen:
        torch.testing.assert_close(feature.view(-1), hidden[root_position - 1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("noise", [1, 3])
def test_a_step_sees_what_training_sees(family, noise):
    """`step_logits` at position i with target K/V < i - noise + 1 and the state at i - noise gives the training
    forward's log-probs at i under noise offset j = noise (a tree node at depth j - 1 sits j positions past the
    cache)."""
    target = make_target(family)
    draft = _feature_draft(target, sliding_window=8)
    ids = _prompt(5, 30)
    positions = torch.arange(30)[None]
    keys, values, hidden = target_last_layer_kv(target, ids, positions, return_hidden=True)
    with torch.no_grad():
        logits = draft(ids, keys, values, target_hidden=hidden, noise_offset=noise, return_logits=True).logits
        for i in (noise, 12, 29):
            start = max(0, i - 7)
            past_k, past_v = draft.self_kv(ids[:, start:i], positions[:, start:i])
            mask = sliding_window_causal_mask(i - start + 1, 8)[-1:]
            seen = i - noise + 1
            step, _, _, _ = draft.step_logits(ids[:, i : i + 1], positions[:, i : i + 1], past_k, past_v, mask,
                                              keys[:, :, :seen], values[:, :, :seen],
                                              target_hidden=hidden[:, seen - 1 : seen])
            torch.testing.assert_close(torch.log_softmax(step[0, 0].float(), -1), torch.log_softmax(logits[0, i], -1),
                                       atol=1e-5, rtol=1e-5)


def test_new_feature_draft_starts_as_a_plain_one_and_round_trips(tmp_path):
    target = make_target("qwen2")
    plain, feature = LongSpecDraft.from_target(target), LongSpecDraft.from_target(target, target_hidden_input=True)
    assert not feature.block.hidden_proj.weight.any()  # zero-initialised: the state has no say yet
    ids = _prompt(1, 20)
    keys, values, hidden = target_last_layer_kv(target, ids, torch.arange(20)[None], return_hidden=True)
    with torch.no_grad():
        want = plain(ids, keys, values, return_logits=True).logits
        got = feature(ids, keys, values, target_hidden=hidden, return_logits=True).logits
    torch.testing.assert_close(got, want)
    trained = _feature_draft(target, seed=4)
    trained.save_pretrained(tmp_path)
    loaded = LongSpecDraft.from_pretrained(tmp_path, target_model=target)
    assert loaded.config.target_hidden_input and torch.equal(loaded.block.hidden_proj.weight,
                                                             trained.block.hidden_proj.weight)


def test_missing_or_unexpected_state_is_refused():
    target = make_target("llama")
    ids = _prompt(1, 12)
    keys, values, hidden = target_last_layer_kv(target, ids, torch.arange(12)[None], return_hidden=True)
    with pytest.raises(ValueError, match="pass target_hidden"):
        LongSpecDraft.from_target(target, target_hidden_input=True)(ids, keys, values)
    with pytest.raises(ValueError, match="built without target_hidden_input"):
        LongSpecDraft.from_target(target)(ids, keys, values, target_hidden=hidden)
    with pytest.raises(ValueError, match=r"\(batch, seq, hidden\)"):
        LongSpecDraft.from_target(target, target_hidden_input=True)(ids, keys, values, target_hidden=hidden[:, :5])


def test_trainer_feeds_the_state_and_the_loss_falls(tmp_path):
    """The trainer hands the target's final hidden states to a feature draft: its projection learns (it starts at
    zero, so before training both drafts score alike) and the loss on the target's own argmax labels falls."""
    torch.set_num_threads(1)
    target = make_target("qwen2")
    rows = [{"input_ids": torch.randint(3, 99, (64,), generator=torch.Generator().manual_seed(i))} for i in range(8)]
    before = {}
    for flag in (False, True):
        args = LongSpecTrainingArguments(
            output_dir=str(tmp_path / str(flag)), use_cpu=True, report_to=[], disable_tqdm=True, max_steps=8,
            per_device_train_batch_size=8, per_device_eval_batch_size=8, learning_rate=1e-2, logging_steps=4,
            save_strategy="no", seed=0, distill_labels=True)
        draft = LongSpecDraft.from_target(target, target_hidden_input=flag)
        trainer = LongSpecTrainer(model=draft, target_model=target, args=args, train_dataset=rows,
                                  eval_dataset=rows, data_collator=TokenCollator(pad_token_id=0))
        before[flag] = trainer.evaluate()["eval_loss"]
        trainer.train()
    after = trainer.evaluate()["eval_loss"]
    assert before[True] == pytest.approx(before[False], rel=1e-5)  # the same start (zero projection)
    assert after < before[True] - 0.2, (before, after)
    assert draft.block.hidden_proj.weight.abs().max() > 1e-3  # the state reached the loss and trained its projection
