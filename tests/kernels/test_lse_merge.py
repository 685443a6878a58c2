"""Tests for kernels/lse_merge.py: the merge is exact attention over the union of two disjoint key sets."""

import pytest
import torch

from transformers_longspec.kernels import (
    fused_mask_attn,
    fused_mask_attn_ref,
    merge_attention_states,
    merge_attention_states_ref,
    prefix_attn,
    prefix_attn_ref,
)

from kernel_helpers import (
    KERNEL_DEVICE,
    MASK_KINDS,
    assert_within_ref_bound,
    make_mask,
    max_abs_err,
    needs_kernel,
    random_parents,
    random_qkv,
    tree_ancestor_mask,
)

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
NEG_INF = float("-inf")


def _random_states(shape, dtype, gen, empty_a=None, empty_b=None):
    """Two (out, lse) pairs for out shape `shape`; rows in empty_a / empty_b get lse -inf and out 0."""
    out_a, out_b = (torch.randn(shape, generator=gen).to(dtype) for _ in range(2))
    lse_a, lse_b = (torch.randn(shape[:-1], generator=gen) * 3 for _ in range(2))
    for out, lse, empty in ((out_a, lse_a, empty_a), (out_b, lse_b, empty_b)):
        if empty is not None:
            lse[empty] = NEG_INF
            out[empty] = 0
    return out_a, lse_a, out_b, lse_b


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_merge_matches_max_shifted_ref(dtype, gen):
    shape = (2, 3, 17, 32)
    empty_a = torch.rand(shape[:-1], generator=gen) < 0.2
    empty_b = torch.rand(shape[:-1], generator=gen) < 0.2  # some rows are empty on both sides
    states = _random_states(shape, dtype, gen, empty_a, empty_b)
    out, lse = merge_attention_states(*states)
    out_ref, lse_ref = merge_attention_states_ref(*states)
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert max_abs_err(lse, lse_ref) < 1e-5
    torch.testing.assert_close(out, out_ref)  # both compute in fp32; they may differ by the final rounding


def test_merge_empty_sides_are_exact_and_nan_free(gen):
    shape = (1, 2, 4, 8)
    out_a, lse_a, out_b, lse_b = _random_states(shape, torch.float32, gen)
    lse_b[..., 0] = NEG_INF  # B empty: result is A
    out_b[..., 0, :] = 0
    lse_a[..., 1] = NEG_INF  # A empty: result is B
    out_a[..., 1, :] = 0
    lse_a[..., 2] = lse_b[..., 2] = NEG_INF  # both empty: 0 and -inf
    out_a[..., 2, :] = out_b[..., 2, :] = 0
    for merge in (merge_attention_states, merge_attention_states_ref):
        out, lse = merge(out_a, lse_a, out_b, lse_b)
        assert not out.isnan().any() and not lse.isnan().any()
        assert torch.equal(out[..., 0, :], out_a[..., 0, :]) and torch.equal(lse[..., 0], lse_a[..., 0])
        assert torch.equal(out[..., 1, :], out_b[..., 1, :]) and torch.equal(lse[..., 1], lse_b[..., 1])
        assert (out[..., 2, :] == 0).all() and torch.isneginf(lse[..., 2]).all()


@pytest.mark.parametrize("mask_kind", MASK_KINDS)
@pytest.mark.parametrize("n_heads,n_kv_heads", ((4, 4), (4, 2), (6, 1)))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_merge_of_halves_equals_attention_over_concatenation(dtype, n_heads, n_kv_heads, mask_kind, gen):
    """attn([A; B], mask) == merge(attn(A, mask_A), attn(B, mask_B)), with empty rows on either side."""
    batch, q_len, len_a, len_b, head_dim = 2, 9, 13, 21, 16
    q, k, v = random_qkv(batch, n_heads, n_kv_heads, q_len, len_a + len_b, head_dim, dtype, "cpu", gen)
    mask = make_mask(mask_kind, batch, q_len, len_a + len_b, gen)
    if mask_kind == "empty_rows":
        mask[:, 1, :len_a] = False  # row 1 sees only B, row 2 only A
        mask[:, 2, len_a:] = False
    halves = (slice(0, len_a), slice(len_a, None))
    parts = [fused_mask_attn_ref(q, k[:, :, s], v[:, :, s], mask[:, :, s]) for s in halves]
    merged = merge_attention_states(*parts[0], *parts[1])
    # The merge rounds the halves to `dtype` first; the bound's atol covers that rounding.
    assert_within_ref_bound(
        merged, fused_mask_attn_ref(q, k, v, mask), fused_mask_attn_ref(q, k, v, mask, upcast=False), dtype
    )
    if dtype == torch.float32:
        assert max_abs_err(merged[0], fused_mask_attn_ref(q, k, v, mask)[0]) < 1e-5


