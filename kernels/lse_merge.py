"""Exact merge of two attention results over disjoint key sets by their log-sum-exps.

Kernel card
-----------
What: given attention over key set A (out_a, lse_a) and over a disjoint key set B (out_b, lse_b) for the same
    queries, return attention over A ∪ B. This joins the unmasked prefix pass (`prefix_attn`) and the masked tree
    pass (`fused_mask_attn`) of LongSpec's hybrid tree attention::

        lse = logaddexp(lse_a, lse_b)
        out = out_a · exp(lse_a - lse) + out_b · exp(lse_b - lse)

Layout: out_a, out_b (batch, n_heads, q_len, head_dim); lse_a, lse_b (batch, n_heads, q_len) fp32, natural log
    (the convention of FlashAttention's softmax_lse, torch's SDPA flash op and `fused_mask_attn`; a base-2 LSE such
    as FlashInfer's must be multiplied by ln 2 first).
Dtypes: out_a / out_b float16, bfloat16 or float32 (they may differ); the arithmetic is fp32 and the result has
    out_a's dtype. LSEs must be fp32.
Empty sides: lse = -inf marks a row that saw no key on that side; its out gets weight 0 (it must be finite, as the
    0 rows the kernels here return are), so the merge returns the other side. Both sides -inf gives out = 0 and
    lse = -inf, never NaN.
Implementations: `merge_attention_states` runs one Triton kernel on CUDA (`_merge_kernel`: one program per
    BLOCK_R query rows, fp32 math in the max-shifted form) and plain torch elementwise ops elsewhere (`_merge_torch`,
    the CPU path). The decode loop replays its steps from CUDA graphs without inductor, so the torch form costs
    ~14 small kernels per attention layer (~400 per verification of a 28-layer target); the kernel makes it one.
`merge_attention_states_ref` writes the same math in the max-shifted form (m = max(lse_a, lse_b)) used by
    FlashAttention's split-KV combine; the tests check both implementations against it (the kernel on CPU through
    TRITON_INTERPRET=1 in CI), and against attention over [A; B].
Tested: CPU (torch 2.13; the kernel interpreted) and an NVIDIA H200 (torch 2.11, triton 3.6) in fp16/bf16/fp32
    with random and -inf LSEs, and end to end after `prefix_attn` + `fused_mask_attn`.
"""

import torch
from torch.library import triton_op, wrap_triton

from ._triton_utils import is_interpreted, tl, triton, triton_available

_OUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _check_states(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor, *, caller: str
) -> None:
    """Raise TypeError for a non-tensor, ValueError unless both pairs have matching shapes, fp32 LSEs, one device."""
    tensors = {"out_a": out_a, "lse_a": lse_a, "out_b": out_b, "lse_b": lse_b}
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{caller}: `{name}` must be a torch.Tensor, got {type(t).__name__}.")
    if out_a.dim() != 4 or out_a.shape != out_b.shape:
        raise ValueError(
            f"{caller}: out_a and out_b must both be (batch, n_heads, q_len, head_dim), "
            f"got {tuple(out_a.shape)} and {tuple(out_b.shape)}."
        )
    if lse_a.shape != out_a.shape[:-1] or lse_b.shape != out_a.shape[:-1]:
        raise ValueError(
            f"{caller}: lse_a and lse_b must be (batch, n_heads, q_len) = {tuple(out_a.shape[:-1])}, "
            f"got {tuple(lse_a.shape)} and {tuple(lse_b.shape)}."
        )
    if lse_a.dtype != torch.float32 or lse_b.dtype != torch.float32:
        raise ValueError(
            f"{caller}: LSEs must be float32 (natural log), got {lse_a.dtype} and {lse_b.dtype}; "
            "a bf16/fp16 LSE loses the precision the merge needs — keep it fp32 from the attention kernel."
        )
    if out_a.dtype not in _OUT_DTYPES or out_b.dtype not in _OUT_DTYPES:
        raise ValueError(f"{caller}: outputs must be float16, bfloat16 or float32, got {out_a.dtype}, {out_b.dtype}.")
    devices = {t.device for t in tensors.values()}
    if len(devices) != 1:
        raise ValueError(f"{caller}: all four tensors must be on one device, got {sorted(map(str, devices))}.")


