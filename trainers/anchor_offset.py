"""Anchor-offset position ids: train large position indices on short sequences.

A draft trained only on short sequences never sees the large RoPE angles it meets at long-context inference.
Anchor-offset keeps the first `sinks` positions (the attention sinks) where they are and shifts every later
position by one random offset, so a 1k-token sequence can sit anywhere up to the target's context length:

    length 8, sinks 4, offset 20:   positions [0, 1, 2, 3, 24, 25, 26, 27]

The SAME position ids go to the frozen target (so its cached keys are rotated at the offset positions) and to
the draft. Inference never offsets.

Reference: LongSpec (arXiv 2502.17421) §3.2, Alg. 1 (Anchor-Offset Indices).
"""

from __future__ import annotations

import torch

__all__ = ["anchor_offset_position_ids"]


def anchor_offset_position_ids(
    length: int,
    max_position: int,
    sinks: int = 4,
    generator: torch.Generator | None = None,
    batch: int = 1,
    device: torch.device | str | None = None,
) -> torch.LongTensor:
    """Draw anchor-offset position ids, one random offset per row.

    Row b is `[0, 1, ..., sinks-1, sinks + o_b, ..., length-1 + o_b]` with `o_b ~ U{0, ..., max_position - length}`,
    so the largest position is at most `max_position - 1`. With `sinks >= length` nothing is shifted.

    Args:
        length: tokens per sequence (>= 1).
        max_position: positions the target supports (tokens), usually its `max_position_embeddings`.
        sinks: leading positions kept in place (attention sinks), >= 0; 4 in the paper.
        generator: CPU `torch.Generator` for reproducible draws; None uses the global RNG.
        batch: rows to draw (>= 1), each with its own offset.
        device: device of the returned tensor (draws always happen on the CPU generator).
    Returns: (batch, length) int64 position ids.
    Raises: ValueError if `length > max_position` (the sequence does not fit: truncate it or raise
        `max_position`), or if `length`, `batch` < 1 or `sinks` < 0.
    Reference: LongSpec §3.2, Alg. 1.
    """
    if length < 1 or batch < 1:
        raise ValueError(f"length and batch must be >= 1, got length={length}, batch={batch}")
    if sinks < 0:
        raise ValueError(f"sinks must be >= 0 (4 in the paper, 0 = no anchor), got {sinks}")
    if length > max_position:
        raise ValueError(
            f"a sequence of {length} tokens does not fit in max_position={max_position}; truncate the sequence to "
            f"at most {max_position} tokens or raise max_position (the target's max_position_embeddings)"
        )
    offsets = torch.randint(0, max_position - length + 1, (batch, 1), generator=generator)
    positions = torch.arange(length).expand(batch, length).clone()
    positions[:, sinks:] += offsets
    return positions.to(device) if device is not None else positions
