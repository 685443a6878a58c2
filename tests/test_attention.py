"""Hybrid tree attention equals plain masked attention over the concatenated keys."""

import pytest
import torch

from transformers_longspec.attention import hybrid_tree_attention


def _reference(q, k, v, tree_mask, scale):
    committed = k.shape[2] - q.shape[2]
    full = torch.cat([torch.ones(q.shape[2], committed, dtype=torch.bool), tree_mask], dim=1)
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1).double(), v.repeat_interleave(groups, 1).double()
    scores = (q.double() @ k.transpose(-1, -2)) * scale
    return torch.softmax(scores.masked_fill(~full, float("-inf")), dim=-1) @ v


def _random_tree_mask(size: int, g: torch.Generator) -> torch.Tensor:
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, size)]
    mask = torch.eye(size, dtype=torch.bool)
    for i in range(1, size):
        mask[i] |= mask[parents[i]]
    return mask


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 4, 16), (4, 2, 8), (12, 2, 64), (9, 3, 64)])
@pytest.mark.parametrize("committed,tree_size", [(0, 7), (1, 1), (37, 13), (700, 69)])
def test_hybrid_equals_masked_attention(heads, kv_heads, head_dim, committed, tree_size):
    g = torch.Generator().manual_seed(committed * 31 + tree_size)
    q = torch.randn(1, heads, tree_size, head_dim, generator=g)
    k = torch.randn(1, kv_heads, committed + tree_size, head_dim, generator=g)
    v = torch.randn(1, kv_heads, committed + tree_size, head_dim, generator=g)
    mask = _random_tree_mask(tree_size, g)
    scale = head_dim**-0.5
    out = hybrid_tree_attention(q, k, v, mask, scale)
    expected = _reference(q, k, v, mask, scale)
    err = (out.double() - expected).abs().max().item()
    print(f"max abs error {err:.2e} (H={heads}, Hkv={kv_heads}, D={head_dim}, C={committed}, T={tree_size})")
    assert out.dtype == q.dtype and out.shape == q.shape
    assert err < 1e-5


@pytest.mark.parametrize("committed,tree_size", [(0, 7), (37, 13), (700, 69)])
def test_split_path_in_bf16_on_cpu(committed, tree_size):
    """fp32 on a CPU is one SDPA call under the full mask (the test above); bf16 keeps the prefix / tree split."""
    g = torch.Generator().manual_seed(tree_size)
    q = torch.randn(1, 12, tree_size, 64, generator=g).bfloat16()
    k = torch.randn(1, 2, committed + tree_size, 64, generator=g).bfloat16()
    v = torch.randn(1, 2, committed + tree_size, 64, generator=g).bfloat16()
    mask = _random_tree_mask(tree_size, g)
    out = hybrid_tree_attention(q, k, v, mask, 0.125)
    assert out.dtype == torch.bfloat16 and (out.double() - _reference(q, k, v, mask, 0.125)).abs().max() < 2e-2


def test_hybrid_rejects_short_keys():
    q = torch.randn(1, 2, 5, 8)
    k = torch.randn(1, 2, 3, 8)
    with pytest.raises(ValueError, match="shorter than the masked block"):
        hybrid_tree_attention(q, k, k, torch.eye(5, dtype=torch.bool), 0.3)


@pytest.mark.parametrize("prefix,tail,visible", [(0, 8, 0), (0, 8, 5), (16, 8, 8), (40, 16, 3)])
def test_hybrid_with_cache_tail_in_masked_block(prefix, tail, visible):
    """Static-shape layout: [prefix | tail of the cache (first `visible` rows valid, rest garbage) | tree]."""
    g = torch.Generator().manual_seed(prefix + tail + visible)
    tree_size, heads, kv_heads, head_dim = 6, 4, 2, 16
    q = torch.randn(1, heads, tree_size, head_dim, generator=g)
    k = torch.randn(1, kv_heads, prefix + tail + tree_size, head_dim, generator=g)
    v = torch.randn(1, kv_heads, prefix + tail + tree_size, head_dim, generator=g)
    tree = _random_tree_mask(tree_size, g)
    tail_visible = (torch.arange(tail) < visible).expand(tree_size, tail)
    out = hybrid_tree_attention(q, k, v, torch.cat([tail_visible, tree], dim=1), head_dim**-0.5)
    # the same attention with the garbage rows removed: the valid prefix + tail rows, then the tree
    keep = torch.cat([torch.arange(prefix + visible), torch.arange(prefix + tail, prefix + tail + tree_size)])
    expected = _reference(q, k[:, :, keep], v[:, :, keep], tree, head_dim**-0.5)
    assert (out.double() - expected).abs().max().item() < 1e-5


@pytest.mark.parametrize("heads,kv_heads,q_len", [(12, 2, 1), (12, 2, 7), (4, 4, 3), (6, 3, 5)])
def test_packed_gqa_sdpa_equals_transformers_sdpa(heads, kv_heads, q_len):
    """The packed query heads see exactly what transformers' SDPA (kv heads repeated) computes, under a per-row
    additive mask and a boolean one."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from transformers_longspec.attention import packed_gqa_sdpa_forward

    gen = torch.Generator().manual_seed(heads + q_len)
    batch, keys, dim = 3, 40, 16
    q = torch.randn(batch, heads, q_len, dim, generator=gen)
    k, v = (torch.randn(batch, kv_heads, keys, dim, generator=gen) for _ in range(2))
    visible = torch.rand(batch, 1, q_len, keys + 8, generator=gen) < 0.6  # wider than the keys, as a static mask
    visible[..., 0] = True
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal, module.training = heads // kv_heads, False, False
    for mask in (visible, torch.where(visible, 0.0, torch.finfo(torch.float32).min)):
        want, _ = sdpa_attention_forward(module, q, k, v, mask[..., :keys], scaling=0.25)
        got, _ = packed_gqa_sdpa_forward(module, q, k, v, mask, scaling=0.25)
        torch.testing.assert_close(got, want)
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        packed_gqa_sdpa_forward(module, torch.zeros(1, 5, 1, dim), *torch.zeros(2, 1, 2, keys, dim), visible)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_packed_sdpa_as_a_models_attention_stays_causal_without_padding(family):
    """Selected by name on a model (no padding: transformers passes no mask), "longspec_packed_sdpa" gives the same
    logits as "sdpa"; with a padding mask too."""
    from tiny_models import make_target

    target = make_target(family, seed=5)
    ids = torch.randint(4, 99, (2, 12), generator=torch.Generator().manual_seed(0))
    padding = torch.ones_like(ids)
    padding[1, :3] = 0
    want = [target(ids).logits, target(ids, attention_mask=padding).logits]
    target.set_attn_implementation("longspec_packed_sdpa")
    torch.testing.assert_close(target(ids).logits, want[0])
    torch.testing.assert_close(target(ids, attention_mask=padding).logits[1, 3:], want[1][1, 3:])