def merge_attention_states(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge attention over two disjoint key sets into attention over their union.

    Args:
        out_a: (batch, n_heads, q_len, head_dim), float16, bfloat16 or float32; attention over key set A.
        lse_a: (batch, n_heads, q_len), fp32, natural log of Σ_A exp(q·k·scale); -inf where A had no visible key.
        out_b, lse_b: same shapes for a disjoint key set B (out_b's dtype may differ from out_a's).
    Returns: (out, lse). out: (batch, n_heads, q_len, head_dim), dtype of out_a. lse: (batch, n_heads, q_len),
        fp32, = logaddexp(lse_a, lse_b). Rows where both LSEs are -inf give out = 0 and lse = -inf.
    Raises:
        TypeError: if an argument is not a tensor.
        ValueError: if shapes differ, an LSE is not fp32, or the tensors are on different devices.
    Reference: LongSpec §3 (hybrid tree attention); FlashAttention-2 split-KV combine; FlashInfer `merge_state`.
    """
    _check_states(out_a, lse_a, out_b, lse_b, caller="merge_attention_states")
    if out_a.is_cuda and triton_available():
        return _merge_op(out_a, lse_a, out_b, lse_b)
    return _merge_torch(out_a, lse_a, out_b, lse_b)


def _merge_torch(out_a, lse_a, out_b, lse_b) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch form of `merge_attention_states` (inputs already checked): the CPU path."""
    lse = torch.logaddexp(lse_a, lse_b)
    # Where both sides are empty lse = -inf; shift by 0 there so both weights are exp(-inf) = 0, not NaN.
    shift = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    weight_a = torch.exp(lse_a - shift).unsqueeze(-1)
    weight_b = torch.exp(lse_b - shift).unsqueeze(-1)
    out = out_a.float() * weight_a + out_b.float() * weight_b
    return out.to(out_a.dtype), lse


@triton.jit
def _merge_kernel(
    oa_ptr, la_ptr, ob_ptr, lb_ptr, out_ptr, lse_ptr,
    soa_b, soa_h, soa_q, sob_b, sob_h, sob_q, sla_b, sla_h, sla_q, slb_b, slb_h, slb_q,
    n_rows, n_heads, q_len,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr,
):  # fmt: skip
    # One program: BLOCK_R rows (batch, head, query) of the contiguous outputs; inputs by strides, last dim stride 1.
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < n_rows
    rows = rows.to(tl.int64)
    b = rows // (n_heads * q_len)
    h = (rows // q_len) % n_heads
    q = rows % q_len
    la = tl.load(la_ptr + b * sla_b + h * sla_h + q * sla_q, mask=row_ok, other=float("-inf"))
    lb = tl.load(lb_ptr + b * slb_b + h * slb_h + q * slb_q, mask=row_ok, other=float("-inf"))
    m = tl.maximum(la, lb)
    m = tl.where(m == float("-inf"), 0.0, m)  # both sides empty: weights 0, never (-inf) - (-inf)
    wa = tl.exp(la - m)
    wb = tl.exp(lb - m)
    total = wa + wb
    inv = tl.where(total == 0.0, 0.0, 1.0 / tl.where(total == 0.0, 1.0, total))
    d = tl.arange(0, BLOCK_D)
    ok = row_ok[:, None] & (d < HEAD_DIM)[None, :]
    oa = tl.load(oa_ptr + (b * soa_b + h * soa_h + q * soa_q)[:, None] + d[None, :], mask=ok, other=0.0)
    ob = tl.load(ob_ptr + (b * sob_b + h * sob_h + q * sob_q)[:, None] + d[None, :], mask=ok, other=0.0)
    out = oa.to(tl.float32) * (wa * inv)[:, None] + ob.to(tl.float32) * (wb * inv)[:, None]
    tl.store(out_ptr + rows[:, None] * HEAD_DIM + d[None, :], out.to(out_ptr.dtype.element_ty), mask=ok)
    tl.store(lse_ptr + rows, m + tl.log(total), mask=row_ok)


def _merge_triton_impl(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch `_merge_kernel` (inputs checked by the caller); returns contiguous (out, lse)."""
    out_a, out_b = (t if t.stride(-1) == 1 else t.contiguous() for t in (out_a, out_b))
    batch, n_heads, q_len, head_dim = out_a.shape
    out = torch.empty(out_a.shape, dtype=out_a.dtype, device=out_a.device)
    lse = torch.empty(out_a.shape[:-1], dtype=torch.float32, device=out_a.device)
    n_rows = batch * n_heads * q_len
    if n_rows == 0:
        return out, lse
    block_r = 16
    interpreted = is_interpreted(_merge_kernel)
    kernel = _merge_kernel if interpreted else wrap_triton(_merge_kernel)
    kernel[(triton.cdiv(n_rows, block_r),)](
        out_a, lse_a, out_b, lse_b, out, lse,
        *out_a.stride()[:3], *out_b.stride()[:3], *lse_a.stride(), *lse_b.stride(),
        n_rows, n_heads, q_len,
        HEAD_DIM=head_dim, BLOCK_D=max(16, triton.next_power_of_2(head_dim)), BLOCK_R=block_r,
    )  # fmt: skip
    return out, lse


if triton_available():
    _merge_op = triton_op("transformers_longspec::merge_attention_states", _merge_triton_impl, mutates_args=())
else:
    _merge_op = None


def merge_attention_states_ref(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Readable max-shifted twin of `merge_attention_states` (same arguments, returns and errors).

    With m = max(lse_a, lse_b), w_a = exp(lse_a - m), w_b = exp(lse_b - m):
    out = (out_a·w_a + out_b·w_b) / (w_a + w_b) and lse = m + log(w_a + w_b).

    Raises: TypeError / ValueError as `merge_attention_states`.
    Reference: LongSpec §3; FlashAttention-2 split-KV combine.
    """
    _check_states(out_a, lse_a, out_b, lse_b, caller="merge_attention_states_ref")
    m = torch.maximum(lse_a, lse_b)
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)  # both sides empty: weights become 0
    w_a, w_b = torch.exp(lse_a - m), torch.exp(lse_b - m)
    total = w_a + w_b
    out = (out_a.float() * w_a.unsqueeze(-1) + out_b.float() * w_b.unsqueeze(-1)) / torch.where(
        total == 0, torch.ones_like(total), total
    ).unsqueeze(-1)
    return out.to(out_a.dtype), m + torch.log(total)


__all__ = ["merge_attention_states", "merge_attention_states_ref"]
