"""Flash noisy training: let the draft see the target's KV only up to j tokens back.

At inference the draft drafting position t reads the target's KV cache, which the target has filled only for
tokens it has already verified: up to t - j for some j in [1, gamma - 1] (gamma = tree depth). Training with j = 1
everywhere would teach the draft to lean on KV it will not have. Flash noisy training draws one j per step and
shifts the cross-attention globally instead of building a block mask (flash-attention compatible):

    query i sees target K/V at positions <= i - j        (the draft implements this as q[j:] x K[:-j], causal)
    queries i < j see no target K/V: their cross-attention output is 0 and they get no loss

j = 1 is plain teacher forcing on the previous token's KV (no extra noise). `LongSpecDraft.forward(noise_offset=j)`
applies the shift; this module draws j and gives the reference mask and labels the tests check it against.

Reference: LongSpec (arXiv 2502.17421) §3.2, Alg. 2 (Flash Noisy Training).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["check_noise_max", "check_noise_offsets_per_step", "check_noise_weights", "mask_noisy_labels",
           "noise_visibility_mask", "sample_noise_offset", "sample_noise_offsets"]


def sample_noise_offset(noise_max: int, generator: torch.Generator | None = None,
                        weights: Sequence[float] | None = None) -> int:
    """Draw the noise offset j from {1, ..., noise_max}: uniformly (the paper), or in proportion to `weights`.

    j is the depth of the tree level the step trains for (level d of a tree reads the target's K/V up to d tokens
    back), and every level is reached only through the ones above it, so weights that favour small j spend more of
    the training on the levels that gate τ (e.g. [0.4, 0.3, 0.2, 0.1]).

    Args:
        noise_max: the largest offset, gamma - 1 for a tree of depth gamma (4 in the paper); 1 disables noise.
        generator: CPU `torch.Generator` for reproducible draws; None uses the global RNG.
        weights: None (uniform), or `noise_max` non-negative relative probabilities of j = 1, ..., noise_max
            (any positive sum; normalised here).
    Returns: j, an int in [1, noise_max] (tokens).
    Raises: ValueError if `noise_max` < 1 (use 1 for no noise), or `weights` is not `noise_max` finite non-negative
        numbers with a positive sum.
    Reference: LongSpec §3.2, Alg. 2 (uniform j); the weights are ours.
    """
    check_noise_max(noise_max)
    if weights is None:
        return int(torch.randint(1, noise_max + 1, (1,), generator=generator).item())
    probabilities = check_noise_weights(weights, noise_max)
    return int(torch.multinomial(probabilities, 1, generator=generator).item()) + 1


def check_noise_max(noise_max) -> None:
    """Raise ValueError unless `noise_max` (the largest noise offset, tokens) is an int >= 1."""
    if isinstance(noise_max, bool) or not isinstance(noise_max, int) or noise_max < 1:
        raise ValueError(f"noise_max must be an int >= 1 (1 = no noise, 4 in the paper), got {noise_max!r}")


def sample_noise_offsets(noise_max: int, count: int, generator: torch.Generator | None = None,
                         weights: Sequence[float] | None = None) -> list[int]:
    """Draw `count` distinct noise offsets from {1, ..., noise_max}, in proportion to `weights` (None: uniform).

    Several offsets per step train several tree levels on one pass of the frozen target (`noise_offsets_per_step`):
    the target's forward, the largest part of a training step, is shared by them. `count` = 1 is one draw of
    `sample_noise_offset` (the same random stream). With count > 1 the weights only choose which offsets a step
    draws (without replacement), so their ratios matter less; with count = the number of non-zero weights, only
    which weights are zero matters.

    Args:
        noise_max: the largest offset (tokens).
        count: offsets to draw, 1 <= count <= noise_max (and at most the number of non-zero weights).
        generator: CPU `torch.Generator` for reproducible draws; None uses the global RNG.
        weights: as in `sample_noise_offset`.
    Returns: `count` distinct ints in [1, noise_max], in drawing order.
    Raises: ValueError for a count outside [1, noise_max] or above the non-zero weights, or bad `noise_max` /
        `weights` (see `sample_noise_offset`).
    Reference: LongSpec §3.2, Alg. 2 (one offset per step); several per step are ours.
    """
    count = check_noise_offsets_per_step(count, noise_max, weights)
    if count == 1:
        return [sample_noise_offset(noise_max, generator, weights)]
    probabilities = torch.ones(noise_max, dtype=torch.float64) if weights is None else check_noise_weights(
        weights, noise_max)
    return [int(j) + 1 for j in torch.multinomial(probabilities, count, replacement=False, generator=generator)]


def check_noise_offsets_per_step(count, noise_max: int, weights: Sequence[float] | None = None) -> int:
    """`count` (noise offsets trained per step, `noise_offsets_per_step`) as an int, checked against `noise_max`
    and, with `weights`, against the number of non-zero weights (the offsets a step can draw without repeats).

    Raises: ValueError naming the problem: a bad `noise_max` or `weights` (`check_noise_max`, `check_noise_weights`),
        a count that is not an int in [1, noise_max], or more offsets than non-zero weights.
    """
    check_noise_max(noise_max)
    nonzero = noise_max if weights is None else int((check_noise_weights(weights, noise_max) > 0).sum())
    if isinstance(count, bool) or not isinstance(count, numbers.Integral) or not 1 <= count <= noise_max:
        raise ValueError(f"noise_offsets_per_step must be an int in [1, noise_max={noise_max}], got {count!r}")
    if count > nonzero:
        raise ValueError(f"noise_offsets_per_step must be an int in [1, {nonzero}] (the non-zero noise_weights): "
                         f"noise_offsets_per_step={count} needs at least {count} non-zero noise_weights, got "
                         f"{list(weights)}")
    return int(count)


def check_noise_weights(weights: Sequence[float], noise_max: int) -> torch.Tensor:
    """`weights` of `sample_noise_offset` as a (noise_max,) fp64 tensor of probabilities (summing to 1).

    Args: weights: a list or tuple of real numbers (Python or numpy scalars), one per offset j = 1..noise_max.
        noise_max: the largest offset.
    Raises: ValueError naming the problem: not a list of `noise_max` real numbers (booleans included), an entry
        that is negative, infinite, NaN or too large for a float, or weights that sum to 0 (or overflow).
    """
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence):
        raise ValueError(f"noise_weights must be a list of {noise_max} numbers (relative probabilities of j = 1.."
                         f"{noise_max}), e.g. [0.4, 0.3, 0.2, 0.1]; got {weights!r}")
    if any(isinstance(w, (bool, np.bool_)) for w in weights):
        raise ValueError(f"noise_weights holds booleans {list(weights)}: give numbers, e.g. 1.0 and 0.0")
    if any(not isinstance(w, numbers.Real) for w in weights):
        raise ValueError(f"noise_weights must be a list of {noise_max} real numbers, got {list(weights)}")
    if len(weights) != noise_max:
        raise ValueError(f"noise_weights has {len(weights)} entries but noise_max is {noise_max}: give one weight per "
                         f"offset j = 1..{noise_max}")
    try:
        probabilities = torch.tensor([float(w) for w in weights], dtype=torch.float64)
    except OverflowError:
        raise ValueError(f"noise_weights {list(weights)} has an entry too large for a float: scale them down "
                         "(only their ratios matter)") from None
    if not bool(torch.isfinite(probabilities).all()):
        raise ValueError(f"noise_weights must be finite numbers, got {list(weights)}")
    if bool((probabilities < 0).any()):
        raise ValueError(f"noise_weights must be >= 0 (relative probabilities), got {list(weights)}")
    total = probabilities.sum()
    if not bool(torch.isfinite(total)) or total <= 0:
        raise ValueError(f"noise_weights must have a positive, finite sum (not all 0, not so large that the sum "
                         f"overflows; only their ratios matter), got {list(weights)}")
    return probabilities / total


def noise_visibility_mask(length: int, noise_offset: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Reference cross-attention mask of flash noisy training (the draft never materialises it).

    Args:
        length: tokens in the sequence (queries = target K/V positions).
        noise_offset: j >= 1.
        device: device of the mask.
    Returns: (length, length) bool, True where query i may attend target position k, i.e. k <= i - j.
        Rows i < j are all False.
    Raises: ValueError if `noise_offset` < 1.
    Reference: LongSpec §3.2, Alg. 2.
    """
    if noise_offset < 1:
        raise ValueError(f"noise_offset must be >= 1 (1 = no noise), got {noise_offset}")
    i = torch.arange(length, device=device)
    return (i[:, None] - i[None, :]) >= noise_offset


def mask_noisy_labels(labels: torch.LongTensor, noise_offset: int) -> torch.LongTensor:
    """Labels with the tokens that no query may predict under noise offset j set to -100.

    Position t predicts token t + 1, and positions t < j see no target KV, so tokens 0..j are unsupervised
    (token 0 is never a next-token target anyway).

    Args:
        labels: (batch, seq) int64, -100 = ignored.
        noise_offset: j >= 1.
    Returns: (batch, seq) int64, a copy.
    Raises: ValueError if `noise_offset` < 1.
    Reference: LongSpec §3.2, Alg. 2.
    """
    if noise_offset < 1:
        raise ValueError(f"noise_offset must be >= 1 (1 = no noise), got {noise_offset}")
    masked = labels.clone()
    masked[:, : noise_offset + 1] = -100
    return masked
