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

import torch

__all__ = ["mask_noisy_labels", "noise_visibility_mask", "sample_noise_offset"]


def sample_noise_offset(noise_max: int, generator: torch.Generator | None = None) -> int:
    """Draw the noise offset j uniformly from {1, ..., noise_max}.

    Args:
        noise_max: the largest offset, gamma - 1 for a tree of depth gamma (4 in the paper); 1 disables noise.
        generator: CPU `torch.Generator` for reproducible draws; None uses the global RNG.
    Returns: j, an int in [1, noise_max] (tokens).
    Raises: ValueError if `noise_max` < 1 (use 1 for no noise).
    Reference: LongSpec §3.2, Alg. 2.
    """
    if isinstance(noise_max, bool) or not isinstance(noise_max, int) or noise_max < 1:
        raise ValueError(f"noise_max must be an int >= 1 (1 = no noise, 4 in the paper), got {noise_max!r}")
    return int(torch.randint(1, noise_max + 1, (1,), generator=generator).item())


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
