"""Fixtures for the trainer tests."""

import pytest

from trainer_helpers import make_char_tokenizer


@pytest.fixture
def char_tokenizer():
    """A 99-token character tokenizer (the tiny targets' vocabulary) with a ChatML-like chat template."""
    return make_char_tokenizer()
