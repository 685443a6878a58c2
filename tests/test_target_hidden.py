"""Drafts that read the target's hidden state (`LongSpecConfig.target_hidden_input`): exact decoding, the state fed at
inference is the one training feeds, and the trainer learns from it."""

import numpy as np
import pytest
import torch
from test_generation_exact import _generate_with_oracle, _OracleTree, _prompt

from transformers_longspec import LongSpecDraft, static_step
from transformers_longspec import generation as generation_module
from transformers_longspec.modeling import sliding_window_causal_mask
from transformers_longspec.trainers import LongSpecTrainer, LongSpecTrainingArguments, TokenCollator
from transformers_longspec.trainers.trainer import target_last_layer_kv

from tiny_models import make_target


def _feature_draft(target, seed: int = 0, **overrides) -> LongSpecDraft:
    """A feature draft whose hidden (and feature-layer) projections are random (zero at init would make the state
    irrelevant)."""
    draft = LongSpecDraft.from_target(target, target_hidden_input=True, **overrides)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        draft.block.hidden_proj.weight.normal_(0.0, 0.5, generator=generator)
        if draft.config.target_feature_layers:
            draft.block.feature_proj.weight.normal_(0.0, 0.5, generator=generator)
    return draft


def _target_states(target, ids, layers=()):
    """(seq, hidden x (1 + len(layers))): the final normed states of one plain forward, then the layers' outputs,
    from transformers' own `output_hidden_states` (entry i + 1 is layer i's output, except the last: normed)."""
    states = target.model(ids, output_hidden_states=True).hidden_states
    assert all(i < len(states) - 2 for i in layers), "the last layer's raw output is not among hidden_states"
    return torch.cat([states[-1], *(states[i + 1] for i in layers)], dim=-1)[0]


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


@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
@pytest.mark.parametrize("layers", [[0], [0, -1]], ids=str)
def test_feature_layer_draft_matches_greedy(family, layers, static, small_tail):
    """A draft that also reads target decoder layers' outputs (`target_feature_layers`, EAGLE-3's fused features)."""
    target = make_target(family)
    draft = _feature_draft(target, target_feature_layers=layers)
    for seed, length in [(2, 300), (0, 5)]:
        ids = _prompt(seed, length)
        plain = target.generate(ids, do_sample=False, max_new_tokens=24)
        spec = target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=24,
                               longspec_beam_widths=[4, 16, 16, 16, 16], longspec_static_shapes=static)
        assert torch.equal(plain, spec), (family, layers, static, seed)


@pytest.fixture
def small_tail(monkeypatch):
    monkeypatch.setattr(static_step, "TAIL", 8)


