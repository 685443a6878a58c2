"""Every exported name carries a docstring; every module declares `__all__`; the README names the public classes."""

import importlib
import inspect
from pathlib import Path

import pytest

import transformers_longspec

MODULES = [
    "transformers_longspec", "transformers_longspec.configuration", "transformers_longspec.modeling",
    "transformers_longspec.cache", "transformers_longspec.tree", "transformers_longspec.verification",
    "transformers_longspec.attention", "transformers_longspec.generation", "transformers_longspec.compat",
    "transformers_longspec.demo", "transformers_longspec.kernels", "transformers_longspec.trainers",
    "transformers_longspec.bench", "transformers_longspec.bench.harness", "transformers_longspec.bench.methods",
    "transformers_longspec.bench.plain_graph", "transformers_longspec.bench.prompts",
    "transformers_longspec.bench.exactness", "transformers_longspec.bench.report", "transformers_longspec.cli",
    "transformers_longspec.cli.models", "transformers_longspec.cli.generate", "transformers_longspec.cli.train",
    "transformers_longspec.cli.bench",
    "transformers_longspec.checkpoint", "transformers_longspec.hub", "transformers_longspec.model_cards",
    "transformers_longspec.vocabulary", "transformers_longspec.static_step",
]


@pytest.mark.parametrize("name", MODULES)
def test_exports_are_documented(name):
    module = importlib.import_module(name)
    assert module.__doc__, f"{name} has no module docstring"
    assert hasattr(module, "__all__"), f"{name} declares no __all__"
    for export in module.__all__:
        obj = getattr(module, export)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert inspect.getdoc(obj), f"{name}.{export} has no docstring"


def test_readme_lists_every_public_name():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    api = readme.split("## Public API", 1)[1].split("\n## ", 1)[0]
    missing = [name for name in transformers_longspec.__all__ if f"`{name}`" not in api]
    assert not missing, f"add {missing} to the README's Public API section"
