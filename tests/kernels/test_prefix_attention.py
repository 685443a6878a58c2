"""Tests for kernels/prefix_attention.py: the ref is plain softmax attention; the flash backend obeys STYLE B10."""

import pytest
import torch
import torch.nn.functional as F

from transformers_longspec.kernels import prefix_attn, prefix_attn_ref
from transformers_longspec.kernels.prefix_attention import (
    _HAS_FLASH_ATTN,
    _flash_attn_package,
    _pack_gqa,
    _sdpa_flash_equal_heads,
)

from kernel_helpers import assert_within_ref_bound, max_abs_err, needs_gpu, random_qkv

GQA = ((4, 4), (4, 2), (8, 2), (8, 1))  # ratios 1, 2, 4, 8


@pytest.mark.parametrize("n_heads,n_kv_heads", GQA)
@pytest.mark.parametrize("q_len,kv_len", ((1, 7), (12, 50), (30, 3)))
def test_ref_matches_plain_softmax_attention(q_len, kv_len, n_heads, n_kv_heads, gen):
    q, k, v = random_qkv(2, n_heads, n_kv_heads, q_len, kv_len, 16, torch.float32, "cpu", gen)
    group = n_heads // n_kv_heads
    k_full, v_full = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    out, lse = prefix_attn_ref(q, k, v, scale=0.2)
    assert out.shape == q.shape and lse.shape == q.shape[:-1] and lse.dtype == torch.float32
    assert max_abs_err(out, F.scaled_dot_product_attention(q, k_full, v_full, scale=0.2)) < 1e-5
    assert max_abs_err(lse, torch.logsumexp(q @ k_full.transpose(-1, -2) * 0.2, dim=-1)) < 1e-5


@pytest.mark.parametrize("n_heads,n_kv_heads", GQA)
def test_gqa_packing_is_exact(n_heads, n_kv_heads, gen):
    """Folding each kv head's query group into q_len (backend 2's trick) changes nothing without a mask."""
    q, k, v = random_qkv(2, n_heads, n_kv_heads, 5, 19, 32, torch.float32, "cpu", gen)
    packed = _pack_gqa(prefix_attn_ref, q, k, v, 0.25)
    expected = prefix_attn_ref(q, k, v, 0.25)
    assert max_abs_err(packed[0], expected[0]) < 1e-6 and max_abs_err(packed[1], expected[1]) < 1e-6


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16, torch.float32), ids=str)
def test_cpu_dispatch_uses_ref(dtype, gen):
    q, k, v = random_qkv(1, 4, 2, 6, 25, 16, dtype, "cpu", gen)
    q_strided = q.transpose(1, 2).contiguous().transpose(1, 2)
    for got, expected in zip(prefix_attn(q_strided, k, v), prefix_attn_ref(q, k, v)):
        assert torch.equal(got, expected)


def test_empty_prefix_gives_zero_and_neg_inf(gen):
    q, k, v = random_qkv(1, 4, 2, 6, 0, 16, torch.float32, "cpu", gen)
    for fn in (prefix_attn, prefix_attn_ref):
        out, lse = fn(q, k, v)
        assert (out == 0).all() and torch.isneginf(lse).all() and lse.shape == (1, 4, 6)


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda q, k, v: (q[:, :3], k, v), "multiple of n_kv_heads"),
        (lambda q, k, v: (q, k, v.half()), "one dtype"),
        (lambda q, k, v: (q, k[..., :8], v[..., :8]), "head_dim must match"),
        (lambda q, k, v: (q[0], k, v), "4-D"),
    ],
)
def test_rejects_bad_inputs(change, message, gen):
    q, k, v = random_qkv(1, 4, 2, 6, 10, 16, torch.float32, "cpu", gen)
    for fn in (prefix_attn, prefix_attn_ref):
        with pytest.raises(ValueError, match=message):
            fn(*change(q, k, v))
    with pytest.raises(ValueError, match="scale"):
        prefix_attn(q, k, v, scale=float("nan"))


def _check_gpu_backend(fn, q, k, v):
    ref_fp32 = prefix_attn_ref(q, k, v)
    ref_low = prefix_attn_ref(q, k, v, upcast=False)
    result = fn(q, k, v)
    assert result[0].shape == q.shape and result[1].shape == q.shape[:-1]
    assert_within_ref_bound(result, ref_fp32, ref_low, q.dtype)


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("n_heads,n_kv_heads", ((32, 32), (32, 8), (28, 4), (64, 8)))
@pytest.mark.parametrize("q_len,kv_len", ((1, 1000), (16, 4096), (64, 333), (512, 4096)))
@pytest.mark.parametrize("head_dim", (64, 128, 256))
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=str)
def test_sdpa_flash_backend_gpu(dtype, head_dim, q_len, kv_len, n_heads, n_kv_heads, gen):
    """Backend 2 (aten flash op with GQA packed into q_len) against the fp32 ref; sliced LSE has q's shape."""
    q, k, v = random_qkv(1, n_heads, n_kv_heads, q_len, kv_len, head_dim, dtype, "cuda", gen)
    _check_gpu_backend(lambda *qkv: _pack_gqa(_sdpa_flash_equal_heads, *qkv, head_dim**-0.5), q, k, v)


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("compiled", (False, True))
def test_prefix_attn_gpu_dispatch(compiled, gen):
    """The public function on CUDA (whichever flash backend is present), eager and under torch.compile."""
    torch._dynamo.reset()
    q, k, v = random_qkv(2, 32, 8, 64, 2048, 128, torch.bfloat16, "cuda", gen)
    k_slice, v_slice = k[:, :, :1500], v[:, :, :1500]  # a slice of a preallocated cache
    fn = torch.compile(prefix_attn, fullgraph=True) if compiled else prefix_attn
    _check_gpu_backend(fn, q, k_slice, v_slice)


@needs_gpu
@pytest.mark.gpu
@pytest.mark.skipif(not _HAS_FLASH_ATTN, reason="flash-attn is not installed")
def test_flash_attn_package_backend_gpu(gen):
    q, k, v = random_qkv(1, 32, 8, 64, 2048, 128, torch.float16, "cuda", gen)
    _check_gpu_backend(lambda *qkv: _flash_attn_package(*qkv, 128**-0.5), q, k, v)
