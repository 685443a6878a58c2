"""Helpers for the trainer tests: the character tokenizer matching the tiny targets' 99-token vocabulary."""

from tiny_models import make_char_tokenizer

__all__ = ["make_char_tokenizer"]
