"""Tree attention: attention of tree queries over keys under an arbitrary boolean mask, returning the LSE.

Kernel card
-----------
What: `fused_mask_attn(q, k, v, mask)` computes softmax(q·kᵀ·scale masked by `mask`)·v and the natural-log
    log-sum-exp (LSE) of the visible scaled scores. With the LSE, the result merges exactly with attention over
    a disjoint key set (the committed prefix) by `merge_attention_states` (LongSpec §3, hybrid tree attention).
Layout: q (batch, n_heads, q_len, head_dim); k, v (batch, n_kv_heads, kv_len, head_dim); mask bool
    (q_len, kv_len) or (batch or 1, q_len, kv_len), True = may attend. With `visible_prefix=True` the mask may be
    narrower, (…, q_len, m), m <= kv_len: it covers the LAST m keys, and the first kv_len - m keys (a committed
    prefix) are visible to every query without a mask being read. out like q; lse (batch, n_heads, q_len) fp32.
    No causal mask is added: the mask alone decides (unlike LongSpec's kernel, which also applies a bottom-right
    causal mask). So one call computes the whole hybrid tree attention of a verification step (`attention.py`).
    A tree mask over [prefix; tree] keys looks like this (x = attend; with m = 4 only the right part is passed)::

        parents = [-1, 0, 0, 1]       prefix | tree
        node 0 (root)                  x x x | x . . .
        node 1 (child of 0)            x x x | x x . .
        node 2 (child of 0)            x x x | x . x .
        node 3 (child of 1)            x x x | x x . x

Dtypes: float16, bfloat16, float32 (q, k, v share one dtype). Accumulation, softmax and LSE are fp32; out is cast
    to q's dtype.
Head dims: any 1 ≤ head_dim ≤ 256; 16, 32, 64, 128, 256 are the tested sizes, others are zero-padded to the next
    power of two (≥ 16) inside the kernel, which costs speed, not accuracy.
GQA: any n_heads / n_kv_heads ratio (tested 1, 2, 4, 8); K/V are read per kv head, never repeated in memory.
    By default a program holds rows of one query head, so the group's heads each read the kv head's keys;
    `pack_gqa=True` gives a program rows of all of them (row r: query r % q_len of the group's head r // q_len), so
    each key block is read once per kv head (the package's default, `attention.PACK_GQA`: on an H200 at 16k it cut
    the verification of Qwen2.5-1.5B's shape from 4.29 to 4.10 ms per step).
Sizes: any q_len and kv_len; meant for tree sizes up to ~512 queries. A long committed prefix costs no mask reads
    (pass a mask over the tree part only); its key blocks are shared out between the splits like the others.
Empty rows: a query row with no visible key returns out = 0 and lse = -inf (the ref does the same), so merging it
    with a prefix state returns the prefix state unchanged.
Algorithm: flash-style online softmax in base 2 over BLOCK_N key blocks with `tl.dot`; the mask block is loaded
    beside each key block. Split-KV (flash-decoding): the grid is (query blocks of BLOCK_M rows, batch · n_heads
    / HEADS, num_splits), HEADS = 1 or the GQA group with `pack_gqa`, and program (m, bh, s) folds only key blocks
    [s · B, (s + 1) · B) for B = blocks_per_split. With
    one split it writes out and lse directly, exactly the unsplit kernel. With S > 1 splits each program writes its
    normalised fp32 partial output (0 where the split saw no visible key) and natural-log LSE (-inf there) to
    scratch tensors (S, batch, n_heads, q_len, head_dim) and (S, batch, n_heads, q_len), and
    `_combine_splits_kernel` merges them in the max-shifted form of `lse_merge.py` (m = max_s lse_s,
    lse = m + log Σ exp(lse_s - m), out = Σ out_s · exp(lse_s - lse)). `_split_plan` picks S from shapes only (no
    host sync, no data-dependent choice, so torch.compile and CUDA graphs see one fixed plan): S = 1 when the
    unsplit grid already has ≥ 1 program per SM or there is a single key block; otherwise about 2 programs per SM,
    at most one split per key block, rounded so every split gets whole, non-empty key blocks. The SM count is read
    once per device (132 for interpreted CPU tensors). On 132 SMs with head_dim 128 and 12 heads (batch 1): q_len 79
    over 591 keys → 10 splits, q_len 1 over 513 → 9, q_len 16 over 528 → 9; q_len 512 with 32 heads → 1.
    Fixed, untuned block sizes (see `_block_config`); no autotuning, no early exit for fully masked blocks.
Departures from `fused_mask_attn_ref`: summation order (blockwise online softmax, and with split-KV a second
    merge over splits); for fp16/bf16 the softmax probabilities are rounded to the input dtype before the p·v product
    (as in FlashAttention); fp32 inputs use IEEE fp32 dots (no TF32). Split partial states stay fp32, so only the
    final out is rounded to q's dtype. The tests bound the error per STYLE B10.
Launch: through `torch.library.triton_op` ("transformers_longspec::fused_mask_attn", whose schema carries
    `num_splits`) with `wrap_triton` for both kernels, so `torch.compile(fullgraph=True)` traces into them; the split
    scratch is allocated inside the op (torch.empty), which CUDA graphs capture. Validation happens in the Python
    launcher before the op. Interpreted kernels (TRITON_INTERPRET=1) are launched without `wrap_triton`, which only
    newer torch versions accept them in; the interpreter also takes the `while` loop over a split's key blocks and
    fp32 dots (see `_dot`), because Triton 3.6's interpreter breaks on range() with a runtime bound under
    numpy >= 2.4 and on bf16 tl.dot. The combine kernel loops over a constexpr split count, which both paths accept.
Devices: CUDA GPUs; CPU tensors only under TRITON_INTERPRET=1 (slow; for CI). Without Triton, `fused_mask_attn`
    raises ImportError and `fused_mask_attn_ref` is the CPU path.
Tested: CPU under TRITON_INTERPRET=1 (triton 3.6; torch 2.13 and 2.11), all three dtypes, head dims 16-256 and 80,
    GQA 1/2/4/8, random, tree, all-true and fully masked rows; split-KV (torch 2.13 only): forced 2, 3 and clamped
    split counts with rows empty in some splits or in all, and num_splits=1 bit for bit equal to the default
    unsplit path (and to the kernel before split-KV); a visible prefix (mask narrower than the keys, ending inside
    a key block and inside a split, widths 0 to kv_len) bit for bit equal to the mask with those columns set True.
    NVIDIA H200 (triton 3.6, torch 2.11): fp16/bf16, head dims 64/128/256, q_len 16-512, kv_len 16-2560, GQA
    1/4/7/8, eager and torch.compile(fullgraph=True); fp32 with every mask kind; split-KV with a visible prefix at
    the decode shapes (12/2 heads, head_dim 128, bf16: q_len 79 over 591 and 8,783 keys, 16 over 8,720, 1 over
    30,513), eager, compiled and CUDA-graphed (`-m gpu`: 190 passed, session 11). Forward only: no autograd.
Speed (H200, bf16, kernel time per decode step of Qwen2.5-1.5B's shape at 8k, `benchmarks/kernel_profile.py`):
    the verification's 28 calls (q_len 79, 12/2 heads over 8,783 keys, a mask over the last 591) take 922 µs +
    121 µs of combine, 33 + 4 µs per call: the same as the two-pass path it replaced (flash-decoding over the
    prefix 18.8 + 6.4 µs, this kernel over the 591 masked keys 6.3 + 4.1 µs, then the LSE merge), in two launches
    instead of five. The draft's 10 calls (self-attention over ~600 masked keys, cross-attention over the target's
    cache) take 99 + 48 µs, ~240 µs before (cuDNN SDPA with a mask 113 µs, flash-decoding + combine 118 µs).
    Earlier, unsplit (one program per query block and head): q_len/kv_len 16/16 3.1 µs, 64/1088 22.6 µs, 512/512
    17.7 µs, 512/4096 109 µs vs torch SDPA with the same bool mask 12.4 / 36.6 / 25.9 / 119 µs. Each program reads
    its kv head's K/V for one query head (without `pack_gqa`): the verification re-reads each key 6 times.
    Eager calls cost ~80-120 µs of CPU time each (custom-op dispatch, Triton's launcher, checks), and a split call
    launches a second kernel: compile or CUDA-graph the decode step.
Limits: offsets are 64-bit per (batch, head, split) base, 32-bit within a head; split scratch costs
    S · batch · n_heads · q_len · (head_dim + 1) · 4 bytes; no dropout, no bias, no softcap.
"""

