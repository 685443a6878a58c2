"""Tests for kernels/tree_attention.py: the Triton kernel against its fp32 torch twin (STYLE B10).

Kernel tests need a CUDA GPU, or CPU tensors through Triton's interpreter: CI runs
`TRITON_INTERPRET=1 pytest tests/kernels` (the variable must be set before triton is imported; nothing here sets it).
"""

import functools
import math
import subprocess
import sys

import pytest
import torch

from transformers_longspec.kernels import triton_available
from transformers_longspec.kernels.tree_attention import (
    _block_config,
    _sm_count,
    _split_plan,
    fused_mask_attn,
    fused_mask_attn_ref,
)

from kernel_helpers import (
    KERNEL_DEVICE,
    MASK_KINDS,
    assert_within_ref_bound,
    make_mask,
    max_abs_err,
    needs_gpu,
    needs_kernel,
    random_parents,
    random_qkv,
    tree_ancestor_mask,
)

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# (batch, q_len, kv_len, head_dim): a tiny tree, a ragged block that spans two key blocks, a wide head.
SMALL_SHAPES = ((1, 5, 5, 16), (2, 37, 70, 64), (1, 20, 48, 128))
GQA = ((4, 4), (4, 2), (4, 1))  # (n_heads, n_kv_heads): ratios 1, 2, 4


def _check_against_ref(q, k, v, mask, scale=None, num_splits=None, visible_prefix=False, pack_gqa=False):
    """Run the kernel and assert the B10 bound against the fp32 and low-precision refs (computed on CPU)."""
    result = fused_mask_attn(q, k, v, mask, scale, num_splits=num_splits, visible_prefix=visible_prefix,
                             pack_gqa=pack_gqa)
    assert result[0].dtype == q.dtype and result[1].dtype == torch.float32
    assert result[0].shape == q.shape and result[1].shape == q.shape[:-1]
    cpu = [t.cpu() for t in (q, k, v, mask)]
    ref_fp32 = fused_mask_attn_ref(*cpu, scale, visible_prefix=visible_prefix)
    ref_low = fused_mask_attn_ref(*cpu, scale, upcast=False, visible_prefix=visible_prefix)
    assert_within_ref_bound(result, ref_fp32, ref_low, q.dtype)
    return result


