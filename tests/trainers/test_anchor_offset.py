"""Anchor-offset position ids (LongSpec Alg. 1): exact draws, boundaries, errors."""

import pytest
import torch

from transformers_longspec.trainers import anchor_offset_position_ids


def test_exact_indices_with_seeded_generator():
    pos = anchor_offset_position_ids(8, 100, sinks=4, generator=torch.Generator().manual_seed(0), batch=3)
    offsets = torch.randint(0, 100 - 8 + 1, (3, 1), generator=torch.Generator().manual_seed(0))
    assert pos.dtype == torch.int64 and pos.shape == (3, 8)
    for row, off in zip(pos, offsets[:, 0].tolist()):
        assert row.tolist() == [0, 1, 2, 3] + [p + off for p in range(4, 8)]
    assert len(set(offsets[:, 0].tolist())) > 1  # one draw per row


def test_worked_example():
    """A row is the sinks, then a contiguous run starting at sinks + offset."""
    pos = anchor_offset_position_ids(6, 32768, sinks=2, generator=torch.Generator().manual_seed(3))[0]
    offset = int(pos[2]) - 2
    assert pos.tolist() == [0, 1] + list(range(2 + offset, 6 + offset))
    assert 0 <= offset <= 32768 - 6


@pytest.mark.parametrize("seed", range(20))
def test_largest_position_fits(seed):
    pos = anchor_offset_position_ids(10, 12, sinks=4, generator=torch.Generator().manual_seed(seed), batch=4)
    assert int(pos.max()) <= 11 and (pos[:, 1:] > pos[:, :-1]).all()


def test_length_equal_to_max_position_means_no_offset():
    pos = anchor_offset_position_ids(16, 16, sinks=4, generator=torch.Generator().manual_seed(0), batch=2)
    assert torch.equal(pos, torch.arange(16).expand(2, 16))


def test_sinks_cover_the_sequence_or_zero():
    g = torch.Generator().manual_seed(0)
    assert anchor_offset_position_ids(3, 1000, sinks=4, generator=g).tolist() == [[0, 1, 2]]
    pos = anchor_offset_position_ids(5, 1000, sinks=0, generator=g)[0]
    assert pos.tolist() == list(range(int(pos[0]), int(pos[0]) + 5))  # no anchor: the whole run shifts


def test_device_argument():
    assert anchor_offset_position_ids(4, 8, device="cpu").device.type == "cpu"


def test_too_long_sequence_names_the_fix():
    with pytest.raises(ValueError, match="truncate the sequence to at most 16"):
        anchor_offset_position_ids(17, 16)


@pytest.mark.parametrize("kwargs", [{"length": 0}, {"batch": 0}, {"sinks": -1}])
def test_bad_arguments(kwargs):
    base = {"length": 4, "max_position": 8, "sinks": 4, "batch": 1}
    with pytest.raises(ValueError):
        anchor_offset_position_ids(**{**base, **kwargs})
