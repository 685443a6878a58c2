"""tree.row_topk: the two-stage top-k of the draft's beam search equals torch.topk."""

import pytest
import torch

from transformers_longspec.tree import TOPK_CHUNK, row_topk


@pytest.mark.parametrize("width", (100, 5000, 36864 + 77))
@pytest.mark.parametrize("k", (1, 4, 16))
def test_row_topk_equals_torch_topk(width, k):
    """Distinct scores (a random permutation): the same values and the same columns as torch.topk."""
    g = torch.Generator().manual_seed(width + k)
    scores = torch.stack([torch.randperm(width, generator=g).float() for _ in range(16)]) / width
    values, index = row_topk(scores, k)
    expected_values, expected_index = scores.topk(k, dim=-1)
    assert torch.equal(values, expected_values) and torch.equal(index, expected_index)


def test_row_topk_with_padding_columns_stays_in_range():
    """A row with fewer finite scores than k (a draft vocabulary's -inf padding slots): the finite ones come first
    with their columns, and every -inf pick still names a real column (never the stage-one padding)."""
    width = 4 * TOPK_CHUNK + 5
    scores = torch.full((2, width), float("-inf"))
    scores[0, [3, width - 1]] = torch.tensor([0.5, 1.0])
    values, index = row_topk(scores, 4)
    assert index.max() < width and index.min() >= 0
    assert values[0, :2].tolist() == [1.0, 0.5] and index[0, :2].tolist() == [width - 1, 3]
    assert torch.isneginf(values[0, 2:]).all() and torch.isneginf(values[1]).all()
