"""Tests for kernels/beam_select.py: the kernels pick the ref's children, in its order, ties included."""

import numpy as np
import pytest
import torch

from transformers_longspec import LongSpecDraft, tree
from transformers_longspec import generation as generation_module
from transformers_longspec.kernels import beam_select, beam_select_ref

from kernel_helpers import KERNEL_DEVICE, needs_gpu, needs_kernel
from tiny_models import make_target

NEG_INF = float("-inf")


def _level(n, vocab, dtype, gen, bias_kind=None):
    """Random logits (n, V) of `dtype`, parent scores (n,) fp32 and an optional (V,) bias."""
    logits = (torch.randn(n, vocab, generator=gen) * 4).to(dtype)
    parents = -torch.rand(n, generator=gen) * 5
    bias = None
    if bias_kind == "padding":  # a draft vocabulary: the last slots are padding
        bias = torch.zeros(vocab)
        bias[vocab - vocab // 3 :] = NEG_INF
    elif bias_kind == "random":
        bias = torch.randn(vocab, generator=gen)
    return logits, parents, bias


def _assert_same_choice(got, want, rtol=1e-5):
    scores, rows, cols = got
    ref_scores, ref_rows, ref_cols = want
    assert scores.dtype == torch.float32 and rows.dtype == cols.dtype == torch.int64
    assert torch.equal(rows.cpu(), ref_rows) and torch.equal(cols.cpu(), ref_cols)
    torch.testing.assert_close(scores.cpu(), ref_scores, rtol=rtol, atol=1e-5)


@needs_kernel
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16, torch.float16), ids=str)
@pytest.mark.parametrize("n,vocab,width", ((1, 50, 4), (4, 1024, 16), (16, 3000, 16), (17, 5000, 7), (3, 40_000, 1)))
@pytest.mark.parametrize("bias_kind", (None, "padding", "random"))
def test_kernel_matches_ref(dtype, n, vocab, width, bias_kind, gen):
    logits, parents, bias = _level(n, vocab, dtype, gen, bias_kind)
    want = beam_select_ref(logits, parents, width, bias)
    dev = [t if t is None else t.to(KERNEL_DEVICE) for t in (logits, parents, bias)]
    _assert_same_choice(beam_select(dev[0], dev[1], width, dev[2], kernel=True), want)


@needs_kernel
def test_kernel_ties_go_to_the_smaller_row_then_column(gen):
    """Equal scores: identical rows with equal parents, and repeated logits inside a row."""
    row = torch.randn(300, generator=gen)
    row[[7, 90, 250]] = 9.0  # a three-way tie for the row's best
    logits = torch.stack([row, row, row * 0.5])
    parents = torch.tensor([-1.0, -1.0, -30.0])
    want = beam_select_ref(logits, parents, 8)
    assert want[1][:6].tolist() == [0, 0, 0, 1, 1, 1] and want[2][:3].tolist() == [7, 90, 250]
    got = beam_select(logits.to(KERNEL_DEVICE), parents.to(KERNEL_DEVICE), 8, kernel=True)
    _assert_same_choice(got, want)


@needs_kernel
def test_kernel_with_fewer_finite_scores_than_width(gen):
    """A vocabulary of 3 tokens and padding: the 4th to 6th children are padding slots (score -inf), distinct."""
    logits = torch.randn(2, 10, generator=gen)
    bias = torch.full((10,), NEG_INF)
    bias[:3] = 0.0
    parents = torch.tensor([0.0, NEG_INF])  # the second row's node is itself dead
    scores, rows, cols = beam_select(
        logits.to(KERNEL_DEVICE), parents.to(KERNEL_DEVICE), 6, bias.to(KERNEL_DEVICE), kernel=True
    )
    assert torch.isfinite(scores[:3]).all() and torch.isneginf(scores[3:]).all()
    assert rows[:3].tolist() == [0, 0, 0] and sorted(cols[:3].tolist()) == [0, 1, 2]
    assert len({(r, c) for r, c in zip(rows.tolist(), cols.tolist())}) == 6  # no pair twice
    assert not scores.isnan().any()


@pytest.mark.parametrize("n,vocab,width", ((1, 50, 4), (16, 3000, 16), (5, 7, 3)))
def test_torch_path_picks_the_refs_set(n, vocab, width, gen):
    logits, parents, bias = _level(n, vocab, torch.float32, gen, "padding")
    _assert_same_set(
        beam_select(logits, parents, width, bias, kernel=False), beam_select_ref(logits, parents, width, bias)
    )


def _assert_same_set(got, want):
    """The same scores in order and the same (row, column) pairs (the torch path's tie order is torch.topk's)."""
    torch.testing.assert_close(got[0], want[0])
    assert set(zip(got[1].tolist(), got[2].tolist())) == set(zip(want[1].tolist(), want[2].tolist()))


def test_ref_is_the_top_of_all_scores(gen):
    logits, parents, _ = _level(3, 20, torch.float32, gen)
    scores, rows, cols = beam_select_ref(logits, parents, 5)
    every = parents[:, None] + torch.log_softmax(logits, dim=-1)
    assert torch.equal(scores, every[rows, cols]) and torch.equal(scores, every.flatten().sort(descending=True)[0][:5])


