"""A broken or foreign draft folder fails in `from_pretrained` before any weight is read, naming the problem and the
fix; loading the intact folder afterwards gives a draft whose next call equals a fresh run."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from transformers_longspec import LongSpecDraft

from tiny_models import assert_next_call_is_fresh, make_target

IDS = torch.randint(4, 99, (1, 12), generator=torch.Generator().manual_seed(0))


def _edit_tensors(folder, edit):
    tensors = load_file(folder / "model.safetensors")
    edit(tensors)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def _edit_config(folder, edit):
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))


def _truncate(folder):
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])


def _shard_index_without_shard(folder):
    (folder / "model.safetensors").unlink()
    index = {"metadata": {}, "weight_map": {"norm.weight": "model-00001-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


# name: (how the saved folder is broken, expected message)
BREAKAGES = {
    "missing safetensors": (lambda f: (f / "model.safetensors").unlink(), r"lacks \['model.safetensors'\]"),
    "truncated safetensors": (_truncate, "truncated or not a safetensors file"),
    "empty safetensors": (lambda f: (f / "model.safetensors").write_bytes(b""), "truncated or not a safetensors"),
    "shard index naming a missing shard": (_shard_index_without_shard, "lacks .*model-00001-of-00002"),
    "missing config": (lambda f: (f / "config.json").unlink(), "has no config.json"),
    "config not json": (lambda f: (f / "config.json").write_text("{not json"), "is not valid JSON"),
    "config of another model type": (lambda f: _edit_config(f, lambda c: c.update(model_type="llama")),
                                     "describes a 'llama' model, not a LongSpec draft"),
    "invalid tree in config": (lambda f: _edit_config(f, lambda c: c.update(beam_widths=[0])), "positive int width"),
    "missing tensor": (lambda f: _edit_tensors(f, lambda t: t.pop("norm.weight")), r"missing \['norm.weight'\]"),
    "unexpected tensor": (lambda f: _edit_tensors(f, lambda t: t.update({"lm_head.weight": torch.ones(99, 32)})),
                          r"unexpected \['lm_head.weight'\]"),
    "mis-shaped tensor": (lambda f: _edit_tensors(f, lambda t: t.update({"norm.weight": torch.ones(7)})),
                          r"mis-shaped \['norm.weight'\]"),
    "config sizes of another draft": (lambda f: _edit_config(f, lambda c: c.update(intermediate_size=96)),
                                      r"mis-shaped \['block.mlp.down_proj.weight'"),
    "NaN weights": (lambda f: _edit_tensors(f, lambda t: t["norm.weight"].fill_(float("nan"))),
                    r"hold NaN or inf \(\['norm.weight'\]\)"),
}


@pytest.mark.parametrize("case", sorted(BREAKAGES))
def test_broken_folder_is_refused_before_loading(case, tmp_path):
    target = make_target("llama")
    draft = LongSpecDraft.from_target(target, beam_widths=[2, 2])
    good, bad = tmp_path / "good", tmp_path / "bad"
    draft.save_pretrained(good)
    draft.save_pretrained(bad)
    breakage, message = BREAKAGES[case]
    breakage(bad)
    with pytest.raises(ValueError, match=message):
        LongSpecDraft.from_pretrained(bad, target_model=target)
    assert_next_call_is_fresh(target, LongSpecDraft.from_pretrained(good, target_model=target), IDS)


def test_target_folder_instead_of_draft_folder(tmp_path):
    target = make_target("llama")
    target.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="describes a 'llama' model.*pass the draft's folder, not the target's"):
        LongSpecDraft.from_pretrained(tmp_path, target_model=target)


@pytest.mark.parametrize("path, message", [
    ("/no/such/draft", "no folder '/no/such/draft'"),
    ("./no-such-draft", "no folder './no-such-draft'"),
    ("file", "is not a compact LongSpec draft file .* pass a draft folder"),
])
def test_path_that_is_not_a_draft_folder(path, message, tmp_path):
    if path == "file":
        path = tmp_path / "config.json"
        path.write_text("{}")
        message = f"{path} {message}"
    with pytest.raises(ValueError, match=message):
        LongSpecDraft.from_pretrained(path, target_model=make_target("llama"))
