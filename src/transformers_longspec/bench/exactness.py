"""Exactness of a greedy output against the reference: first divergence and the target's top-2 logit gap there.

Reference: LongSpec (arXiv 2502.17421) §5 lossless check; transformers `logits_to_keep`.
"""

from __future__ import annotations

import torch

__all__ = ["first_divergence", "top2_logit_gap", "top2_logits"]


def first_divergence(reference: torch.Tensor, other: torch.Tensor, prompt_len: int) -> int | None:
    """Index among the new tokens (0 = first generated) of the first difference between two outputs.

    Args:
        reference, other: (1, prompt_len + new) int64 `generate` outputs for the same prompt.
        prompt_len: prompt tokens.
    Returns: None if the outputs are identical; if one output is a strict prefix of the other (it stopped
        earlier), the index where the shorter one ends.
    """
    length = min(reference.shape[1], other.shape[1])
    diff = (reference[0, :length] != other[0, :length].to(reference.device)).nonzero()
    if diff.numel():
        return int(diff[0]) - prompt_len
    return None if reference.shape[1] == other.shape[1] else length - prompt_len


def top2_logits(target, sequence: torch.Tensor, position: int) -> tuple[float, float]:
    """Top-1 and top-2 logits of the target's next-token prediction after `sequence[:, :position]`.

    One plain forward over the prefix (the target's current attention implementation, no cache, only the last
    position's logits), so a divergence can be classified: a gap of a bf16 rounding step or two is a near-tie.

    Args:
        target: `*ForCausalLM`. sequence: (1, ≥ position) int64. position: prefix length (tokens), ≥ 1.
    Returns: (top-1, top-2) in logit units (fp32).
    Reference: LongSpec §5 lossless check; transformers `logits_to_keep`.
    """
    with torch.no_grad():
        logits = target(input_ids=sequence[:, :position], logits_to_keep=1).logits[0, -1].float()
    top = logits.topk(2).values.tolist()
    return top[0], top[1]


def top2_logit_gap(target, sequence: torch.Tensor, position: int) -> float:
    """Top-1 minus top-2 logit after `sequence[:, :position]` (see `top2_logits`)."""
    top1, top2 = top2_logits(target, sequence, position)
    return top1 - top2
