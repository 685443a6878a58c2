"""`save_pretrained` writes a folder ready for the Hub: config with `auto_map`, safetensors, self-contained remote code
(the package's own modules, copied) and a model card; it loads with `trust_remote_code=True` without the package."""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import huggingface_hub
import pytest
import torch
from huggingface_hub import ModelCard
from safetensors.torch import load_file
from transformers import DynamicCache

import transformers_longspec
from transformers_longspec import LongSpecDraft
from transformers_longspec.demo import DEFAULT_DRAFT_DIR

from tiny_models import make_target

PACKAGE = Path(transformers_longspec.__file__).parent
REMOTE_CODE = ["configuration.py", "modeling.py", "blocks.py", "checkpoint.py"]
IDS = torch.arange(3, 23)[None]
ALLOWED_IMPORTS = {"torch", "transformers", "safetensors", "huggingface_hub", "__future__", "json", "os", "re",
                   "tempfile", "warnings", "weakref", "dataclasses", "pathlib", "importlib"}


def _saved(tmp_path, **overrides):
    target = make_target("llama")
    draft = LongSpecDraft.from_target(target, beam_widths=[2, 2], **overrides)
    draft.save_pretrained(tmp_path / "draft")
    return target, draft, tmp_path / "draft"


def test_folder_layout(tmp_path):
    _, draft, folder = _saved(tmp_path)
    assert sorted(p.name for p in folder.iterdir()) == sorted(["README.md", "config.json", "model.safetensors",
                                                               *REMOTE_CODE])
    config = json.loads((folder / "config.json").read_text())
    assert config["auto_map"] == {"AutoConfig": "configuration.LongSpecConfig", "AutoModel": "modeling.LongSpecDraft"}
    for name in REMOTE_CODE:  # one source of truth: the package modules themselves
        assert (folder / name).read_bytes() == (PACKAGE / name).read_bytes(), name
    assert set(load_file(folder / "model.safetensors")) == set(draft.state_dict())


@pytest.mark.parametrize("name", REMOTE_CODE)
def test_remote_code_imports_only_torch_and_transformers(name):
    tree = ast.parse((PACKAGE / name).read_text())
    tried = {id(n) for t in ast.walk(tree) if isinstance(t, ast.Try) for n in ast.walk(t)}  # optional imports
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            assert f"{node.module}.py" in REMOTE_CODE, f"{name} imports .{node.module}, which is not copied"
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in tried:
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            for module in modules:
                assert module.split(".")[0] in ALLOWED_IMPORTS, f"{name} imports {module}"


_WITHOUT_PACKAGE = """
import sys, torch
sys.modules["transformers_longspec"] = None          # importing the package now fails
from transformers import AutoModel, DynamicCache
from safetensors.torch import load_file
from tiny_models import make_target
folder, out = sys.argv[1], sys.argv[2]
torch.set_num_threads(1)
draft = AutoModel.from_pretrained(folder, trust_remote_code=True)
assert type(draft).__module__.startswith("transformers_modules."), type(draft).__module__
saved = load_file(folder + "/model.safetensors")
assert set(saved) == set(draft.state_dict()) and all(torch.equal(saved[k], v) for k, v in draft.state_dict().items())
target = make_target("llama")
draft.attach_target(target)                           # the documented path without the package
ids = torch.arange(3, 23)[None]
cache = DynamicCache(config=target.config)
target(ids, past_key_values=cache)
logits = draft(ids, cache.layers[-1].keys, cache.layers[-1].values, return_logits=True).logits
del sys.modules["transformers_longspec"]
import transformers_longspec                          # with the package: generate runs LongSpec on the Hub class
spec = target.generate(ids, assistant_model=draft, max_new_tokens=8, do_sample=False)
assert torch.equal(spec, target.generate(ids, max_new_tokens=8, do_sample=False))
assert draft.last_generation_stats.target_forwards >= 1
torch.save(logits, out)
"""


def test_loads_as_remote_code_without_the_package(tmp_path):
    target, draft, folder = _saved(tmp_path)
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", _WITHOUT_PACKAGE, str(folder), str(tmp_path / "logits.pt")],
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    cache = DynamicCache(config=target.config)
    target(IDS, past_key_values=cache)
    expected = draft(IDS, cache.layers[-1].keys, cache.layers[-1].values, return_logits=True).logits
    torch.testing.assert_close(torch.load(tmp_path / "logits.pt"), expected, rtol=0, atol=1e-5)


def test_model_card_quotes_target_training_and_measurements(tmp_path):
    target = make_target("llama")
    draft = LongSpecDraft.from_target(target, beam_widths=[2, 2])
    draft.config.target_name_or_path = "someone/tiny-llama"
    source = tmp_path / "trained"
    source.mkdir()
    training = {"recipe": "tiny", "recipe_description": "a tiny test recipe", "draft_init": "from_target",
                "steps": 7, "train_loss": 2.5, "eval_loss": 2.25, "train_runtime_s": 3.0, "device": "cpu"}
    (source / "longspec_training.json").write_text(json.dumps(training))
    rows = [{"dataset": "code", "prompt_tokens": 100, "identical": True, "tau": 2.5},
            {"dataset": "code", "prompt_tokens": 300, "identical": False, "tau": 1.5, "top2_gap": 0.0625}]
    (source / "longspec_eval.json").write_text(json.dumps({"meta": {"device": "CPU", "dtype": "bfloat16"},
                                                           "rows": rows}))
    draft.save_pretrained(source, repo_id="someone/tiny-draft")
    reloaded = LongSpecDraft.from_pretrained(source, target_model=target)
    reloaded.save_pretrained(tmp_path / "copy")  # the records travel with a re-saved draft
    for folder in (source, tmp_path / "copy"):
        card = ModelCard.load(folder / "README.md")
        assert card.data.base_model == "someone/tiny-llama" and "longspec" in card.data.tags
        text = card.text
        assert "Recipe `tiny`: a tiny test recipe" in text and "7 steps" in text and "eval loss 2.25" in text
        assert "| code | 2 | 100–300 | 1/2 | 2.00 (1.50–2.50) |" in text and "at most 0.0625" in text
    assert 'from_pretrained("someone/tiny-draft"' in (source / "README.md").read_text()
    assert 'from_pretrained("copy"' in (tmp_path / "copy" / "README.md").read_text()


