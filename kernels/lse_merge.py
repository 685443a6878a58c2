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
Implementation: plain torch elementwise ops — this IS the implementation, not a fallback. It is a handful of
    bandwidth-bound ops on (batch, n_heads, q_len, head_dim) tensors that `torch.compile` fuses into one kernel,
    so a hand-written Triton kernel would add code without a measurable gain at tree sizes.
`merge_attention_states_ref` writes the same math in the max-shifted form (m = max(lse_a, lse_b)) used by
    FlashAttention's split-KV combine; the tests check the two agree, and agree with attention over [A; B].
Tested: CPU (torch 2.13) and an NVIDIA H200 host (torch 2.11; the merge tests run on CPU tensors there) in
    fp16/bf16/fp32 with random and -inf LSEs, and end to end after `prefix_attn` + `fused_mask_attn`.
"""

import torch

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
    lse = torch.logaddexp(lse_a, lse_b)
    # Where both sides are empty lse = -inf; shift by 0 there so both weights are exp(-inf) = 0, not NaN.
    shift = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    weight_a = torch.exp(lse_a - shift).unsqueeze(-1)
    weight_b = torch.exp(lse_b - shift).unsqueeze(-1)
    out = out_a.float() * weight_a + out_b.float() * weight_b
    return out.to(out_a.dtype), lse


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
