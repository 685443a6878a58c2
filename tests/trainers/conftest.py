"""Fixtures for the trainer tests."""

from pathlib import Path

import pytest

from trainer_helpers import make_char_tokenizer


@pytest.fixture
def char_tokenizer():
    """A 99-token character tokenizer (the tiny targets' vocabulary) with a ChatML-like chat template."""
    return make_char_tokenizer()


FILLER = "value = compute(value) + 1  # a line of ordinary code\n" * 40


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def fake_site(tmp_path):
    """A site-packages folder with allowed packages and evaluation material planted among them."""
    site = tmp_path / "site-packages"
    _write(site / "pkg_a" / "core.py", "def add(a, b):\n    return a + b\n" + FILLER)
    _write(site / "pkg_a" / "kernel.cu", "__global__ void k(float* x) { x[threadIdx.x] += 1.0f; }\n" + FILLER)
    _write(site / "pkg_b" / "include" / "b.hpp", "template <class T> T twice(T x) { return x + x; }\n" + FILLER)
    _write(site / "pkg_b" / "lib.rs", "pub fn twice(x: i32) -> i32 { x * 2 }\n" + FILLER)
    _write(site / "pkg_b" / "README.md", "# pkg_b\n\nHow to use pkg_b for doubling numbers.\n" + "Prose. " * 200)
    _write(site / "pkg_b-1.0.dist-info" / "METADATA", "Name: pkg_b\nVersion: 1.0\n\n" + "The README body. " * 100)
    _write(site / "pkg_b-1.0.dist-info" / "LICENSE", "Permission is hereby granted " * 100)
    # evaluation material, by path and by content
    _write(site / "llama_cpp" / "llama.c", "int llama_decode(void) { return 0; }\n" + FILLER)
    _write(site / "vendor" / "ggml-cuda.cu", "__global__ void ggml_k() {}\n" + FILLER)
    _write(site / "docs_pkg" / "debian-policy" / "policy.txt", "Section 1. Packages must ... " * 100)
    _write(site / "docs_pkg" / "speeches.txt", "Address on the State of the Union, 1990.\n" + "Prose. " * 300)
    return site
