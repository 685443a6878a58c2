"""Flash noisy training (LongSpec Alg. 2): noise draws, the reference mask, and the draft's shifted loss."""

from collections import Counter

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import rotate_half

from transformers_longspec import LongSpecDraft
from transformers_longspec.modeling import sliding_window_causal_mask
from transformers_longspec.trainers import (
    mask_noisy_labels,
    noise_visibility_mask,
    sample_noise_offset,
    target_last_layer_kv,
)
from transformers_longspec.trainers.noisy import sample_noise_offsets

from tiny_models import make_target


def test_noise_offset_range_and_reproducibility():
    g = torch.Generator().manual_seed(0)
    draws = [sample_noise_offset(4, g) for _ in range(400)]
    assert set(draws) == {1, 2, 3, 4}
    again = [sample_noise_offset(4, torch.Generator().manual_seed(5)) for _ in range(3)]
    assert len(set(again)) == 1
    assert sample_noise_offset(1, g) == 1


def test_noise_weights_set_the_offset_frequencies():
    g = torch.Generator().manual_seed(0)
    draws = Counter(sample_noise_offset(4, g, [0.4, 0.3, 0.2, 0.1]) for _ in range(4000))
    assert set(draws) == {1, 2, 3, 4}
    for j, p in zip((1, 2, 3, 4), (0.4, 0.3, 0.2, 0.1)):
        assert abs(draws[j] / 4000 - p) < 0.03, draws  # 4.5 standard deviations at p = 0.4
    assert {sample_noise_offset(4, g, [0, 0, 5, 0]) for _ in range(50)} == {3}  # unnormalised weights are fine
    assert sample_noise_offset(4, g, [np.float32(0), np.float64(0), 1, np.int64(0)]) == 3  # numpy scalars too
    again = [sample_noise_offset(4, torch.Generator().manual_seed(5), [1, 2, 3, 4]) for _ in range(3)]
    assert len(set(again)) == 1


def test_several_offsets_per_step_are_distinct_and_follow_the_weights():
    g = torch.Generator().manual_seed(0)
    draws = [sample_noise_offsets(4, 2, g, [1, 1, 1, 0]) for _ in range(300)]
    assert all(len(set(d)) == 2 and set(d) <= {1, 2, 3} for d in draws)
    assert Counter(j for d in draws for j in d).keys() == {1, 2, 3}
    assert sorted(sample_noise_offsets(4, 4, g)) == [1, 2, 3, 4]
    one = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    assert sample_noise_offsets(4, 1, one[0]) == [sample_noise_offset(4, one[1])]  # one offset: the same stream
    with pytest.raises(ValueError, match="needs at least 3 non-zero noise_weights"):
        sample_noise_offsets(4, 3, g, [1, 1, 0, 0])
    for bad in (0, 5, 1.0, True):
        with pytest.raises(ValueError, match=r"noise_offsets_per_step must be an int in \[1, noise_max=4\]"):
            sample_noise_offsets(4, bad)
    assert sorted(sample_noise_offsets(4, np.int64(2), g, [0, 1, 1, 0])) == [2, 3]
    for bad in (4.0, "4", None, 0):  # the count is not blamed for a bad noise_max
        with pytest.raises(ValueError, match="noise_max must be an int >= 1"):
            sample_noise_offsets(bad, 2)


@pytest.mark.parametrize("bad,match", [([0.5, 0.5], "has 2 entries but noise_max is 4"),
                                        ([1, -1, 1, 1], "must be >= 0"), ([0, 0, 0, 0], "positive, finite sum"),
                                        ([1e308] * 4, "positive, finite sum"), ([10**400, 1, 1, 1], "too large"),
                                        ([1, float("nan"), 1, 1], "finite numbers"), ("0.4,0.3,0.2,0.1", "list of 4"),
                                        ([1, True, 1, 1], "holds booleans"), ([1, "2", 1, 1], "real numbers")])
def test_noise_weights_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        sample_noise_offset(4, None, bad)


@pytest.mark.parametrize("bad", [0, -2, 2.5, True])
def test_noise_max_errors(bad):
    with pytest.raises(ValueError, match="noise_max"):
        sample_noise_offset(bad)


def test_visibility_mask_and_labels():
    mask = noise_visibility_mask(5, 2)
    expected = torch.tensor([[k <= i - 2 for k in range(5)] for i in range(5)])
    assert torch.equal(mask, expected) and not mask[:2].any()
    assert torch.equal(noise_visibility_mask(4, 1), torch.ones(4, 4, dtype=torch.bool).tril(-1))
    labels = torch.arange(6).view(1, 6)
    assert mask_noisy_labels(labels, 2).tolist() == [[-100, -100, -100, 3, 4, 5]]
    with pytest.raises(ValueError):
        noise_visibility_mask(4, 0)


def _rope(x, cos, sin):
    return x * cos.unsqueeze(1) + rotate_half(x) * sin.unsqueeze(1)


def _reference_loss(draft, ids, keys, values, pos, labels, j):
    """The draft's forward written out with the explicit noise mask (rows < j: zero cross-attention output)."""
    blk, seq = draft.block, ids.shape[1]
    hidden = draft.embed(ids)
    cos, sin = draft.rotary(hidden, pos)
    attn, _, _ = blk.self_attn(blk.input_layernorm(hidden), cos, sin, mask=sliding_window_causal_mask(seq, 512))
    hidden = hidden + attn
    x = blk.post_self_attention_layernorm(hidden)
    cross = blk.cross_attn
    q = _rope(cross.q_proj(x).view(1, seq, -1, cross.head_dim).transpose(1, 2), cos, sin)
    rep = q.shape[1] // keys.shape[1]
    k, v = keys.repeat_interleave(rep, 1), values.repeat_interleave(rep, 1)
    scores = (q @ k.transpose(-1, -2)) * cross.scaling
    scores = scores.masked_fill(~noise_visibility_mask(seq, j), float("-inf"))
    out = torch.nan_to_num(scores.softmax(-1)) @ v  # rows with nothing visible -> 0
    hidden = hidden + cross.o_proj(out.transpose(1, 2).flatten(2))
    hidden = draft.norm(hidden + blk.mlp(blk.post_cross_attention_layernorm(hidden)))
    logits = draft.lm_logits(hidden)
    return F.cross_entropy(logits[0, :-1], mask_noisy_labels(labels, j)[0, 1:], ignore_index=-100)


@pytest.mark.parametrize("j", [1, 2, 3])
def test_draft_loss_matches_explicit_noise_mask(j):
    target = make_target("llama")
    draft = LongSpecDraft.from_target(target)
    ids = torch.randint(3, 99, (1, 12), generator=torch.Generator().manual_seed(1))
    pos = torch.tensor([[0, 1, 2, 3] + list(range(500, 508))])  # anchor-offset positions
    keys, values = target_last_layer_kv(target, ids, pos)
    got = draft(ids, keys, values, position_ids=pos, labels=ids, noise_offset=j).loss
    want = _reference_loss(draft, ids, keys, values, pos, ids, j)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