@pytest.mark.parametrize(
    "args,match",
    (
        ((torch.zeros(2, 5), torch.zeros(3), 2), "parent_scores"),
        ((torch.zeros(2, 5), torch.zeros(2), 0), "width"),
        ((torch.zeros(2, 5), torch.zeros(2), True), "width"),
        ((torch.zeros(1, 3), torch.zeros(1), 4), "fewer than width"),
        ((torch.zeros(5), torch.zeros(5), 2), "logits"),
        ((torch.zeros(2, 5, dtype=torch.int64), torch.zeros(2), 2), "logits"),
        ((torch.zeros(2, 5), torch.zeros(2, dtype=torch.float64), 2), "parent_scores"),
    ),
)
def test_bad_input_is_named(args, match):
    for select in (beam_select, beam_select_ref):
        with pytest.raises(ValueError, match=match):
            select(*args)


def test_bad_bias_and_kernel_values_are_named():
    with pytest.raises(ValueError, match="bias"):
        beam_select(torch.zeros(2, 5), torch.zeros(2), 2, torch.zeros(4))
    with pytest.raises(ValueError, match=r"\(5,\) float32, got \(5,\) torch.float64"):
        beam_select(torch.zeros(2, 5), torch.zeros(2), 2, torch.zeros(5, dtype=torch.float64))
    with pytest.raises(ValueError, match="`kernel` must be True, False or None"):
        beam_select(torch.zeros(2, 5), torch.zeros(2), 2, kernel="yes")


def test_numpy_widths_and_levels_wider_than_the_kernels_take_the_torch_path(gen):
    """A width of 100 (beyond the kernels' 64) works on the default path, as it did before the kernels; forcing the
    kernels names the limit and the fix. numpy integers count as ints."""
    logits, parents, _ = _level(3, 200, torch.float32, gen)
    want = beam_select_ref(logits, parents, 100)
    _assert_same_set(beam_select(logits, parents, 100), want)
    _assert_same_set(beam_select(logits, parents, np.int64(7)), beam_select_ref(logits, parents, 7))
    with pytest.raises(ValueError, match="width ≤ 64.*kernel=False"):
        beam_select(logits, parents, 100, kernel=True)


@needs_kernel
def test_kernel_reads_strided_parent_scores_and_bias(gen):
    """Views with a stride (every other element) give the same choice as their contiguous copies."""
    logits, _, _ = _level(4, 1000, torch.float32, gen)
    parents = (-torch.rand(8, generator=gen) * 5)[::2]
    bias = torch.randn(2000, generator=gen)[::2]
    want = beam_select_ref(logits, parents.contiguous(), 8, bias.contiguous())
    dev = [t.to(KERNEL_DEVICE) for t in (logits, parents, bias)]
    assert not dev[1].is_contiguous() or KERNEL_DEVICE == "cuda"
    _assert_same_choice(beam_select(dev[0], dev[1], 8, dev[2], kernel=True), want)


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("n,width", ((1, 4), (4, 16), (16, 16)))
@pytest.mark.parametrize("vocab", (36_864, 151_936))
def test_kernel_matches_ref_at_draft_shapes(n, width, vocab, gen):
    logits, parents, bias = _level(n, vocab, torch.bfloat16, gen, "padding" if vocab < 100_000 else None)
    want = beam_select_ref(logits, parents, width, bias)
    cuda = [t if t is None else t.cuda() for t in (logits, parents, bias)]
    _assert_same_choice(beam_select(*cuda[:2], width, cuda[2]), want)
    graph, static = torch.cuda.CUDAGraph(), None
    beam_select(*cuda[:2], width, cuda[2])  # warm up (compiles) before capture
    with torch.cuda.graph(graph):
        static = beam_select(*cuda[:2], width, cuda[2])
    graph.replay()
    _assert_same_choice(static, want)


@needs_kernel
@pytest.mark.parametrize("draft_vocab", (False, True), ids=["whole_vocab", "draft_vocab"])
def test_trees_grown_with_the_kernels_equal_the_torch_paths(draft_vocab, monkeypatch):
    """The same draft trees (tokens, parents) and the same greedy output, with the vocabulary's slots mapped to ids."""
    target = make_target("qwen2").to(KERNEL_DEVICE)
    draft = LongSpecDraft.from_target(target, beam_widths=[3, 6, 6]).to(KERNEL_DEVICE)
    if draft_vocab:
        draft.set_draft_vocabulary(torch.arange(40, 90))
    ids = torch.randint(3, 99, (1, 40), generator=torch.Generator().manual_seed(5)).to(KERNEL_DEVICE)
    grow, select, runs = generation_module.grow_tree, tree.beam_select, {}

    def recording(*args, **kwargs):
        trees.append(grow(*args, **kwargs))
        return trees[-1]

    for kernel in (False, True):
        trees = runs[kernel] = []
        monkeypatch.setattr(tree, "beam_select", lambda *a, kernel=kernel, **k: select(*a, kernel=kernel, **k))
        monkeypatch.setattr(generation_module, "grow_tree", recording)
        out = target.generate(
            ids,
            assistant_model=draft,
            do_sample=False,
            max_new_tokens=12,
            longspec_retrieval=0,
            longspec_beam_widths=[3, 6, 6],
            longspec_static_shapes=False,
        )
        trees.append(out)
    assert len(runs[True]) == len(runs[False]) > 2
    assert torch.equal(runs[True].pop(), runs[False].pop())  # the outputs
    for got, want in zip(runs[True], runs[False]):
        assert torch.equal(got.tokens, want.tokens) and torch.equal(got.parents, want.parents)
        torch.testing.assert_close(got.scores, want.scores)