def test_prefix_plus_tree_equals_full_tree_attention(gen):
    """Hybrid tree attention: prefix (no mask) merged with the tree part (ancestor mask) == one masked pass."""
    batch, prefix_len, tree_size, head_dim = 1, 40, 12, 32
    q, k, v = random_qkv(batch, 8, 2, tree_size, prefix_len + tree_size, head_dim, torch.float32, "cpu", gen)
    tree_mask = tree_ancestor_mask(random_parents(tree_size, gen))
    prefix = prefix_attn_ref(q, k[:, :, :prefix_len], v[:, :, :prefix_len])
    tree = fused_mask_attn_ref(q, k[:, :, prefix_len:], v[:, :, prefix_len:], tree_mask)
    full_mask = torch.cat([torch.ones(tree_size, prefix_len, dtype=torch.bool), tree_mask], dim=1)
    out, lse = merge_attention_states(*prefix, *tree)
    out_full, lse_full = fused_mask_attn_ref(q, k, v, full_mask)
    assert max_abs_err(out, out_full) < 1e-5 and max_abs_err(lse, lse_full) < 1e-5


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_hybrid_with_kernels_matches_ref(dtype, gen):
    """End to end with the fast paths: prefix_attn + fused_mask_attn + merge, against one fp32 masked ref pass."""
    prefix_len, tree_size = 50, 24
    q, k, v = random_qkv(1, 4, 2, tree_size, prefix_len + tree_size, 64, dtype, KERNEL_DEVICE, gen)
    tree_mask = tree_ancestor_mask(random_parents(tree_size, gen)).to(KERNEL_DEVICE)
    prefix = prefix_attn(q, k[:, :, :prefix_len], v[:, :, :prefix_len])
    tree = fused_mask_attn(q, k[:, :, prefix_len:], v[:, :, prefix_len:], tree_mask)
    full_mask = torch.cat([torch.ones(tree_size, prefix_len, dtype=torch.bool, device=KERNEL_DEVICE), tree_mask], 1)
    ref_fp32 = fused_mask_attn_ref(q, k, v, full_mask)
    ref_low = fused_mask_attn_ref(q, k, v, full_mask, upcast=False)
    out, lse = merge_attention_states(*prefix, *tree)
    assert_within_ref_bound((out, lse), ref_fp32, ref_low, dtype)


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda oa, la, ob, lb: (oa, la.half(), ob, lb), "float32"),
        (lambda oa, la, ob, lb: (oa, la, ob[:, :1], lb), "out_a and out_b"),
        (lambda oa, la, ob, lb: (oa, la, ob, lb[..., :2]), "lse_a and lse_b"),
        (lambda oa, la, ob, lb: (oa.int(), la, ob, lb), "float16, bfloat16 or float32"),
    ],
)
def test_merge_rejects_bad_inputs(change, message, gen):
    states = _random_states((1, 2, 3, 8), torch.float32, gen)
    for merge in (merge_attention_states, merge_attention_states_ref):
        with pytest.raises(ValueError, match=message):
            merge(*change(*states))
        with pytest.raises(TypeError, match="torch.Tensor"):
            merge(*states[:3], states[3].tolist())


@needs_kernel
@pytest.mark.parametrize("head_dim", (8, 80, 128))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_merge_kernel_matches_ref(dtype, head_dim, gen):
    """The Triton merge (the CUDA path of `merge_attention_states`) against the max-shifted torch twin, with empty
    rows on either or both sides and a non-contiguous input, as the packed-GQA prefix pass returns."""
    from transformers_longspec.kernels.lse_merge import _merge_op

    shape = (2, 3, 21, head_dim)
    empty_a = torch.rand(shape[:-1], generator=gen) < 0.2
    empty_b = torch.rand(shape[:-1], generator=gen) < 0.2
    out_a, lse_a, out_b, lse_b = _random_states(shape, dtype, gen, empty_a, empty_b)
    out_a = out_a.transpose(1, 2).contiguous().transpose(1, 2)  # same values, (batch, q, heads) memory order
    states = [t.to(KERNEL_DEVICE) for t in (out_a, lse_a, out_b, lse_b)]
    out, lse = _merge_op(*states)
    out_ref, lse_ref = merge_attention_states_ref(*states)
    assert out.dtype == dtype and lse.dtype == torch.float32 and out.shape == shape
    assert not out.isnan().any() and not lse.isnan().any()
    assert torch.equal(torch.isneginf(lse), torch.isneginf(lse_ref))
    finite = ~torch.isneginf(lse_ref)
    assert max_abs_err(lse[finite], lse_ref[finite]) < 1e-5
    torch.testing.assert_close(out, out_ref)
    both_empty = (empty_a & empty_b).to(KERNEL_DEVICE)
    assert (out[both_empty] == 0).all()
