"""Fixtures for the kernel tests; plain helpers live in kernel_helpers.py."""

import pytest
import torch


@pytest.fixture
def gen() -> torch.Generator:
    """A CPU generator with a fixed seed, so every test draws the same tensors on every run."""
    return torch.Generator().manual_seed(0)
