"""Shared pieces of the kernel tests: device selection, mask builders and the STYLE B10 error bound.

Imported by the test modules as `kernel_helpers` (pytest puts this folder on sys.path; it has no __init__.py).

The Triton kernel runs on a CUDA GPU, or on CPU tensors through Triton's interpreter. The interpreter must be chosen
before triton is imported, so nothing here sets it: CI runs `TRITON_INTERPRET=1 pytest tests/kernels`.
"""

import math
import os

import pytest
import torch

from transformers_longspec.kernels import triton_available

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
HAS_CUDA = torch.cuda.is_available()
# Under the interpreter the kernel reads CPU tensors; otherwise it needs the GPU.
KERNEL_DEVICE = "cpu" if INTERPRET or not HAS_CUDA else "cuda"

needs_kernel = pytest.mark.skipif(
    not triton_available() or not (HAS_CUDA or INTERPRET),
    reason="needs Triton and a CUDA GPU, or TRITON_INTERPRET=1 set before pytest starts "
    "(CI: TRITON_INTERPRET=1 pytest tests/kernels)",
)
needs_gpu = pytest.mark.skipif(not HAS_CUDA or INTERPRET, reason="needs a CUDA GPU (and TRITON_INTERPRET unset)")

# Absolute slack added to the B10 bound: covers rows where the low-precision reference happens to be exact
# (e.g. a single visible key), so its error says nothing about the rounding a correct kernel may add.
ATOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}

MASK_KINDS = ("all_true", "random", "tree", "empty_rows")


def tree_ancestor_mask(parents: list[int]) -> torch.Tensor:
    """(tree_size, tree_size) bool mask: node i sees itself and its ancestors; parents[0] == -1 is the root."""
    mask = torch.zeros(len(parents), len(parents), dtype=torch.bool)
    for node in range(len(parents)):
        ancestor = node
        while ancestor != -1:
            mask[node, ancestor] = True
            ancestor = parents[ancestor]
    return mask


def random_parents(tree_size: int, gen: torch.Generator) -> list[int]:
    """A random tree in topological order: node i > 0 hangs under a node j < i."""
    return [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, tree_size)]


def make_mask(kind: str, batch: int, q_len: int, kv_len: int, gen: torch.Generator) -> torch.Tensor:
    """(batch, q_len, kv_len) bool mask of one of MASK_KINDS.

    all_true: every key visible. random: ragged rows, each with its own density. tree: the last q_len keys are a
    random tree per batch element (ancestor mask), earlier keys are a fully visible prefix (needs kv_len >= q_len).
    empty_rows: random, with about a third of the rows (at least one) fully masked.
    """
    if kind == "all_true":
        return torch.ones(batch, q_len, kv_len, dtype=torch.bool)
    if kind == "tree":
        if kv_len < q_len:
            raise ValueError(f"a tree mask needs kv_len >= q_len, got {kv_len} < {q_len}")
        prefix = torch.ones(q_len, kv_len - q_len, dtype=torch.bool)
        trees = [tree_ancestor_mask(random_parents(q_len, gen)) for _ in range(batch)]
        return torch.stack([torch.cat([prefix, tree], dim=1) for tree in trees])
    density = torch.rand(batch, q_len, 1, generator=gen) * 0.9 + 0.05
    mask = torch.rand(batch, q_len, kv_len, generator=gen) < density
    if kind == "empty_rows":
        empty = torch.rand(batch, q_len, generator=gen) < 1 / 3
        empty[:, 0] = True
        mask[empty] = False
    elif kind != "random":
        raise ValueError(f"unknown mask kind {kind!r}; expected one of {MASK_KINDS}")
    return mask


def random_qkv(batch, n_heads, n_kv_heads, q_len, kv_len, head_dim, dtype, device, gen):
    """q (batch, n_heads, q_len, head_dim) and k, v (batch, n_kv_heads, kv_len, head_dim), standard normal."""
    q = torch.randn(batch, n_heads, q_len, head_dim, generator=gen)
    k = torch.randn(batch, n_kv_heads, kv_len, head_dim, generator=gen)
    v = torch.randn(batch, n_kv_heads, kv_len, head_dim, generator=gen)
    return (t.to(dtype=dtype, device=device) for t in (q, k, v))


def max_abs_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Max |x - ref| over entries where ref is finite; inf if the -inf entries (empty rows) differ or x is NaN."""
    x, ref = x.float().cpu(), ref.float().cpu()
    if not torch.equal(torch.isneginf(x), torch.isneginf(ref)):
        return math.inf
    finite = ~torch.isneginf(ref)
    if not finite.any():
        return 0.0
    err = (x[finite] - ref[finite]).abs().max().item()
    return math.inf if math.isnan(err) else err


def assert_within_ref_bound(result, ref_fp32, ref_low, dtype: torch.dtype) -> None:
    """STYLE B10: error vs the fp32 ref ≤ 2 × (error of the same ref run in `dtype`) + ATOL[dtype], for out and lse."""
    for name, got, exact, low in zip(("out", "lse"), result, ref_fp32, ref_low):
        err = max_abs_err(got, exact)
        allowed = 2 * max_abs_err(low, exact) + ATOL[dtype]
        assert err <= allowed, f"{name}: max error {err:.3g} > 2 x low-precision ref error + atol = {allowed:.3g}"