@pytest.mark.parametrize("layers", [(), (0,)], ids=["final", "layers"])
@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
def test_each_tree_reads_the_state_that_chose_its_root(static, layers, small_tail, monkeypatch):
    """Every tree gets the target's final hidden state at root_position - 1 (then the feature layers' outputs there;
    after the prefill, after rejected and after deep accepted paths alike): compared with one plain forward over the
    final sequence."""
    target = make_target("llama")
    draft = _feature_draft(target, target_feature_layers=list(layers) or None)
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
    out = _generate_with_oracle(target, draft, ids, spy, monkeypatch, longspec_beam_widths=list(widths),
                                longspec_static_shapes=static, longspec_retrieval=0)
    assert torch.equal(out[0], continuation)
    assert max(draft.last_generation_stats.accepted_lengths) == len(widths) + 1  # deep paths were accepted
    hidden = _target_states(target, out, layers)
    assert hidden.shape[-1] == 32 * (1 + len(layers))
    assert len(seen) == len(draft.last_generation_stats.accepted_lengths)
    for root_position, feature in seen:
        torch.testing.assert_close(feature.view(-1), hidden[root_position - 1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("layers", [None, [0]], ids=["final", "layers"])
@pytest.mark.parametrize("noise", [1, 3])
def test_a_step_sees_what_training_sees(family, noise, layers):
    """`step_logits` at position i with target K/V < i - noise + 1 and the state at i - noise gives the training
    forward's log-probs at i under noise offset j = noise (a tree node at depth j - 1 sits j positions past the
    cache)."""
    target = make_target(family)
    draft = _feature_draft(target, sliding_window=8, target_feature_layers=layers)
    ids = _prompt(5, 30)
    positions = torch.arange(30)[None]
    keys, values, hidden = target_last_layer_kv(target, ids, positions, return_hidden=True,
                                                feature_layers=layers or ())
    torch.testing.assert_close(hidden[0], _target_states(target, ids, layers or ()))
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
            feature = draft.target_feature(hidden[:, seen - 1 : seen])  # once per tree in grow_tree: the same logits
            once, _, _, _ = draft.step_logits(ids[:, i : i + 1], positions[:, i : i + 1], past_k, past_v, mask,
                                              keys[:, :, :seen], values[:, :, :seen], target_feature=feature)
            assert torch.equal(once, step)
        with pytest.raises(ValueError, match="not beside it"):
            draft.step_logits(ids[:, :1], positions[:, :1], past_k, past_v, mask, keys, values,
                              target_hidden=hidden[:, :1], target_feature=feature)


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


def test_added_feature_layers_start_silent_then_save_and_load(tmp_path):
    """`add_target_features` on a trained feature draft: zero projection, so the logits are unchanged; once the
    projection is trained, both save formats (folder, compact int8 file) bring the layers back."""
    target = make_target("qwen2")
    draft = _feature_draft(target, seed=2)
    ids = _prompt(1, 20)
    positions = torch.arange(20)[None]
    keys, values, hidden = target_last_layer_kv(target, ids, positions, return_hidden=True)
    with torch.no_grad():
        before = draft(ids, keys, values, target_hidden=hidden, return_logits=True).logits
        draft.add_target_features([-1])
        assert draft.config.target_feature_layers == [1] and draft.config.target_feature_size == 64
        _, _, features = target_last_layer_kv(target, ids, positions, return_hidden=True, feature_layers=[1])
        torch.testing.assert_close(draft(ids, keys, values, target_hidden=features, return_logits=True).logits, before)
        draft.block.feature_proj.weight.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(3))
        after = draft(ids, keys, values, target_hidden=features, return_logits=True).logits
    assert (after - before).abs().max() > 1e-2  # the layer now has a say
    draft.save_pretrained(tmp_path / "folder")
    compact = draft.save_compact(tmp_path / "draft.int8.safetensors")
    for path in (tmp_path / "folder", compact):
        loaded = LongSpecDraft.from_pretrained(path, target_model=target, dtype=torch.float32)
        assert loaded.config.target_feature_layers == [1]
        with torch.no_grad():
            got = loaded(ids, keys, values, target_hidden=features, return_logits=True).logits
        if path == compact:  # int8 rows: the rounding is far smaller than what the feature layer changed
            assert (got - after).norm() < 0.1 * (after - before).norm()
        else:
            torch.testing.assert_close(got, after)
    with pytest.raises(ValueError, match="already reads target layers"):
        draft.add_target_features([0])
    with pytest.raises(ValueError, match="needs a draft with target_hidden_input=True"):
        LongSpecDraft.from_target(target).add_target_features([0])


def test_a_widened_mlp_starts_silent_then_trains_saves_and_loads(tmp_path):
    """`widen_mlp` on a narrow draft: zero down-projection columns, so the logits are unchanged; the new gate / up
    rows are the target's next-strongest neurons; once trained, both save formats bring the width back."""
    target = make_target("qwen2")
    draft = LongSpecDraft.from_target(target, intermediate_size=32)
    ids = _prompt(1, 20)
    keys, values = target_last_layer_kv(target, ids, torch.arange(20)[None])
    with torch.no_grad():
        draft.block.mlp.down_proj.weight.normal_(0.0, 0.2, generator=torch.Generator().manual_seed(4))
        before = draft(ids, keys, values, return_logits=True).logits
    draft.widen_mlp(48)
    mlp = draft.block.mlp
    assert draft.config.intermediate_size == 48 and mlp.up_proj.weight.shape[0] == 48
    assert mlp.down_proj.weight.shape[1] == 48 and not mlp.down_proj.weight[:, 32:].any()
    theirs = target.get_decoder().layers[-1].mlp
    strength = theirs.up_proj.weight.norm(dim=1) * theirs.down_proj.weight.norm(dim=0)
    nxt = strength.argsort(descending=True)[32:48]
    torch.testing.assert_close(mlp.up_proj.weight[32:], theirs.up_proj.weight[nxt])
    with torch.no_grad():
        torch.testing.assert_close(draft(ids, keys, values, return_logits=True).logits, before)
    out = draft(ids, keys, values, return_logits=True).logits
    out.logsumexp(-1).mean().backward()  # the new neurons reach the loss through their down columns
    assert mlp.down_proj.weight.grad[:, 32:].abs().max() > 0
    with torch.no_grad():
        mlp.down_proj.weight[:, 32:].normal_(0.0, 0.2, generator=torch.Generator().manual_seed(5))
        after = draft(ids, keys, values, return_logits=True).logits
    assert (after - before).abs().max() > 1e-2
    draft.save_pretrained(tmp_path / "folder")
    compact = draft.save_compact(tmp_path / "draft.int4.safetensors", bits=4)
    for path in (tmp_path / "folder", compact):
        loaded = LongSpecDraft.from_pretrained(path, target_model=target, dtype=torch.float32)
        assert loaded.config.intermediate_size == 48 and loaded.block.mlp.down_proj.weight.shape[1] == 48
        with torch.no_grad():
            got = loaded(ids, keys, values, return_logits=True).logits
        if path == compact:  # int4 rows: close, not equal
            assert (got - after).norm() < 0.5 * (after - before).norm()
        else:
            torch.testing.assert_close(got, after)
    for bad in (48, 16):
        with pytest.raises(ValueError, match="widen_mlp needs an intermediate_size larger than the draft's 48"):
            draft.widen_mlp(bad)
    for bad in (64.0, True, "64", None):
        with pytest.raises(ValueError, match="widen_mlp takes the new width as an int"):
            draft.widen_mlp(bad)
    draft.widen_mlp(np.int64(56))  # numpy's ints are ints
    assert draft.config.intermediate_size == 56 and isinstance(draft.config.intermediate_size, int)


@pytest.mark.parametrize("overrides,match", [
    ({"target_feature_layers": [0]}, "needs target_hidden_input=True"),
    ({"target_hidden_input": True, "target_feature_layers": [2]}, r"distinct layers of the target's 2 \(0 \.\. 1"),
    ({"target_hidden_input": True, "target_feature_layers": [1, -1]}, "distinct layers"),
    ({"target_hidden_input": True, "target_feature_layers": [-3]}, "distinct layers"),
    ({"target_hidden_input": True, "target_feature_layers": 1}, "a list of target layer indices"),
    ({"target_hidden_input": True, "target_feature_layers": [0.5]}, "a list of target layer indices"),
])
def test_bad_feature_layers_are_refused(overrides, match):
    with pytest.raises(ValueError, match=match):
        LongSpecDraft.from_target(make_target("llama"), **overrides)


def test_a_step_with_feature_layers_needs_their_states():
    target = make_target("llama")
    ids = _prompt(1, 12)
    keys, values, hidden = target_last_layer_kv(target, ids, torch.arange(12)[None], return_hidden=True)
    draft = LongSpecDraft.from_target(target, target_hidden_input=True, target_feature_layers=[0])
    with pytest.raises(ValueError, match=r"hidden x \(1 \+ 1 feature layers\)\) = \(1, 12, 64\).*feature_layers="):
        draft(ids, keys, values, target_hidden=hidden)
    with pytest.raises(ValueError, match=r"= \(1, 1, 64\), got \(1, 1, 32\)"):  # a tree step: the final state alone
        draft.target_feature(hidden[:, -1:])


def test_trainer_feeds_feature_layers_and_they_learn(tmp_path):
    """The trainer hands a draft the outputs of its `target_feature_layers` beside the final states: the new
    projection starts at zero (the same loss as without), trains, and the loss falls."""
    torch.set_num_threads(1)
    target = make_target("qwen2")
    rows = [{"input_ids": torch.randint(3, 99, (64,), generator=torch.Generator().manual_seed(i))} for i in range(8)]
    losses = {}
    for layers in (None, [0]):
        args = LongSpecTrainingArguments(
            output_dir=str(tmp_path / str(layers)), use_cpu=True, report_to=[], disable_tqdm=True, max_steps=8,
            per_device_train_batch_size=8, per_device_eval_batch_size=8, learning_rate=1e-2, logging_steps=4,
            save_strategy="no", seed=0, distill_labels=True, soft_labels_topk=4)
        draft = LongSpecDraft.from_target(target, target_hidden_input=True, target_feature_layers=layers)
        trainer = LongSpecTrainer(model=draft, target_model=target, args=args, train_dataset=rows,
                                  eval_dataset=rows, data_collator=TokenCollator(pad_token_id=0))
        losses[str(layers)] = [trainer.evaluate()["eval_loss"]]
        trainer.train()
        losses[str(layers)].append(trainer.evaluate()["eval_loss"])
    assert losses["[0]"][0] == pytest.approx(losses["None"][0], rel=1e-5)
    assert losses["[0]"][1] < losses["[0]"][0] - 0.2, losses
    assert draft.block.feature_proj.weight.abs().max() > 1e-3  # the layer's output reached the loss


def test_a_target_without_the_read_layers_is_refused_at_attach(tmp_path):
    """A feature-layer draft attached to a target with fewer layers than it reads: a clear error when loading, not an
    IndexError at the first generate."""
    deep, shallow = make_target("llama", num_hidden_layers=4), make_target("llama")
    LongSpecDraft.from_target(deep, target_hidden_input=True, target_feature_layers=[1, -1]).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"reads target layers \[1, 3\] .* the target has 2 layers"):
        LongSpecDraft.from_pretrained(tmp_path, target_model=shallow)


def test_feature_layers_are_not_added_under_a_lora_adapter():
    pytest.importorskip("peft")
    from transformers_longspec.trainers import add_lora_to_draft

    wrapped = add_lora_to_draft(LongSpecDraft.from_target(make_target("llama"), target_hidden_input=True), r=2)
    with pytest.raises(ValueError, match="LoRA-wrapped draft"):
        wrapped.add_target_features([0])