import functools

import torch
from torch.library import triton_op, wrap_triton

from ._triton_utils import is_interpreted, require_triton, tl, triton, triton_available
from ._validation import check_mask, check_qkv, resolve_scale

_OP_NAME = "transformers_longspec::fused_mask_attn"


@triton.jit
def _dot(a, b, DOT_PRECISION: tl.constexpr, INTERPRETED: tl.constexpr):
    """a @ b accumulated in fp32. Interpreted, multiply exact fp32 copies: Triton 3.6's interpreter stores bf16 as
    uint16 and its tl.dot multiplies those bit patterns (fp16/bf16 products are exact in fp32, as on the GPU)."""
    if INTERPRETED:
        c = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        c = tl.dot(a, b, input_precision=DOT_PRECISION)
    return c


@triton.jit
def _attn_key_block(
    q, m_i, l_i, acc, start_n, k_base, v_base, mask_rows, stride_kn, stride_vn, stride_mn, row_ok, kv_len,
    mask_start, qk_scale_log2,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr, INTERPRETED: tl.constexpr,
):  # fmt: skip
    """Fold keys [start_n, start_n + BLOCK_N) into the base-2 online-softmax state (m_i, l_i, acc). Keys before
    `mask_start` are visible to every row (no mask read); key j >= mask_start reads mask column j - mask_start."""
    cols = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    col_ok = cols < kv_len
    kv_ok = col_ok[:, None] & (offs_d < HEAD_DIM)[None, :]
    k = tl.load(k_base + cols[:, None] * stride_kn + offs_d[None, :], mask=kv_ok, other=0.0)
    in_prefix = cols < mask_start
    visible = tl.load(mask_rows + (cols - mask_start)[None, :] * stride_mn,
                      mask=row_ok[:, None] & (col_ok & ~in_prefix)[None, :], other=False)
    visible = visible | (in_prefix & col_ok)[None, :]
    s = _dot(q, tl.trans(k), DOT_PRECISION, INTERPRETED) * qk_scale_log2
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # Rows with no visible key so far keep m = -inf; shift them by 0 so exp2 never sees (-inf) - (-inf).
    m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_shift[:, None])
    alpha = tl.exp2(m_i - m_shift)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(v_base + cols[:, None] * stride_vn + offs_d[None, :], mask=kv_ok, other=0.0)
    acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, DOT_PRECISION, INTERPRETED)
    return m_new, l_i, acc