@needs_kernel
@pytest.mark.parametrize("mask_kind", MASK_KINDS)
@pytest.mark.parametrize("n_heads,n_kv_heads", GQA)
@pytest.mark.parametrize("batch,q_len,kv_len,head_dim", SMALL_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kernel_matches_ref(dtype, batch, q_len, kv_len, head_dim, n_heads, n_kv_heads, mask_kind, gen):
    q, k, v = random_qkv(batch, n_heads, n_kv_heads, q_len, kv_len, head_dim, dtype, KERNEL_DEVICE, gen)
    mask = make_mask(mask_kind, batch, q_len, kv_len, gen).to(KERNEL_DEVICE)
    out, lse = _check_against_ref(q, k, v, mask)
    empty = ~mask.any(dim=-1).unsqueeze(1).expand_as(lse)  # rows with no visible key: out 0, lse -inf
    assert torch.isneginf(lse[empty]).all() and (out.float().permute(3, 0, 1, 2)[:, empty] == 0).all()
    assert torch.isfinite(lse[~empty]).all() and torch.isfinite(out.float()).all()


@needs_kernel
@pytest.mark.parametrize("head_dim", (16, 32, 64, 128, 256, 80))
def test_kernel_head_dims(head_dim, gen):
    """Every supported head size; 80 is padded to 128 inside the kernel."""
    q, k, v = random_qkv(1, 2, 1, 9, 40, head_dim, torch.float16, KERNEL_DEVICE, gen)
    _check_against_ref(q, k, v, make_mask("tree", 1, 9, 40, gen).to(KERNEL_DEVICE))


@needs_kernel
def test_kernel_mask_forms_and_strides(gen):
    """A 2-D mask, a (1, q, kv) mask and a (batch, q, kv) copy agree; strided q and a sliced mask are accepted."""
    batch, q_len, kv_len = 2, 12, 30
    q, k, v = random_qkv(batch, 4, 2, q_len, kv_len, 32, torch.float16, KERNEL_DEVICE, gen)
    big = make_mask("random", 1, q_len + 3, kv_len + 5, gen)[0].to(KERNEL_DEVICE)
    mask_2d = big[2 : 2 + q_len, 1 : 1 + kv_len]  # non-contiguous slice
    q_strided = q.transpose(1, 2).contiguous().transpose(1, 2)  # (batch, q_len, n_heads, head_dim) memory
    out_2d, lse_2d = _check_against_ref(q_strided, k, v, mask_2d)
    for mask in (mask_2d.unsqueeze(0), mask_2d.expand(batch, -1, -1).contiguous()):
        out, lse = fused_mask_attn(q, k, v, mask)
        assert torch.equal(out, out_2d) and torch.equal(lse, lse_2d)


@needs_kernel
def test_kernel_custom_scale_and_gqa8(gen):
    q, k, v = random_qkv(1, 8, 1, 16, 33, 64, torch.bfloat16, KERNEL_DEVICE, gen)
    _check_against_ref(q, k, v, make_mask("tree", 1, 16, 33, gen).to(KERNEL_DEVICE), scale=0.3)


@needs_kernel
def test_kernel_empty_sizes(gen):
    """kv_len == 0 gives out 0 and lse -inf; q_len == 0 gives empty outputs."""
    q, k, v = random_qkv(1, 2, 2, 4, 0, 16, torch.float32, KERNEL_DEVICE, gen)
    out, lse = fused_mask_attn(q, k, v, torch.zeros(4, 0, dtype=torch.bool, device=KERNEL_DEVICE))
    assert (out == 0).all() and torch.isneginf(lse).all()
    q, k, v = random_qkv(1, 2, 2, 0, 7, 16, torch.float32, KERNEL_DEVICE, gen)
    out, lse = fused_mask_attn(q, k, v, torch.ones(0, 7, dtype=torch.bool, device=KERNEL_DEVICE))
    assert out.shape == (1, 2, 0, 16) and lse.shape == (1, 2, 0)


def _split_edge_mask(kind: str, batch: int, q_len: int, kv_len: int, gen: torch.Generator) -> torch.Tensor:
    """A `make_mask` mask whose first rows are empty in some key blocks of 64 and visible in others.

    Row 0 sees no key at all (out 0, lse -inf), row 1 only keys of the last block, row 2 only keys of the first
    block, row 3 only the first key of the second block: with 2 or more splits each is empty in some split.
    """
    mask = make_mask(kind, batch, q_len, kv_len, gen)
    mask[:, :4] = False
    mask[:, 1, (kv_len - 1) // 64 * 64 :] = True
    mask[:, 2, :64] = True
    mask[:, 3, 64] = True
    return mask


@needs_kernel
@pytest.mark.parametrize("mask_kind", ("random", "tree"))
@pytest.mark.parametrize("num_splits", (2, 3, 50))
@pytest.mark.parametrize("n_heads,n_kv_heads", GQA)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kernel_forced_splits_match_ref(dtype, n_heads, n_kv_heads, num_splits, mask_kind, gen):
    """Split-KV against the ref: 150 keys are 3 key blocks of 64, so 2 and 3 splits are kept and 50 is clamped to 3."""
    batch, q_len, kv_len = 2, 20, 150  # 20 rows: two combine blocks of 16 rows
    q, k, v = random_qkv(batch, n_heads, n_kv_heads, q_len, kv_len, 16, dtype, KERNEL_DEVICE, gen)
    mask = _split_edge_mask(mask_kind, batch, q_len, kv_len, gen).to(KERNEL_DEVICE)
    out, lse = _check_against_ref(q, k, v, mask, num_splits=num_splits)
    assert torch.isneginf(lse[:, :, 0]).all() and (out[:, :, 0] == 0).all()
    assert torch.isfinite(lse[:, :, 1:]).all() and torch.isfinite(out.float()).all()


@needs_kernel
def test_kernel_one_split_is_default_path_bit_for_bit(gen):
    """num_splits=1 is the unsplit kernel: bit for bit the default where the heuristic picks one split."""
    sms = _sm_count(torch.device(KERNEL_DEVICE))
    n_heads, q_len, kv_len, head_dim = 4, 1, 150, 16
    batch = math.ceil(sms / n_heads)  # one program per (batch, head) fills every SM: no split (33 on CPU)
    block_m, block_n, _, _ = _block_config(q_len, head_dim)
    programs = math.ceil(q_len / block_m) * batch * n_heads
    assert _split_plan(programs, math.ceil(kv_len / block_n), sms) == (1, 3)
    q, k, v = random_qkv(batch, n_heads, 2, q_len, kv_len, head_dim, torch.bfloat16, KERNEL_DEVICE, gen)
    mask = make_mask("random", batch, q_len, kv_len, gen).to(KERNEL_DEVICE)
    out_default, lse_default = fused_mask_attn(q, k, v, mask)
    out_one, lse_one = _check_against_ref(q, k, v, mask, num_splits=1)
    assert torch.equal(out_one, out_default) and torch.equal(lse_one, lse_default)


@needs_kernel
@pytest.mark.parametrize("width", (0, 1, 70, 150))
@pytest.mark.parametrize("num_splits", (None, 1, 3))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kernel_visible_prefix_equals_the_full_mask(dtype, num_splits, width, gen):
    """A mask over the last `width` keys leaves the first 150 - width visible to every row (the committed prefix
    of hybrid tree attention): bit for bit the kernel with those columns set True, and within the B10 bound of the
    ref. Width 70 ends the prefix inside a key block of 64 and, with 3 splits, inside the second split; rows with
    an empty masked part still see the prefix."""
    batch, q_len, kv_len = 2, 20, 150
    q, k, v = random_qkv(batch, 4, 2, q_len, kv_len, 16, dtype, KERNEL_DEVICE, gen)
    masked = make_mask("empty_rows", batch, q_len, width, gen).to(KERNEL_DEVICE)
    full = torch.cat([masked.new_ones(batch, q_len, kv_len - width), masked], dim=2)
    out, lse = _check_against_ref(q, k, v, masked, num_splits=num_splits, visible_prefix=True)
    out_full, lse_full = fused_mask_attn(q, k, v, full, num_splits=num_splits)
    assert torch.equal(out, out_full) and torch.equal(lse, lse_full)
    if width < kv_len:
        assert torch.isfinite(lse).all()


@needs_kernel
@pytest.mark.parametrize("num_splits", (None, 3))
@pytest.mark.parametrize("q_len", (1, 5, 20))
@pytest.mark.parametrize("n_heads,n_kv_heads", GQA)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kernel_packed_gqa_matches_ref(dtype, n_heads, n_kv_heads, q_len, num_splits, gen):
    """pack_gqa: one program holds the rows of every query head of a kv head (4 heads x 20 queries = 80 rows, two
    query blocks that cross from one head to the next), over a visible prefix and a masked tail with empty rows;
    within the B10 bound of the ref, as the unpacked kernel is."""
    batch, kv_len, width = 2, 150, 40
    q, k, v = random_qkv(batch, n_heads, n_kv_heads, q_len, kv_len, 16, dtype, KERNEL_DEVICE, gen)
    mask = make_mask("empty_rows", batch, q_len, width, gen).to(KERNEL_DEVICE)
    out, lse = _check_against_ref(q, k, v, mask, num_splits=num_splits, visible_prefix=True, pack_gqa=True)
    out_unpacked, lse_unpacked = fused_mask_attn(q, k, v, mask, num_splits=num_splits, visible_prefix=True)
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    assert max_abs_err(out, out_unpacked) <= tol and max_abs_err(lse, lse_unpacked) <= 1e-4


def test_ref_visible_prefix_equals_the_full_mask(gen):
    """The ref with a mask over the last 5 of 11 keys is exactly the ref with the first 6 columns set True."""
    q, k, v = random_qkv(1, 4, 2, 7, 11, 16, torch.float32, "cpu", gen)
    masked = make_mask("empty_rows", 1, 7, 5, gen)[0]
    full = torch.cat([masked.new_ones(7, 6), masked], dim=1)
    for got, expected in zip(fused_mask_attn_ref(q, k, v, masked, visible_prefix=True),
                             fused_mask_attn_ref(q, k, v, full)):
        assert torch.equal(got, expected)
    with pytest.raises(ValueError, match=r"must have shape \(7, 11\)"):  # without the flag: a wrong mask
        fused_mask_attn_ref(q, k, v, masked)


@pytest.mark.skipif(not triton_available(), reason="the block sizes come from triton.next_power_of_2")
@pytest.mark.parametrize(
    "q_len,n_heads,kv_len,expected",
    [
        (79, 12, 591, (10, 1)),  # tree verification: 2 query blocks x 12 heads = 24 programs, 10 key blocks
        (1, 12, 513, (9, 1)),  # plain decoding through the engine: 12 programs, 9 key blocks
        (16, 12, 528, (9, 1)),
        (64, 32, 1088, (9, 2)),  # 32 programs want 9 splits of 17 key blocks: 2 blocks each (the last gets 1)
        (16, 40, 640, (5, 2)),  # 40 programs want 7 splits of 10 key blocks: 2 blocks each leaves 5 splits
        (512, 32, 591, (1, 10)),  # 8 x 32 = 256 programs already fill 132 SMs
        (79, 12, 40, (1, 1)),  # a single key block
    ],
)
def test_split_plan_real_shapes(q_len, n_heads, kv_len, expected):
    """The heuristic on 132 SMs (an H200) at head_dim 128, batch 1; every split gets whole, non-empty key blocks."""
    block_m, block_n, _, _ = _block_config(q_len, 128)
    key_blocks = math.ceil(kv_len / block_n)
    num_splits, blocks_per_split = _split_plan(math.ceil(q_len / block_m) * n_heads, key_blocks, sms=132)
    assert (num_splits, blocks_per_split) == expected
    assert (num_splits - 1) * blocks_per_split < key_blocks <= num_splits * blocks_per_split


@pytest.mark.skipif(not triton_available(), reason="the plan uses triton.cdiv")
def test_split_plan_requested_counts_are_clamped():
    """Any request gives 1 ≤ splits ≤ min(request, key blocks); the splits cover the key blocks and none is empty."""
    assert _sm_count(torch.device("cpu")) == 132  # interpreted CPU tensors plan for an H200
    assert _split_plan(10, 0, 132, 4) == (1, 0)  # kv_len 0: one split over no keys
    for key_blocks in range(1, 40):
        for requested in (None, 1, 2, 3, 7, 64):
            num_splits, blocks_per_split = _split_plan(10, key_blocks, 132, requested)
            assert 1 <= num_splits <= min(requested or key_blocks, key_blocks)
            assert (num_splits - 1) * blocks_per_split < key_blocks <= num_splits * blocks_per_split


@pytest.mark.skipif(not triton_available(), reason="validation runs before launch but after the Triton check")
@pytest.mark.parametrize("num_splits", (0, -1, 1.5, True))
def test_launcher_rejects_bad_num_splits(num_splits, gen):
    q, k, v = random_qkv(1, 4, 2, 6, 10, 16, torch.float32, "cpu", gen)
    with pytest.raises(ValueError, match="num_splits"):
        fused_mask_attn(q, k, v, torch.ones(6, 10, dtype=torch.bool), num_splits=num_splits)


@pytest.mark.skipif(not triton_available(), reason="validation runs before launch but after the Triton check")
@pytest.mark.parametrize(
    "change,message",
    [
        (lambda q, k, v, m: (q, k, v, m.int()), "torch.bool"),
        (lambda q, k, v, m: (q, k, v, torch.cat([m, m[:, :1]], dim=1)), "mask"),  # wider than the keys
        (lambda q, k, v, m: (q, k, v, m[:-1]), "mask"),
        (lambda q, k, v, m: (q.half(), k, v, m), "one dtype"),
        (lambda q, k, v, m: (q[:, :3], k, v, m), "multiple of n_kv_heads"),
        (lambda q, k, v, m: (q[0], k, v, m), "4-D"),
        (lambda q, k, v, m: (q, k, v[..., :8], m), "same shape"),
        (lambda q, k, v, m: (q.double(), k.double(), v.double(), m), "float16, bfloat16 or float32"),
    ],
)
def test_launcher_rejects_bad_inputs(change, message, gen):
    q, k, v = random_qkv(1, 4, 2, 6, 10, 16, torch.float32, "cpu", gen)
    mask = torch.ones(6, 10, dtype=torch.bool)
    with pytest.raises(ValueError, match=message):
        fused_mask_attn(*change(q, k, v, mask))
    with pytest.raises(ValueError, match=message):
        fused_mask_attn_ref(*change(q, k, v, mask))


def test_ref_matches_dense_softmax(gen):
    """The ref equals softmax attention with an additive -inf bias, and its LSE equals torch.logsumexp."""
    q, k, v = random_qkv(2, 4, 2, 7, 11, 16, torch.float32, "cpu", gen)
    mask = make_mask("random", 2, 7, 11, gen)
    mask[:, :, 0] = True  # no empty rows here: the dense formula would give NaN for them
    scores = q @ k.repeat_interleave(2, dim=1).transpose(-1, -2) / 4.0
    scores = scores.masked_fill(~mask.unsqueeze(1), float("-inf"))
    expected = torch.softmax(scores, dim=-1) @ v.repeat_interleave(2, dim=1)
    out, lse = fused_mask_attn_ref(q, k, v, mask)
    assert max_abs_err(out, expected) < 1e-6 and max_abs_err(lse, torch.logsumexp(scores, dim=-1)) < 1e-6


def test_ref_tree_mask_picture():
    """The ancestor mask of parents [-1, 0, 0, 1] is the picture in the kernel card."""
    expected = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    assert torch.equal(tree_ancestor_mask([-1, 0, 0, 1]), expected)


def test_package_imports_without_triton():
    """With triton unimportable the package imports, the ref runs and the launcher names `pip install triton`."""
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import torch\n"
        "from transformers_longspec.kernels import fused_mask_attn, fused_mask_attn_ref, triton_available\n"
        "assert not triton_available()\n"
        "q = torch.randn(1, 2, 3, 16); k = torch.randn(1, 1, 5, 16); m = torch.ones(3, 5, dtype=torch.bool)\n"
        "fused_mask_attn_ref(q, k, k, m)\n"
        "try:\n    fused_mask_attn(q, k, k, m)\nexcept ImportError as e:\n    assert 'pip install triton' in str(e)\n"
        "else:\n    raise AssertionError('no ImportError')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("n_heads,n_kv_heads", ((32, 8), (16, 16), (28, 4)))
@pytest.mark.parametrize("q_len,kv_len", ((16, 16), (64, 1088), (256, 256), (512, 2560)))
@pytest.mark.parametrize("head_dim", (64, 128, 256))
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=str)
def test_kernel_gpu_tree_sizes(dtype, head_dim, q_len, kv_len, n_heads, n_kv_heads, gen):
    """Real tree sizes on the GPU with tree masks over [prefix; tree]."""
    q, k, v = random_qkv(1, n_heads, n_kv_heads, q_len, kv_len, head_dim, dtype, "cuda", gen)
    mask = make_mask("tree", 1, q_len, kv_len, gen).cuda()
    ref_fp32 = fused_mask_attn_ref(q, k, v, mask)
    ref_low = fused_mask_attn_ref(q, k, v, mask, upcast=False)
    assert_within_ref_bound(fused_mask_attn(q, k, v, mask), ref_fp32, ref_low, dtype)


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("compiled", (False, True))
@pytest.mark.parametrize("dtype,head_dim,q_len,kv_len", ((torch.bfloat16, 128, 64, 1088), (torch.float16, 64, 16, 16)))
def test_kernel_gpu_compiled(dtype, head_dim, q_len, kv_len, compiled, gen):
    """torch.compile traces into the kernel through triton_op (fullgraph: no graph break at the launcher)."""
    torch._dynamo.reset()  # a fresh cache per case, so the recompile limit never silently falls back to eager
    q, k, v = random_qkv(2, 32, 8, q_len, kv_len, head_dim, dtype, "cuda", gen)
    mask = make_mask("tree", 2, q_len, kv_len, gen).cuda()
    fn = torch.compile(fused_mask_attn, fullgraph=True) if compiled else fused_mask_attn
    ref_fp32 = fused_mask_attn_ref(q, k, v, mask)
    ref_low = fused_mask_attn_ref(q, k, v, mask, upcast=False)
    assert_within_ref_bound(fn(q, k, v, mask), ref_fp32, ref_low, dtype)


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("mask_kind", MASK_KINDS)
def test_kernel_gpu_fp32_and_mask_kinds(mask_kind, gen):
    q, k, v = random_qkv(2, 8, 2, 100, 300, 128, torch.float32, "cuda", gen)
    _check_against_ref(q, k, v, make_mask(mask_kind, 2, 100, 300, gen).cuda())


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("pack_gqa", (False, True))
@pytest.mark.parametrize("q_len,prefix", ((79, 0), (79, 8192), (16, 8192), (1, 30000)))
@pytest.mark.parametrize("mode", ("eager", "compiled", "cuda_graph"))
def test_kernel_gpu_verification_shape(mode, q_len, prefix, pack_gqa, gen):
    """The verification step of the target: q_len 79 tree queries, 12/2 heads, head_dim 128, over a committed prefix
    that reads no mask and 512 + q_len masked keys (a 512-row cache tail + the tree), bf16; q_len 16 and 1 are a
    draft level's cross-attention and a plain step. The heuristic splits them on any GPU with more than 24 SMs."""
    kv_len = prefix + 512 + q_len
    q, k, v = random_qkv(1, 12, 2, q_len, kv_len, 128, torch.bfloat16, "cuda", gen)
    mask = make_mask("tree", 1, q_len, 512 + q_len, gen).cuda()
    attn = functools.partial(fused_mask_attn, visible_prefix=True, pack_gqa=pack_gqa)
    if mode == "cuda_graph":
        attn(q, k, v, mask)  # compile the kernels before the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            result = attn(q, k, v, mask)
        graph.replay()
        torch.cuda.synchronize()
    else:
        torch._dynamo.reset()
        result = (torch.compile(attn, fullgraph=True) if mode == "compiled" else attn)(q, k, v, mask)
    ref_fp32 = fused_mask_attn_ref(q, k, v, mask, visible_prefix=True)
    ref_low = fused_mask_attn_ref(q, k, v, mask, upcast=False, visible_prefix=True)
    assert_within_ref_bound(result, ref_fp32, ref_low, torch.bfloat16)


@needs_kernel
@pytest.mark.parametrize("pack_gqa", (False, True))
@pytest.mark.parametrize("prefix,tail,visible", [(0, 8, 5), (150, 8, 3), (150, 0, 0)])
def test_hybrid_tree_attention_is_one_kernel_call(prefix, tail, visible, pack_gqa, gen, monkeypatch):
    """The package's hybrid tree attention on the kernel device: [prefix | cache tail (first `visible` rows valid) |
    tree] in one `fused_mask_attn` call (prefix blocks read no mask), within the B10 bound of the ref over the keys a
    query may see; the prefix / tree split is never taken."""
    from transformers_longspec import attention

    monkeypatch.setattr(attention, "_use_triton", lambda query: True)  # CPU tensors reach it under the interpreter
    monkeypatch.setattr(attention, "prefix_attn", None)  # the two-pass path would fail on calling it
    monkeypatch.setattr(attention, "PACK_GQA", pack_gqa)
    tree_size = 6
    q, k, v = random_qkv(1, 4, 2, tree_size, prefix + tail + tree_size, 16, torch.bfloat16, KERNEL_DEVICE, gen)
    tree = tree_ancestor_mask(random_parents(tree_size, gen))
    tail_visible = (torch.arange(tail) < visible).expand(tree_size, tail)
    mask = torch.cat([tail_visible, tree], dim=1).to(KERNEL_DEVICE)
    out = attention.hybrid_tree_attention(q, k, v, mask, 0.25)
    ref_fp32 = fused_mask_attn_ref(q.cpu(), k.cpu(), v.cpu(), mask.cpu(), 0.25, visible_prefix=True)
    ref_low = fused_mask_attn_ref(q.cpu(), k.cpu(), v.cpu(), mask.cpu(), 0.25, upcast=False, visible_prefix=True)
    assert out.shape == q.shape and out.dtype == torch.bfloat16
    assert_within_ref_bound((out,), ref_fp32, ref_low, torch.bfloat16)  # out only: the op returns no LSE
