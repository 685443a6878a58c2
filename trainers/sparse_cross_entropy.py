"""Cross-entropy against a target distribution given on a few token ids, fused through the logits' LSE.

For one position with logits z over the vocabulary and target weights w_1..w_k on token ids i_1..i_k:

    loss  = - sum_j w_j log softmax(z)[i_j]   = (sum_j w_j) * LSE(z) - sum_j w_j z[i_j]
    dloss/dz = (sum_j w_j) * softmax(z) - scatter(w)          softmax(z) = exp(z - LSE(z))

The soft distillation loss (`soft_labels.py`: the target's top-k probabilities, plus the hard label) is this with
k + 1 ids. Written unfused (log_softmax, one gather per target, activation checkpointing) a chunk of (batch, chunk,
vocab) fp32 costs the log-probs in the forward and, in the backward, the logits recomputed, the log-probs again, a
zero-filled tensor of that size per gather and the log_softmax gradient. Here the forward computes one LSE per
position in place on the logits, and the backward recomputes the logits once and turns them into their own gradient
in place (subtract, exp, scale, scatter-add): one vocabulary-wide tensor per chunk and pass, nothing zero-filled.
On a CPU the zero fills alone were a third of a SmolLM2 draft's training step (benchmarks/NOTES.md, session 17).

Reference: the LSE form of softmax cross-entropy (as fused "cut" / "liger" cross-entropy kernels use it); knowledge
distillation (Hinton et al., 2015); LongSpec (arXiv 2502.17421) §3.2 (the draft's next-token loss).
"""

from __future__ import annotations

import torch

__all__ = ["sparse_cross_entropy", "sparse_cross_entropy_reference"]


def sparse_cross_entropy(lm_logits, states: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Summed cross-entropy of the logits `lm_logits(states)` against the weights `weights` on the tokens `ids`.

    Exactly `sparse_cross_entropy_reference` (to fp32 rounding) for a frozen, deterministic head, with the logits
    recomputed in the backward instead of kept (the memory of activation checkpointing without its extra passes).

    Args:
        lm_logits: callable, states (..., hidden) -> logits (..., vocab), any float dtype (taken to fp32). It must
            be frozen (no parameter requiring grad: the draft's LM head is the target's) and deterministic (no
            dropout: it runs again in the backward, under the autocast state of the forward), and return a new
            tensor that no autograd node keeps (a linear layer's output; it is overwritten in place).
        states: (batch, positions, hidden) float; the gradient flows back to it alone.
        ids: (batch, positions, k) int64 token ids in [0, vocab); repeated ids add up.
        weights: (batch, positions, k) float, no gradient; 0 leaves an id (or a whole position) out.
    Returns: () fp32, sum over positions of (sum_j w_j) * LSE(z) - sum_j w_j z[ids_j]; it requires grad when
        `states` does. Not twice differentiable (a double backward raises).
    Raises: ValueError if `ids` and `weights` differ in shape or do not share (batch, positions) with `states`, if
        `weights` requires grad (the targets are constants), or if `lm_logits` has a parameter that requires grad
        (use `sparse_cross_entropy_reference` to train a head). torch's gather raises for ids outside [0, vocab).
    Reference: module docstring.
    """
    if ids.shape != weights.shape or ids.shape[:-1] != states.shape[:-1]:
        raise ValueError(f"states {tuple(states.shape)}, ids {tuple(ids.shape)} and weights {tuple(weights.shape)} "
                         "must share (batch, positions), and ids / weights their k")
    if weights.requires_grad:
        raise ValueError("sparse_cross_entropy: weights are constant targets; pass weights.detach()")
    return _SparseCrossEntropy.apply(states, ids, weights.float(), lm_logits)


def sparse_cross_entropy_reference(lm_logits, states: torch.Tensor, ids: torch.Tensor,
                                   weights: torch.Tensor) -> torch.Tensor:
    """The unfused torch form of `sparse_cross_entropy`: -sum(weights * log_softmax(z).gather(ids)). Same
    arguments and result; it keeps the (batch, positions, vocab) log-probs for the backward."""
    log_q = torch.log_softmax(lm_logits(states).float(), dim=-1)
    return -(weights.float() * log_q.gather(-1, ids)).sum()


class _SparseCrossEntropy(torch.autograd.Function):
    """Forward: the loss and one LSE per position; backward: the logits recomputed and made their gradient."""

    @staticmethod
    def forward(ctx, states, ids, weights, lm_logits):
        device = states.device.type
        ctx.lm_logits = lm_logits
        ctx.autocast = (device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
        with torch.enable_grad():  # only to see whether the head has trainable parameters (it must not)
            logits = lm_logits(states.detach())
        if logits.requires_grad:
            raise ValueError("sparse_cross_entropy: lm_logits has parameters that require grad; it gives the states "
                             "their gradient only. Freeze the head (requires_grad_(False)) or train it with "
                             "sparse_cross_entropy_reference")
        logits = logits.float()
        picked = logits.gather(-1, ids)
        top = logits.amax(-1, keepdim=True)  # LSE in place: the logits are not needed after it
        lse = logits.sub_(top).exp_().sum(-1).log_().add_(top[..., 0])
        loss = (weights.sum(-1) * lse).sum() - (weights * picked).sum()
        ctx.save_for_backward(states, ids, weights, lse)
        return loss

    @staticmethod
    def backward(ctx, grad):
        if torch.is_grad_enabled():  # create_graph=True: the gradient below would be cut off from the graph
            raise RuntimeError("sparse_cross_entropy is not twice differentiable (a backward with create_graph=True); "
                               "use sparse_cross_entropy_reference for higher derivatives")
        states, ids, weights, lse = ctx.saved_tensors
        device, autocast, autocast_dtype = ctx.autocast
        with torch.enable_grad(), torch.autocast(device, dtype=autocast_dtype, enabled=autocast):
            leaf = states.detach().requires_grad_()
            logits = ctx.lm_logits(leaf).float()
        with torch.no_grad():  # the logits become their own gradient; no autograd node saved them
            gradient = logits.detach()
            gradient.sub_(lse[..., None]).exp_().mul_(weights.sum(-1, keepdim=True) * grad)
            gradient.scatter_add_(-1, ids, weights * -grad)
        (states_grad,) = torch.autograd.grad(logits, leaf, gradient)
        return states_grad, None, None, None
