"""The fused LSE cross-entropy of the soft distillation loss against its unfused torch reference: values, the
states' gradient, repeated ids, zero weights, bf16 autocast, bad input (a trainable head, a double backward)."""

import pytest
import torch

from transformers_longspec.trainers.sparse_cross_entropy import sparse_cross_entropy, sparse_cross_entropy_reference

VOCAB, HIDDEN = 97, 16


def _case(seed: int, k: int = 5, batch: int = 2, positions: int = 7):
    generator = torch.Generator().manual_seed(seed)
    head = torch.nn.Linear(HIDDEN, VOCAB, bias=False).requires_grad_(False)  # the draft's LM head is frozen
    torch.nn.init.normal_(head.weight, std=0.5, generator=generator)
    states = torch.randn(batch, positions, HIDDEN, generator=generator)
    ids = torch.randint(0, VOCAB, (batch, positions, k), generator=generator)
    weights = torch.rand(batch, positions, k, generator=generator)
    return head, states, ids, weights


def _loss_and_grad(loss_fn, head, states, ids, weights):
    leaf = states.clone().requires_grad_()
    loss = loss_fn(head, leaf, ids, weights)
    (grad,) = torch.autograd.grad(loss, leaf)
    return loss.detach(), grad


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fused_loss_and_gradients_equal_the_reference(seed):
    head, states, ids, weights = _case(seed)
    weights[0, 3] = 0.0  # an unsupervised position
    ids[1, 2, 1] = ids[1, 2, 0]  # a repeated id: its weights add up
    fused = _loss_and_grad(sparse_cross_entropy, head, states, ids, weights)
    reference = _loss_and_grad(sparse_cross_entropy_reference, head, states, ids, weights)
    torch.testing.assert_close(fused[0], reference[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fused[1], reference[1], rtol=1e-5, atol=1e-6)
    assert fused[1][0, 3].abs().max() == 0  # weight 0: no gradient at that position
    assert fused[1].abs().sum() > 0


def test_one_hot_weights_give_the_cross_entropy_of_torch():
    head, states, ids, _ = _case(3, k=1)
    fused = sparse_cross_entropy(head, states, ids, torch.ones(ids.shape))
    expected = torch.nn.functional.cross_entropy(head(states).flatten(0, 1), ids.flatten(), reduction="sum")
    torch.testing.assert_close(fused, expected, rtol=1e-5, atol=1e-5)


def test_a_trainable_head_is_refused():
    """The backward gives the states their gradient only: a head with trainable parameters would silently get none."""
    head, states, ids, weights = _case(4)
    head.requires_grad_(True)
    with pytest.raises(ValueError, match="require grad"):
        sparse_cross_entropy(head, states.requires_grad_(), ids, weights)
    assert sparse_cross_entropy_reference(head, states, ids, weights).requires_grad  # the reference trains it


def test_backward_recomputes_under_the_forwards_autocast():
    """Under bf16 autocast the head runs in bf16 in the forward; the backward must recompute the same logits (not
    fp32 ones), so the gradient equals the reference's computed under the same autocast."""
    head, states, ids, weights = _case(5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = _loss_and_grad(sparse_cross_entropy, head, states, ids, weights)
        reference = _loss_and_grad(sparse_cross_entropy_reference, head, states, ids, weights)
    torch.testing.assert_close(fused[0], reference[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(fused[1], reference[1], rtol=2e-2, atol=2e-3)  # bf16 states gradient in both
    with torch.no_grad():
        fp32 = sparse_cross_entropy(head, states, ids, weights)
    assert not torch.equal(fused[0], fp32)  # autocast did change the logits, so the check above means something


def test_bad_input_is_refused():
    head, states, ids, weights = _case(6)
    with pytest.raises(ValueError, match="must share"):
        sparse_cross_entropy(head, states, ids[..., :3], weights)
    with pytest.raises(ValueError, match="must share"):
        sparse_cross_entropy(head, states[:, :4], ids, weights)
    with pytest.raises(ValueError, match="weights.detach"):
        sparse_cross_entropy(head, states, ids, weights.requires_grad_())


def test_second_derivative_is_refused():
    """The backward is not itself differentiable: asking for a graph of the gradient raises, so a gradient penalty or
    any double backward never gets a silently wrong value."""
    head, states, ids, weights = _case(7)
    leaf = states.clone().requires_grad_()
    with pytest.raises(RuntimeError, match="not twice differentiable"):
        torch.autograd.grad(sparse_cross_entropy(head, leaf, ids, weights), leaf, create_graph=True)
    loss = sparse_cross_entropy(head, leaf, ids, weights)
    with pytest.raises(RuntimeError, match="not twice differentiable"):
        torch.autograd.grad(loss + (leaf**2).sum(), leaf, create_graph=True)  # with another term: still refused
