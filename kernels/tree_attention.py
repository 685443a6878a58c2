"""Tree attention: attention of tree queries over keys under an arbitrary boolean mask, returning the LSE.

Kernel card
-----------
What: `fused_mask_attn(q, k, v, mask)` computes softmax(q·kᵀ·scale masked by `mask`)·v and the natural-log
    log-sum-exp (LSE) of the visible scaled scores. With the LSE, the result merges exactly with attention over
    a disjoint key set (the committed prefix) by `merge_attention_states` (LongSpec §3, hybrid tree attention).
Layout: q (batch, n_heads, q_len, head_dim); k, v (batch, n_kv_heads, kv_len, head_dim); mask bool
    (q_len, kv_len) or (batch or 1, q_len, kv_len), True = may attend; out like q; lse (batch, n_heads, q_len) fp32.
    No causal mask is added: the mask alone decides (unlike LongSpec's kernel, which also applies a
    bottom-right causal mask). A tree mask over [prefix; tree] keys looks like this (x = attend)::

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
Sizes: any q_len and kv_len; meant for tree sizes up to ~512 queries and kv_len up to a few thousand. For the long
    committed prefix use `prefix_attention.prefix_attn` (no mask to read) and merge the two.
Empty rows: a query row with no visible key returns out = 0 and lse = -inf (the ref does the same), so merging it
    with a prefix state returns the prefix state unchanged.
Algorithm: one program per (BLOCK_M query rows, head, batch); flash-style online softmax in base 2 over BLOCK_N key
    blocks with `tl.dot`; the mask block is loaded beside each key block. Fixed, untuned block sizes (see
    `_block_config`); no autotuning, no split-KV, no early exit for fully masked blocks.
Departures from `fused_mask_attn_ref`: summation order (blockwise online softmax); for fp16/bf16 the softmax
    probabilities are rounded to the input dtype before the p·v product (as in FlashAttention); fp32 inputs use
    IEEE fp32 dots (no TF32). The tests bound the error per STYLE B10.
Launch: through `torch.library.triton_op` ("transformers_longspec::fused_mask_attn") with `wrap_triton`, so
    `torch.compile(fullgraph=True)` traces into the kernel; validation happens in the Python launcher before the
    op. Interpreted kernels (TRITON_INTERPRET=1) are launched without `wrap_triton`, which only newer torch
    versions accept them in; the interpreter also takes the `while` loop and fp32 dots (see `_dot`), because
    Triton 3.6's interpreter breaks on range() with a runtime bound under numpy >= 2.4 and on bf16 tl.dot.
Devices: CUDA GPUs; CPU tensors only under TRITON_INTERPRET=1 (slow; for CI). Without Triton, `fused_mask_attn`
    raises ImportError and `fused_mask_attn_ref` is the CPU path.
Tested: CPU under TRITON_INTERPRET=1 (triton 3.6; torch 2.13 and 2.11), all three dtypes, head dims 16-256 and 80,
    GQA 1/2/4/8, random, tree, all-true and fully masked rows; NVIDIA H200 (triton 3.6, torch 2.11): fp16/bf16,
    head dims 64/128/256, q_len 16-512, kv_len 16-2560, GQA 1/4/7/8, eager and torch.compile(fullgraph=True);
    fp32 with every mask kind. Forward only: no autograd.
Speed (H200, bf16, 32/8 heads, head_dim 128, random mask, kernel time under CUDA graphs): q_len/kv_len 16/16
    3.1 µs, 64/1088 22.6 µs, 512/512 17.7 µs, 512/4096 109 µs; torch SDPA with the same bool mask (no LSE, K/V
    repeated) takes 12.4 / 36.6 / 25.9 / 119 µs. Few query rows over long keys under-fill the GPU (16/4096: 78 µs,
    one program per head, no split-KV): use `prefix_attn` for the unmasked prefix (18.6 µs there). Eager calls
    cost ~80-120 µs of CPU time each (custom-op dispatch, Triton's launcher, checks): compile or CUDA-graph the
    decode step.
Limits: offsets are 64-bit per (batch, head) base, 32-bit within a head; no dropout, no bias, no softcap.
"""

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
    qk_scale_log2,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr, INTERPRETED: tl.constexpr,
):  # fmt: skip
    """Fold keys [start_n, start_n + BLOCK_N) into the base-2 online-softmax state (m_i, l_i, acc)."""
    cols = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    col_ok = cols < kv_len
    kv_ok = col_ok[:, None] & (offs_d < HEAD_DIM)[None, :]
    k = tl.load(k_base + cols[:, None] * stride_kn + offs_d[None, :], mask=kv_ok, other=0.0)
    visible = tl.load(mask_rows + cols[None, :] * stride_mn, mask=row_ok[:, None] & col_ok[None, :], other=False)
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
    stride_ob, stride_oh, stride_om,
    stride_lb, stride_lh,
    n_heads, kv_group, q_len, kv_len, qk_scale_log2,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr, INTERPRETED: tl.constexpr,
):  # fmt: skip
    # One program: BLOCK_M query rows of one (batch, head). The last dim of q/k/v/out has stride 1.
    qk_scale_log2 = tl.cast(qk_scale_log2, tl.float32)  # Inductor passes Python floats as fp64
    batch = (tl.program_id(1) // n_heads).to(tl.int64)
    head = (tl.program_id(1) % n_heads).to(tl.int64)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < q_len
    dim_ok = offs_d < HEAD_DIM  # BLOCK_D is HEAD_DIM padded to a power of two
    q_rows = q_ptr + batch * stride_qb + head * stride_qh + offs_m[:, None] * stride_qm
    q = tl.load(q_rows + offs_d[None, :], mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
    k_base = k_ptr + batch * stride_kb + (head // kv_group) * stride_kh
    v_base = v_ptr + batch * stride_vb + (head // kv_group) * stride_vh
    mask_rows = mask_ptr + batch * stride_mb + offs_m[:, None] * stride_mm

    # Online softmax state in base 2: running max m_i, running sum l_i, unnormalised output acc.
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if INTERPRETED:
        # Triton 3.6's interpreter cannot pass a runtime bound to range() under numpy >= 2.4 (triton-lang/triton#9171).
        start_n = 0
        while start_n < kv_len:
            m_i, l_i, acc = _attn_key_block(
                q, m_i, l_i, acc, start_n, k_base, v_base, mask_rows, stride_kn, stride_vn, stride_mn, row_ok,
                kv_len, qk_scale_log2, HEAD_DIM, BLOCK_D, BLOCK_N, DOT_PRECISION, INTERPRETED,
            )  # fmt: skip
            start_n += BLOCK_N
    else:
        # A for loop lets Triton pipeline the K/V loads (a while loop was up to 1.5x slower on an H200).
        for start_n in range(0, kv_len, BLOCK_N):
            m_i, l_i, acc = _attn_key_block(
                q, m_i, l_i, acc, start_n, k_base, v_base, mask_rows, stride_kn, stride_vn, stride_mn, row_ok,
                kv_len, qk_scale_log2, HEAD_DIM, BLOCK_D, BLOCK_N, DOT_PRECISION, INTERPRETED,
            )  # fmt: skip

    # l_i == 0 exactly when a row saw no visible key (otherwise its max term adds exp2(0) = 1): out 0, lse -inf.
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    lse = (m_i + tl.log2(l_safe)) * 0.6931471805599453  # base-2 -> natural log
    out_rows = out_ptr + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_om
    tl.store(out_rows + offs_d[None, :], out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :])
    tl.store(lse_ptr + batch * stride_lb + head * stride_lh + offs_m, lse, mask=row_ok)


def _block_config(q_len: int, block_d: int) -> tuple[int, int, int, int]:
    """Return (BLOCK_M, BLOCK_N, num_warps, num_stages): fixed, untuned choices (tl.dot needs blocks ≥ 16)."""
    block_m = 64 if q_len > 32 else max(16, triton.next_power_of_2(q_len))
    block_n = 32 if block_d >= 256 else 64
    num_warps = 8 if block_d >= 256 else 4
    return block_m, block_n, num_warps, 2


def _fused_mask_attn_impl(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Allocate outputs and launch the kernel; inputs are already checked (see `fused_mask_attn`).

    Args:
        q: (batch, n_heads, q_len, head_dim); k, v: (batch, n_kv_heads, kv_len, head_dim); last dims contiguous.
        mask: (batch, q_len, kv_len) bool (any strides; stride 0 broadcasts), True = attend.
        scale: softmax scale applied to q·k.
    Returns: out like q; lse (batch, n_heads, q_len) fp32, natural log.
    """
    batch, n_heads, q_len, head_dim = q.shape
    n_kv_heads, kv_len = k.shape[1], k.shape[2]
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((batch, n_heads, q_len), dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        return out, lse
    block_d = max(16, triton.next_power_of_2(head_dim))
    block_m, block_n, num_warps, num_stages = _block_config(q_len, block_d)
    grid = (triton.cdiv(q_len, block_m), batch * n_heads)
    interpreted = is_interpreted(_tree_attn_fwd_kernel)
    kernel = _tree_attn_fwd_kernel if interpreted else wrap_triton(_tree_attn_fwd_kernel)
    kernel[grid](
        q, k, v, mask, out, lse,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        mask.stride(0), mask.stride(1), mask.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        lse.stride(0), lse.stride(1),
        n_heads, n_heads // n_kv_heads, q_len, kv_len, scale * 1.4426950408889634,  # log2(e)
        HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_M=block_m, BLOCK_N=block_n,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", INTERPRETED=interpreted,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return out, lse


if triton_available():
    _fused_mask_attn_op = triton_op(_OP_NAME, _fused_mask_attn_impl, mutates_args=())
else:
    _fused_mask_attn_op = None


def fused_mask_attn(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked attention with its log-sum-exp, through the Triton kernel `_tree_attn_fwd_kernel`.

    Args:
        q: (batch, n_heads, q_len, head_dim), float16, bfloat16 or float32, on a CUDA device (or CPU under
            TRITON_INTERPRET=1). 1 ≤ head_dim ≤ 256.
        k: (batch, n_kv_heads, kv_len, head_dim), same dtype and device; n_heads % n_kv_heads == 0 and query head h
            reads kv head h // (n_heads // n_kv_heads).
        v: same shape as `k`.
        mask: bool, (q_len, kv_len) or (batch or 1, q_len, kv_len); True = the query may attend to the key.
            Any strides (slices of a bigger mask are fine).
        scale: softmax scale on q·k; None means 1 / sqrt(head_dim).
    Returns: (out, lse). out: (batch, n_heads, q_len, head_dim), dtype of q. lse: (batch, n_heads, q_len), fp32,
        natural log of Σ_visible exp(q·k·scale). Rows with no visible key give out = 0 and lse = -inf.
    Raises:
        ImportError: if Triton is not installed (use `fused_mask_attn_ref`).
        TypeError: if q, k, v or mask is not a tensor.
        ValueError: on wrong shapes, dtypes, devices, a non-bool mask, head_dim > 256, or CPU tensors without
            TRITON_INTERPRET=1.
    Reference: LongSpec §3 (hybrid tree attention; `fused_mask_attn`), FlashAttention-2 (online softmax).
    """
    require_triton("fused_mask_attn")
    caller = "fused_mask_attn"
    batch, _, _, q_len, kv_len, head_dim = check_qkv(q, k, v, caller=caller)
    check_mask(mask, batch, q_len, kv_len, q.device, caller=caller)
    scale = resolve_scale(scale, head_dim, caller=caller)
    if not 1 <= head_dim <= 256:
        raise ValueError(f"{caller}: head_dim must be in [1, 256], got {head_dim}; use fused_mask_attn_ref.")
    if q.device.type != "cuda" and not is_interpreted(_tree_attn_fwd_kernel):
        raise ValueError(
            f"{caller}: tensors are on {q.device}; the Triton kernel needs a CUDA device. Move them with .cuda(), "
            "use fused_mask_attn_ref on CPU, or set TRITON_INTERPRET=1 before importing triton (slow, for tests)."
        )
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    mask = mask.expand(batch, q_len, kv_len) if mask.dim() == 2 else mask.expand(batch, -1, -1)
    return _fused_mask_attn_op(q, k, v, mask, scale)


def fused_mask_attn_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    scale: float | None = None,
    *,
    upcast: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact, readable torch twin of `fused_mask_attn`; also its CPU path.

    Args:
        q, k, v, mask, scale: as in `fused_mask_attn` (any device, any head_dim).
        upcast: compute in fp32 (default, the reference). False computes scores, softmax and p·v in the input
            dtype; the tests use it to measure the error a low-precision implementation is allowed (STYLE B10).
    Returns: (out, lse) as in `fused_mask_attn`: out (batch, n_heads, q_len, head_dim) in q's dtype,
        lse (batch, n_heads, q_len) fp32; rows with no visible key give out = 0 and lse = -inf.
    Raises: TypeError for a non-tensor argument; ValueError on wrong shapes, dtypes, devices or a non-bool mask.
    Reference: LongSpec §3; softmax attention (Vaswani et al., 2017).
    """
    caller = "fused_mask_attn_ref"
    batch, n_heads, n_kv_heads, q_len, kv_len, head_dim = check_qkv(q, k, v, caller=caller)
    check_mask(mask, batch, q_len, kv_len, q.device, caller=caller)
    scale = resolve_scale(scale, head_dim, caller=caller)
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
