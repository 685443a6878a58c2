"""Input checks shared by the attention launchers and their `*_ref` twins.

Every check raises `ValueError` (`TypeError` for a non-tensor) naming the bad value and the fix; none uses `assert`,
which `python -O` removes.
"""

import math

import torch

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def check_qkv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, caller: str
) -> tuple[int, int, int, int, int, int]:
    """Check the q/k/v layout every kernel in this package uses and return its sizes.

    Args:
        q: (batch, n_heads, q_len, head_dim).
        k: (batch, n_kv_heads, kv_len, head_dim).
        v: same shape, dtype and device as `k`.
        caller: public function name, used in the error messages.
    Returns: (batch, n_heads, n_kv_heads, q_len, kv_len, head_dim), all ints.
    Raises:
        TypeError: if q, k or v is not a tensor.
        ValueError: if a tensor has the wrong rank, dtype or device, or the head counts do not divide.
    Reference: GQA as in transformers `repeat_kv` (query head h reads kv head h // (n_heads // n_kv_heads)).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{caller}: `{name}` must be a torch.Tensor, got {type(t).__name__}.")
        if t.dim() != 4:
            raise ValueError(
                f"{caller}: `{name}` must be 4-D (batch, heads, seq_len, head_dim), got shape {tuple(t.shape)}; "
                "transpose a (batch, seq_len, heads, head_dim) tensor with .transpose(1, 2)."
            )
        if t.dtype not in _FLOAT_DTYPES:
            raise ValueError(f"{caller}: `{name}` must be float16, bfloat16 or float32, got {t.dtype}.")
    if k.shape != v.shape:
        raise ValueError(f"{caller}: `k` and `v` must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}.")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(
            f"{caller}: q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}; cast with .to(q.dtype)."
        )
    if not (q.device == k.device == v.device):
        raise ValueError(f"{caller}: q, k, v must be on one device, got {q.device}, {k.device}, {v.device}.")
    batch, n_heads, q_len, head_dim = q.shape
    k_batch, n_kv_heads, kv_len, k_head_dim = k.shape
    if k_batch != batch or k_head_dim != head_dim:
        raise ValueError(
            f"{caller}: k/v batch and head_dim must match q: q {tuple(q.shape)}, k {tuple(k.shape)} "
            "(expected (batch, n_kv_heads, kv_len, head_dim))."
        )
    if n_kv_heads == 0 or n_heads % n_kv_heads != 0:
        raise ValueError(
            f"{caller}: n_heads ({n_heads}) must be a multiple of n_kv_heads ({n_kv_heads}) "
            "for grouped-query attention."
        )
    return batch, n_heads, n_kv_heads, q_len, kv_len, head_dim


def resolve_scale(scale: float | None, head_dim: int, *, caller: str) -> float:
    """Return the softmax scale: `scale` if given, else 1 / sqrt(head_dim).

    Raises: ValueError if `scale` is not a finite real number.
    """
    if scale is None:
        return 1.0 / math.sqrt(head_dim) if head_dim > 0 else 1.0
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"{caller}: `scale` must be a finite float or None (= 1/sqrt(head_dim)), got {scale!r}.")
    return float(scale)


def check_mask(mask: torch.Tensor, batch: int, q_len: int, kv_len: int, device: torch.device, *, caller: str,
               visible_prefix: bool = False) -> int:
    """Check a boolean attention mask of shape (q_len, kv_len) or (batch or 1, q_len, kv_len).

    With `visible_prefix` the mask may be narrower, (q_len, m) or (batch or 1, q_len, m) with 0 <= m <= kv_len: it
    covers the last m keys and the first kv_len - m are visible to every query.
    Returns: the mask's width m (kv_len without `visible_prefix`).
    Raises:
        TypeError: if the mask is not a tensor.
        ValueError: if it is not bool, has a shape that does not broadcast, or is on another device.
    """
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{caller}: `mask` must be a bool torch.Tensor, got {type(mask).__name__}.")
    if mask.dtype != torch.bool:
        raise ValueError(
            f"{caller}: `mask` must be torch.bool (True = may attend), got {mask.dtype}; "
            "convert a 0/1 mask with `mask != 0` (an additive 0/-inf bias with `bias == 0`)."
        )
    width = mask.shape[-1] if mask.dim() in (2, 3) else -1
    width_ok = width == kv_len or (visible_prefix and 0 <= width <= kv_len)
    ok_2d = mask.dim() == 2 and mask.shape[0] == q_len and width_ok
    ok_3d = mask.dim() == 3 and mask.shape[0] in (1, batch) and mask.shape[1] == q_len and width_ok
    if not (ok_2d or ok_3d):
        cols = f"m <= {kv_len}" if visible_prefix else str(kv_len)
        raise ValueError(
            f"{caller}: `mask` must have shape ({q_len}, {cols}) or ({batch} or 1, {q_len}, {cols}) "
            f"= ([batch,] q_len, {'masked keys' if visible_prefix else 'kv_len'}), got {tuple(mask.shape)}."
        )
    if mask.device != device:
        raise ValueError(f"{caller}: `mask` is on {mask.device} but q is on {device}; move it with .to(q.device).")
    return width