@triton.jit
def _tree_attn_fwd_kernel(
    q_ptr, k_ptr, v_ptr, mask_ptr, out_ptr, lse_ptr,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_mb, stride_mm, stride_mn,
    stride_os, stride_ob, stride_oh, stride_om,
    stride_ls, stride_lb, stride_lh,
    n_heads, kv_group, q_len, kv_len, mask_start, keys_per_split, qk_scale_log2,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HEADS: tl.constexpr, DOT_PRECISION: tl.constexpr, INTERPRETED: tl.constexpr,
):  # fmt: skip
    # One program: BLOCK_M rows of HEADS query heads of one (batch, kv head) — 1 head, or all kv_group heads of the
    # kv head (GQA packed: row r is query r % q_len of head head0 + r // q_len) — over the keys of one split, which
    # it writes at out_ptr/lse_ptr + split * stride_os/ls (split is always 0 when unsplit). The last dim of q/k/v/out
    # has stride 1.
    qk_scale_log2 = tl.cast(qk_scale_log2, tl.float32)  # Inductor passes Python floats as fp64
    programs_per_batch = n_heads // HEADS
    batch = (tl.program_id(1) // programs_per_batch).to(tl.int64)
    head0 = (tl.program_id(1) % programs_per_batch).to(tl.int64) * HEADS
    split = tl.program_id(2).to(tl.int64)
    key_start = tl.program_id(2) * keys_per_split  # a multiple of BLOCK_N: every block lies inside one split
    key_end = tl.minimum(key_start + keys_per_split, kv_len)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    query = offs_m % q_len
    head = head0 + offs_m // q_len
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < q_len * HEADS
    dim_ok = offs_d < HEAD_DIM  # BLOCK_D is HEAD_DIM padded to a power of two
    q_rows = q_ptr + batch * stride_qb + head[:, None] * stride_qh + query[:, None] * stride_qm
    q = tl.load(q_rows + offs_d[None, :], mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
    k_base = k_ptr + batch * stride_kb + (head0 // kv_group) * stride_kh  # one kv head for every row
    v_base = v_ptr + batch * stride_vb + (head0 // kv_group) * stride_vh
    mask_rows = mask_ptr + batch * stride_mb + query[:, None] * stride_mm

    # Online softmax state in base 2: running max m_i, running sum l_i, unnormalised output acc.
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if INTERPRETED:
        # Triton 3.6's interpreter cannot pass a runtime bound to range() under numpy >= 2.4 (triton-lang/triton#9171).
        start_n = key_start
        while start_n < key_end:
            m_i, l_i, acc = _attn_key_block(
                q, m_i, l_i, acc, start_n, k_base, v_base, mask_rows, stride_kn, stride_vn, stride_mn, row_ok,
                kv_len, mask_start, qk_scale_log2, HEAD_DIM, BLOCK_D, BLOCK_N, DOT_PRECISION, INTERPRETED,
            )  # fmt: skip
            start_n += BLOCK_N
    else:
        # A for loop lets Triton pipeline the K/V loads (a while loop was up to 1.5x slower on an H200).
        for start_n in range(key_start, key_end, BLOCK_N):
            m_i, l_i, acc = _attn_key_block(
                q, m_i, l_i, acc, start_n, k_base, v_base, mask_rows, stride_kn, stride_vn, stride_mn, row_ok,
                kv_len, mask_start, qk_scale_log2, HEAD_DIM, BLOCK_D, BLOCK_N, DOT_PRECISION, INTERPRETED,
            )  # fmt: skip

    # l_i == 0 exactly when a row saw no visible key in this split (otherwise its max term adds exp2(0) = 1):
    # out 0, lse -inf.
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    lse = (m_i + tl.log2(l_safe)) * 0.6931471805599453  # base-2 -> natural log
    out_rows = (out_ptr + split * stride_os + batch * stride_ob + head[:, None] * stride_oh
                + query[:, None] * stride_om)
    tl.store(out_rows + offs_d[None, :], out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :])
    tl.store(lse_ptr + split * stride_ls + batch * stride_lb + head * stride_lh + query, lse, mask=row_ok)


@triton.jit
def _combine_splits_kernel(
    part_out_ptr, part_lse_ptr, out_ptr, lse_ptr, q_len, stride_os, stride_ls,
    NUM_SPLITS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
):  # fmt: skip
    # One program: BLOCK_M query rows of one (batch, head). All four tensors are contiguous, so row r of (batch, head)
    # pair p is p * q_len + r; split s of the partial tensors starts s * stride_os (out) / s * stride_ls (lse) in.
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = offs_m < q_len
    rows = tl.program_id(1).to(tl.int64) * q_len + offs_m
    offs_d = tl.arange(0, BLOCK_D)
    ok = row_ok[:, None] & (offs_d < HEAD_DIM)[None, :]
    # Max-shifted merge as in lse_merge.py: m = max_s lse_s, w_s = exp(lse_s - m), out = Σ w_s·out_s / Σ w_s.
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    lse_ptrs = part_lse_ptr + rows
    for _ in range(NUM_SPLITS):
        m = tl.maximum(m, tl.load(lse_ptrs, mask=row_ok, other=float("-inf")))
        lse_ptrs += stride_ls
    m = tl.where(m == float("-inf"), 0.0, m)  # every split empty: weights 0, never (-inf) - (-inf)
    total = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    lse_ptrs = part_lse_ptr + rows
    out_ptrs = part_out_ptr + rows[:, None] * HEAD_DIM + offs_d[None, :]
    for _ in range(NUM_SPLITS):
        weight = tl.exp(tl.load(lse_ptrs, mask=row_ok, other=float("-inf")) - m)
        total += weight
        acc += tl.load(out_ptrs, mask=ok, other=0.0) * weight[:, None]
        lse_ptrs += stride_ls
        out_ptrs += stride_os
    total_safe = tl.where(total == 0.0, 1.0, total)  # rows empty in every split: out 0, lse -inf
    out = acc / total_safe[:, None]
    lse = tl.where(total == 0.0, float("-inf"), m + tl.log(total_safe))
    tl.store(out_ptr + rows[:, None] * HEAD_DIM + offs_d[None, :], out.to(out_ptr.dtype.element_ty), mask=ok)
    tl.store(lse_ptr + rows, lse, mask=row_ok)


# Query rows per program of `_combine_splits_kernel`; a fixed, untuned choice.
_COMBINE_BLOCK_M = 16


def _block_config(q_len: int, block_d: int) -> tuple[int, int, int, int]:
    """Return (BLOCK_M, BLOCK_N, num_warps, num_stages): fixed, untuned choices (tl.dot needs blocks ≥ 16)."""
    block_m = 64 if q_len > 32 else max(16, triton.next_power_of_2(q_len))
    block_n = 32 if block_d >= 256 else 64
    num_warps = 8 if block_d >= 256 else 4
    return block_m, block_n, num_warps, 2


@functools.cache
def _sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of `device`, read once per device; 132 (an H100/H200) for interpreted CPU tensors."""
    if device.type != "cuda":
        return 132
    return torch.cuda.get_device_properties(device).multi_processor_count


def _split_plan(programs: int, key_blocks: int, sms: int, num_splits: int | None = None) -> tuple[int, int]:
    """Choose how many key ranges (splits) each query block's keys are divided into, from shapes only.

    The heuristic (num_splits None) splits only when the unsplit grid leaves SMs idle: it aims at ~2 programs per
    SM, and never at more splits than key blocks. A requested count is clamped the same way. The count is then
    rounded so that the splits share the key blocks evenly and none is empty.

    Args:
        programs: programs of the unsplit grid, cdiv(q_len · HEADS, BLOCK_M) · batch · n_heads / HEADS (≥ 1).
        key_blocks: cdiv(kv_len, BLOCK_N) (≥ 0).
        sms: streaming multiprocessors on the device.
        num_splits: a requested count (int ≥ 1), or None for the heuristic.
    Returns: (num_splits, blocks_per_split): split s folds key blocks [s · blocks_per_split, (s + 1) ·
        blocks_per_split) ∩ [0, key_blocks), which is non-empty for every s < num_splits.
    Reference: flash-decoding (Dao et al., 2023); FlashAttention-2 `num_splits_heuristic`.
    """
    if num_splits is None:
        num_splits = 1 if programs >= sms else triton.cdiv(2 * sms, programs)
    if num_splits <= 1 or key_blocks <= 1:
        return 1, key_blocks
    blocks_per_split = triton.cdiv(key_blocks, min(num_splits, key_blocks))
    return triton.cdiv(key_blocks, blocks_per_split), blocks_per_split


def _fused_mask_attn_impl(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float, num_splits: int | None,
    pack_gqa: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Allocate outputs and launch the kernel(s); inputs are already checked (see `fused_mask_attn`).

    With one split the kernel writes out and lse directly. With S > 1 splits it writes fp32 partial states
    (S, batch, n_heads, q_len, head_dim) and (S, batch, n_heads, q_len) to scratch tensors, which
    `_combine_splits_kernel` merges into out and lse.

    Args:
        q: (batch, n_heads, q_len, head_dim); k, v: (batch, n_kv_heads, kv_len, head_dim); last dims contiguous.
        mask: (batch, q_len, m) bool, m <= kv_len, over the last m keys (any strides; stride 0 broadcasts), True =
            attend; the first kv_len - m keys are visible to every query.
        scale: softmax scale applied to q·k.
        num_splits: requested split count (int ≥ 1, clamped by `_split_plan`), or None for the heuristic.
        pack_gqa: one program per (query block, batch, kv head) over the rows of all the kv head's query heads.
    Returns: out like q; lse (batch, n_heads, q_len) fp32, natural log.
    """
    batch, n_heads, q_len, head_dim = q.shape
    n_kv_heads, kv_len = k.shape[1], k.shape[2]
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((batch, n_heads, q_len), dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        return out, lse
    block_d = max(16, triton.next_power_of_2(head_dim))
    heads = n_heads // n_kv_heads if pack_gqa else 1  # query heads per program
    rows = q_len * heads
    block_m, block_n, num_warps, num_stages = _block_config(rows, block_d)
    programs = triton.cdiv(rows, block_m) * batch * (n_heads // heads)
    num_splits, blocks_per_split = _split_plan(programs, triton.cdiv(kv_len, block_n), _sm_count(q.device), num_splits)
    if num_splits == 1:  # the kernel writes out and lse directly; split is always 0, so stride_os/ls are unused
        part_out, part_lse, stride_os, stride_ls = out, lse, 0, 0
    else:  # S copies of out and lse stacked, fp32: below dim 0 they have the strides of out and lse
        part_out = torch.empty((num_splits, *out.shape), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((num_splits, *lse.shape), dtype=torch.float32, device=q.device)
        stride_os, stride_ls = part_out.stride(0), part_lse.stride(0)
    grid = (triton.cdiv(rows, block_m), batch * (n_heads // heads), num_splits)
    interpreted = is_interpreted(_tree_attn_fwd_kernel)
    kernel = _tree_attn_fwd_kernel if interpreted else wrap_triton(_tree_attn_fwd_kernel)
    kernel[grid](
        q, k, v, mask, part_out, part_lse,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        mask.stride(0), mask.stride(1), mask.stride(2),
        stride_os, out.stride(0), out.stride(1), out.stride(2),
        stride_ls, lse.stride(0), lse.stride(1),
        n_heads, n_heads // n_kv_heads, q_len, kv_len, kv_len - mask.shape[-1], blocks_per_split * block_n,
        scale * 1.4426950408889634,  # log2(e)
        HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_M=block_m, BLOCK_N=block_n, HEADS=heads,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", INTERPRETED=interpreted,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    if num_splits > 1:
        combine = _combine_splits_kernel if interpreted else wrap_triton(_combine_splits_kernel)
        combine[(triton.cdiv(q_len, _COMBINE_BLOCK_M), batch * n_heads)](
            part_out, part_lse, out, lse, q_len, stride_os, stride_ls,
            NUM_SPLITS=num_splits, HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_M=_COMBINE_BLOCK_M,
        )  # fmt: skip
    return out, lse


if triton_available():
    _fused_mask_attn_op = triton_op(_OP_NAME, _fused_mask_attn_impl, mutates_args=())
else:
    _fused_mask_attn_op = None


def fused_mask_attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    scale: float | None = None,
    *,
    num_splits: int | None = None,
    visible_prefix: bool = False,
    pack_gqa: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked attention with its log-sum-exp, through the Triton kernel `_tree_attn_fwd_kernel`.

    Args:
        q: (batch, n_heads, q_len, head_dim), float16, bfloat16 or float32, on a CUDA device (or CPU under
            TRITON_INTERPRET=1). 1 ≤ head_dim ≤ 256.
        k: (batch, n_kv_heads, kv_len, head_dim), same dtype and device; n_heads % n_kv_heads == 0 and query head h
            reads kv head h // (n_heads // n_kv_heads).
        v: same shape as `k`.
        mask: bool, (q_len, kv_len) or (batch or 1, q_len, kv_len); True = the query may attend to the key.
            Any strides (slices of a bigger mask are fine). With `visible_prefix`, (…, q_len, m) for any
            m <= kv_len: the mask covers the last m keys and the first kv_len - m are visible to every query (their
            key blocks read no mask: hybrid tree attention over [committed prefix; tree] in one call).
        scale: softmax scale on q·k; None means 1 / sqrt(head_dim).
        num_splits: how many key ranges to attend over in parallel before merging them by their LSEs (split-KV);
            None (default) chooses from the shapes and the device's SM count only, so it is fixed under
            torch.compile and CUDA graphs. A count above the number of key blocks is clamped, and any count is
            rounded down so every split gets whole, non-empty key blocks. 1 runs the unsplit kernel. Every count
            gives the same result up to rounding.
        visible_prefix: accept a mask narrower than the keys (see `mask`); without it that is an error.
        pack_gqa: give each program the rows of ALL the query heads that share a kv head (q_len · n_heads /
            n_kv_heads rows), so a key block is read once per kv head instead of once per query head (GQA). The same
            result up to rounding; which is faster depends on the shapes (few query rows over long keys gain most).
    Returns: (out, lse). out: (batch, n_heads, q_len, head_dim), dtype of q. lse: (batch, n_heads, q_len), fp32,
        natural log of Σ_visible exp(q·k·scale). Rows with no visible key give out = 0 and lse = -inf.
    Raises:
        ImportError: if Triton is not installed (use `fused_mask_attn_ref`).
        TypeError: if q, k, v or mask is not a tensor.
        ValueError: on wrong shapes, dtypes, devices, a non-bool mask, head_dim > 256, CPU tensors without
            TRITON_INTERPRET=1, or a `num_splits` that is not None or an int ≥ 1.
    Reference: LongSpec §3 (hybrid tree attention; `fused_mask_attn`), FlashAttention-2 (online softmax),
        flash-decoding (split-KV).
    """
    require_triton("fused_mask_attn")
    caller = "fused_mask_attn"
    batch, _, _, q_len, kv_len, head_dim = check_qkv(q, k, v, caller=caller)
    width = check_mask(mask, batch, q_len, kv_len, q.device, caller=caller, visible_prefix=visible_prefix)
    scale = resolve_scale(scale, head_dim, caller=caller)
    if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1):
        raise ValueError(
            f"{caller}: `num_splits` must be an int >= 1, or None to choose it from the shapes; got {num_splits!r}."
        )
    if not 1 <= head_dim <= 256:
        raise ValueError(f"{caller}: head_dim must be in [1, 256], got {head_dim}; use fused_mask_attn_ref.")
    if q.device.type != "cuda" and not is_interpreted(_tree_attn_fwd_kernel):
        raise ValueError(
            f"{caller}: tensors are on {q.device}; the Triton kernel needs a CUDA device. Move them with .cuda(), "
            "use fused_mask_attn_ref on CPU, or set TRITON_INTERPRET=1 before importing triton (slow, for tests)."
        )
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    mask = mask.expand(batch, q_len, width) if mask.dim() == 2 else mask.expand(batch, -1, -1)
    return _fused_mask_attn_op(q, k, v, mask, scale, num_splits, bool(pack_gqa))


def fused_mask_attn_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    scale: float | None = None,
    *,
    upcast: bool = True,
    visible_prefix: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact, readable torch twin of `fused_mask_attn`; also its CPU path.

    Args:
        q, k, v, mask, scale, visible_prefix: as in `fused_mask_attn` (any device, any head_dim).
        upcast: compute in fp32 (default, the reference). False computes scores, softmax and p·v in the input
            dtype; the tests use it to measure the error a low-precision implementation is allowed (STYLE B10).
    Returns: (out, lse) as in `fused_mask_attn`: out (batch, n_heads, q_len, head_dim) in q's dtype,
        lse (batch, n_heads, q_len) fp32; rows with no visible key give out = 0 and lse = -inf.
    Raises: TypeError for a non-tensor argument; ValueError on wrong shapes, dtypes, devices or a non-bool mask.
    Reference: LongSpec §3; softmax attention (Vaswani et al., 2017).
    """
    caller = "fused_mask_attn_ref"
    batch, n_heads, n_kv_heads, q_len, kv_len, head_dim = check_qkv(q, k, v, caller=caller)
    width = check_mask(mask, batch, q_len, kv_len, q.device, caller=caller, visible_prefix=visible_prefix)
    scale = resolve_scale(scale, head_dim, caller=caller)
    if width < kv_len:  # the first kv_len - width keys are visible to every query
        mask = torch.cat([mask.new_ones(*mask.shape[:-1], kv_len - width), mask], dim=-1)
    compute_dtype = torch.float32 if upcast else q.dtype
    group = n_heads // n_kv_heads
    k = k.to(compute_dtype).repeat_interleave(group, dim=1)  # (batch, n_heads, kv_len, head_dim)
    v = v.to(compute_dtype).repeat_interleave(group, dim=1)
    scores = torch.matmul(q.to(compute_dtype), k.transpose(-1, -2)) * scale
    visible = mask if mask.dim() == 3 else mask.unsqueeze(0)
    scores = scores.masked_fill(~visible.unsqueeze(1), float("-inf"))  # (batch, n_heads, q_len, kv_len)
    lse = torch.logsumexp(scores, dim=-1)
    # Fully masked rows have lse = -inf; subtract 0 there so their probabilities are exp(-inf) = 0, not NaN.
    shift = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    probs = torch.exp(scores - shift.unsqueeze(-1))
    out = torch.matmul(probs, v)
    return out.to(q.dtype), lse.float()


__all__ = ["fused_mask_attn", "fused_mask_attn_ref"]