def test_model_card_names_the_dtype_of_the_saved_weights(tmp_path):
    """A trainer saves an fp32 draft's weights in bf16 (`save_trained_draft(..., dtype=torch.bfloat16)`): the card
    names the file's dtype, not the draft's in memory."""
    target = make_target("llama")
    draft = LongSpecDraft.from_target(target, beam_widths=[2, 2])
    state = {k: v.to(torch.bfloat16) for k, v in draft.state_dict().items()}
    draft.save_pretrained(tmp_path / "bf16", state_dict=state)
    draft.save_pretrained(tmp_path / "fp32")
    assert "stored in bfloat16" in (tmp_path / "bf16" / "README.md").read_text()
    assert "stored in float32" in (tmp_path / "fp32" / "README.md").read_text()


def test_model_card_says_when_the_policy_chose_the_tree(tmp_path):
    """A record of `eval_lossless.py` without --tree (meta "tree": null) names the policy's choice, not the config's
    default tree; a record with a tree names that tree."""
    target = make_target("llama")
    draft = LongSpecDraft.from_target(target, beam_widths=[2, 2])
    rows = [{"dataset": "code", "prompt_tokens": 100, "identical": True, "tau": 2.5}]
    for name, tree in (("policy", None), ("named", [3, 3])):
        folder = tmp_path / name
        folder.mkdir()
        meta = {"device": "cpu", "dtype": "float32", "tree": tree, "retrieval": 10}
        (folder / "longspec_eval.json").write_text(json.dumps({"meta": meta, "rows": rows}))
        draft.save_pretrained(folder)
    policy, named = ((tmp_path / n / "README.md").read_text() for n in ("policy", "named"))
    assert "default-tree policy chose" in policy and "tree [2, 2]" not in policy
    assert "tree [3, 3] + a retrieval branch of 10 tokens" in named and "policy chose" not in named


def test_model_card_without_records(tmp_path):
    _, _, folder = _saved(tmp_path)
    card = ModelCard.load(folder / "README.md")
    assert card.data.base_model is None and "Hub id was not recorded" in card.text
    assert "Not recorded" in card.text and "Not measured yet" in card.text


def test_push_to_hub_uploads_the_folder_with_its_card(tmp_path, monkeypatch):
    uploads = []

    class _Repo:
        repo_id = "someone/tiny-draft"

    def upload_folder(self, repo_id, folder_path, **kwargs):
        uploads.append((repo_id, sorted(p.name for p in Path(folder_path).iterdir()),
                        (Path(folder_path) / "README.md").read_text(), kwargs["commit_message"]))
        return "https://huggingface.co/someone/tiny-draft/commit/0"

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", lambda self, repo_id, **kwargs: _Repo())
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
    target, draft, folder = _saved(tmp_path)
    assert draft.push_to_hub("tiny-draft", commit_message="first").endswith("/commit/0")
    draft.save_pretrained(tmp_path / "again", push_to_hub=True, repo_id="tiny-draft")
    for repo_id, names, card, _ in uploads:
        assert repo_id == "someone/tiny-draft" and "model.safetensors" in names and "modeling.py" in names
        assert 'from_pretrained("someone/tiny-draft"' in card
    assert [u[3] for u in uploads] == ["first", "Upload LongSpec draft"]


def test_bundled_draft_is_in_the_hub_layout(tmp_path):
    config = json.loads((DEFAULT_DRAFT_DIR / "config.json").read_text())
    assert config["auto_map"]["AutoModel"] == "modeling.LongSpecDraft"
    for name in REMOTE_CODE:  # symbolic links to the package modules in the repository, copies in a wheel
        assert (DEFAULT_DRAFT_DIR / name).read_bytes() == (PACKAGE / name).read_bytes(), name
    card = ModelCard.load(DEFAULT_DRAFT_DIR / "README.md")
    assert card.data.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert "Recipe `smollm2-mix`" in card.text and "| heldout |" in card.text
    draft = LongSpecDraft.from_pretrained(DEFAULT_DRAFT_DIR)
    regenerated = tmp_path / DEFAULT_DRAFT_DIR.name
    draft.save_pretrained(regenerated)
    assert (regenerated / "README.md").read_text() == (DEFAULT_DRAFT_DIR / "README.md").read_text(), (
        "the bundled model card is stale; refresh it (weights stay bit-identical) with: python -c 'from "
        "transformers_longspec.demo import resave_draft_folder as r, DEFAULT_DRAFT_DIR as d; r(d)'"
    )
