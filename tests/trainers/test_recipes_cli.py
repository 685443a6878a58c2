"""Recipes and the `longspec train` command, end to end on a tiny target saved as an HF folder."""

import argparse
import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from transformers_longspec import LongSpecDraft
from transformers_longspec.cli.train import add_train_parser
from transformers_longspec.trainers.recipes import build_datasets, build_training_arguments, list_recipes, load_recipe

from tiny_models import make_target
from trainer_helpers import make_char_tokenizer

TINY_RECIPE = {
    "description": "tiny CLI test",
    "draft": {"sliding_window": 16},
    "data": {"format": "packed", "source": "python_packages", "packages": ["tqdm", "not_installed_pkg"],
             "seq_length": 32, "min_chars": 200, "max_sequences": 8, "eval_sequences": 4},
    "training_arguments": {"max_steps": 2, "per_device_train_batch_size": 4, "per_device_eval_batch_size": 4,
                           "learning_rate": 1e-2, "logging_steps": 1, "save_strategy": "no", "report_to": "none",
                           "disable_tqdm": True, "bf16": True},
}


@pytest.mark.parametrize("name", list_recipes())
def test_shipped_recipes_build_training_arguments(name, tmp_path):
    recipe = load_recipe(name)
    args = build_training_arguments(recipe, str(tmp_path), use_cpu=True)
    assert args.max_steps > 0 and args.lr_scheduler_type.value == "cosine" and args.remove_unused_columns is False
    assert recipe.description and recipe.data.seq_length >= 1024
    assert not set(recipe.data.packages) & {"json", "gguf", "llama_cpp"}


def test_required_recipes_exist():
    required = {"stage1", "stage2", "stage3", "smollm2-gpu", "qwen2.5-coder-1.5b-gpu", "qwen2.5-coder-1.5b-ablation"}
    assert required <= set(list_recipes())
    assert load_recipe("qwen2.5-coder-1.5b-gpu.json").name == "qwen2.5-coder-1.5b-gpu"


def test_recipe_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="stage1"):
        load_recipe("no-such-recipe")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"training_arguments": {"learning_rat": 1.0}}))
    with pytest.raises(ValueError, match="learning_rat"):
        load_recipe(bad)
    bad.write_text(json.dumps({"data": {"format": "chat", "source": "self_distill", "sequence": 3}}))
    with pytest.raises(ValueError, match="sequence"):
        load_recipe(bad)
    bad.write_text(json.dumps({"data": {"format": "packed", "source": "self_distill"}}))
    with pytest.raises(ValueError, match="format 'chat'"):
        load_recipe(bad)


def test_build_datasets_packed_and_jsonl(tmp_path, char_tokenizer):
    recipe_path = tmp_path / "r.json"
    recipe_path.write_text(json.dumps(TINY_RECIPE))
    with pytest.warns(UserWarning, match="not_installed_pkg"):
        train, evaluation, collator = build_datasets(load_recipe(recipe_path).data, char_tokenizer)
    assert len(train) == 8 and len(evaluation) == 4
    assert collator(train[:2])["input_ids"].shape == (2, 32)
    rows = tmp_path / "chats.jsonl"
    rows.write_text(json.dumps({"input": "Q?", "context": "C.", "answers": ["A"]}) + "\n")
    recipe_path.write_text(json.dumps({"data": {"format": "chat", "source": "jsonl", "path": str(rows),
                                                "seq_length": 64}}))
    train, evaluation, collator = build_datasets(load_recipe(recipe_path).data, char_tokenizer)
    labels = collator(train)["labels"][0]
    assert char_tokenizer.decode(labels[labels != -100]) == "A</s>" and evaluation is None
    eval_dir = tmp_path / "data" / "eval"
    eval_dir.mkdir(parents=True)
    (eval_dir / "summarization.jsonl").write_text(rows.read_text())
    recipe_path.write_text(json.dumps({"data": {"format": "chat", "source": "jsonl",
                                                "path": str(eval_dir / "summarization.jsonl")}}))
    with pytest.raises(ValueError, match="evaluation material"):
        build_datasets(load_recipe(recipe_path).data, char_tokenizer)


def test_build_datasets_text_and_self_distill(tmp_path, char_tokenizer):
    recipe_path = tmp_path / "r.json"
    recipe_path.write_text(json.dumps({"data": {"format": "text", "source": "python_packages", "packages": ["tqdm"],
                                                "seq_length": 16, "min_chars": 200, "max_sequences": 3}}))
    train, _, collator = build_datasets(load_recipe(recipe_path).data, char_tokenizer)
    assert len(train) == 3 and collator(train)["input_ids"].shape == (3, 16)
    recipe_path.write_text(json.dumps({"data": {"format": "chat", "source": "self_distill", "packages": ["tqdm"],
                                                "seq_length": 600, "min_chars": 200, "num_prompts": 3,
                                                "max_new_tokens": 4, "eval_sequences": 1}}))
    spec = load_recipe(recipe_path).data
    with pytest.raises(ValueError, match="needs the target"):
        build_datasets(spec, char_tokenizer)
    train, evaluation, collator = build_datasets(spec, char_tokenizer, make_target("llama"))
    assert len(train) == 2 and len(evaluation) == 1 and train[0]["messages"][1]["role"] == "assistant"
    labels = collator(train)["labels"]
    assert ((labels != -100).sum(1) >= 1).all() and ((labels != -100).sum(1) <= 5).all()  # <= 4 tokens + </s>


def _run(argv):
    parser = argparse.ArgumentParser(prog="longspec")
    add_train_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["train", *argv])
    return args.func(args)


@pytest.mark.filterwarnings("ignore:recipe data. packages")
def test_cli_trains_continues_and_lora_adapts(tmp_path):
    target = make_target("llama")
    target.save_pretrained(tmp_path / "target")
    make_char_tokenizer().save_pretrained(tmp_path / "target")
    recipe = tmp_path / "tiny.json"
    recipe.write_text(json.dumps(TINY_RECIPE))
    common = ["--target", str(tmp_path / "target"), "--recipe", str(recipe), "--device", "cpu"]
    summary = _run([*common, "--output", str(tmp_path / "d1"), "--set", "learning_rate=0.02", "--save-dtype", "bf16",
                    "--set-data", "eval_sequences=2"])
    assert summary["steps"] == 2 and summary["eval_loss"] is not None and summary["bf16"] is False
    assert summary["data_overrides"] == {"eval_sequences": 2} and set(summary["timings_s"]) == {"load_s", "data_s"}
    assert [h["step"] for h in summary["log_history"] if "loss" in h] == [1, 2]
    assert all(t.dtype == torch.bfloat16 for t in load_file(tmp_path / "d1" / "model.safetensors").values())
    draft = LongSpecDraft.from_pretrained(tmp_path / "d1", target_model=target)
    assert draft.config.sliding_window == 16
    saved = json.loads((tmp_path / "d1" / "longspec_training.json").read_text())
    assert saved["recipe"] == "tiny" and saved["log_history"] == summary["log_history"]
    card = (tmp_path / "d1" / "README.md").read_text()  # the model card quotes the training record
    assert "Recipe `tiny`: tiny CLI test" in card and "2 steps" in card and "weights saved in bf16" in card

    assert summary["stopped_by_time_budget"] is False and summary["max_steps"] == 2
    summary = _run([*common, "--output", str(tmp_path / "d1b"), "--max-minutes", "1e-9",
                    "--set-data", "eval_sequences=0"])
    assert summary["steps"] == 1 and summary["max_steps"] == 2 and summary["stopped_by_time_budget"] is True

    summary = _run([*common, "--output", str(tmp_path / "d2"), "--draft", str(tmp_path / "d1"), "--max-steps", "1",
                    "--lora", "--lora-r", "2", "--set", "eval_strategy=steps", "--set-data", "eval_sequences=0"])
    assert summary["steps"] == 1 and (tmp_path / "d2" / "adapter" / "adapter_config.json").exists()
    assert summary["eval_loss"] is None  # no evaluation rows: evaluation switched off instead of an error
    merged = LongSpecDraft.from_pretrained(tmp_path / "d2", target_model=target)
    ids = torch.randint(3, 99, (1, 12), generator=torch.Generator().manual_seed(0))
    plain = target.generate(ids, do_sample=False, max_new_tokens=8)
    assert torch.equal(target.generate(ids, assistant_model=merged, do_sample=False, max_new_tokens=8), plain)


@pytest.mark.filterwarnings("ignore:recipe data. packages")
def test_cli_continues_a_feature_draft_with_the_recipes_feature_layers(tmp_path):
    """`--draft` + a recipe whose draft section names `target_feature_layers` the draft lacks: the layers are added
    (zero projection, `add_target_features`), trained, saved; other layers than the draft's are refused."""
    target = make_target("llama")
    target.save_pretrained(tmp_path / "target")
    make_char_tokenizer().save_pretrained(tmp_path / "target")
    LongSpecDraft.from_target(target, target_hidden_input=True, sliding_window=16).save_pretrained(tmp_path / "d0")
    recipe = tmp_path / "layers.json"
    section = {"target_hidden_input": True, "target_feature_layers": [0]}
    recipe.write_text(json.dumps({**TINY_RECIPE, "draft": section}))
    common = ["--target", str(tmp_path / "target"), "--recipe", str(recipe), "--device", "cpu", "--set-data",
              "eval_sequences=0"]
    _run([*common, "--output", str(tmp_path / "d1"), "--draft", str(tmp_path / "d0")])
    draft = LongSpecDraft.from_pretrained(tmp_path / "d1", target_model=target)
    assert draft.config.target_feature_layers == [0] and draft.block.feature_proj.weight.any()
    ids = torch.randint(3, 99, (1, 12), generator=torch.Generator().manual_seed(0))
    plain = target.generate(ids, do_sample=False, max_new_tokens=8)
    assert torch.equal(target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=8), plain)
    section = {"target_hidden_input": True, "target_feature_layers": [1]}
    recipe.write_text(json.dumps({**TINY_RECIPE, "draft": section}))
    with pytest.raises(ValueError, match=r"--draft reads target layers \[0\], the recipe asks for \[1\]"):
        _run([*common, "--output", str(tmp_path / "d2"), "--draft", str(tmp_path / "d1")])


@pytest.mark.filterwarnings("ignore:recipe data. packages")
def test_cli_widens_a_continued_draft_to_the_recipes_mlp_width(tmp_path):
    """`--draft` + a recipe whose draft section names a larger `intermediate_size`: the MLP is widened
    (`widen_mlp`, zero new down columns), trained, saved, and generation stays exact; a narrower width is refused."""
    target = make_target("llama")
    target.save_pretrained(tmp_path / "target")
    make_char_tokenizer().save_pretrained(tmp_path / "target")
    LongSpecDraft.from_target(target, sliding_window=16, intermediate_size=32).save_pretrained(tmp_path / "d0")
    recipe = tmp_path / "wide.json"
    recipe.write_text(json.dumps({**TINY_RECIPE, "draft": {"intermediate_size": 48}}))
    common = ["--target", str(tmp_path / "target"), "--recipe", str(recipe), "--device", "cpu", "--set-data",
              "eval_sequences=0", "--set", "learning_rate=0.02"]
    _run([*common, "--output", str(tmp_path / "d1"), "--draft", str(tmp_path / "d0")])
    draft = LongSpecDraft.from_pretrained(tmp_path / "d1", target_model=target)
    assert draft.config.intermediate_size == 48 and draft.block.mlp.down_proj.weight[:, 32:].any()  # trained
    ids = torch.randint(3, 99, (1, 12), generator=torch.Generator().manual_seed(0))
    plain = target.generate(ids, do_sample=False, max_new_tokens=8)
    assert torch.equal(target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=8), plain)
    recipe.write_text(json.dumps({**TINY_RECIPE, "draft": {"intermediate_size": 40}}))
    with pytest.raises(ValueError, match="--draft has an MLP 48 wide, the recipe asks for 40"):
        _run([*common, "--output", str(tmp_path / "d2"), "--draft", str(tmp_path / "d1")])


def test_cli_user_errors(tmp_path):
    with pytest.raises(ValueError, match="--lora adapts a trained draft"):
        target = make_target("llama")
        target.save_pretrained(tmp_path / "t")
        make_char_tokenizer().save_pretrained(tmp_path / "t")
        _run(["--target", str(tmp_path / "t"), "--recipe", "stage1", "--output", str(tmp_path / "o"), "--lora",
              "--device", "cpu"])
    with pytest.raises(FileNotFoundError, match="not a model folder"):
        _run(["--target", str(tmp_path / "missing"), "--recipe", "stage1", "--output", str(tmp_path / "o"),
              "--device", "cpu"])
    with pytest.raises(ValueError, match="unknown data settings \\['seq_len'\\]"):
        _run(["--target", "smollm2", "--recipe", "stage1", "--output", str(tmp_path / "o"), "--set-data", "seq_len=3"])
    with pytest.raises(ValueError, match="--max-minutes must be > 0"):
        _run(["--target", "smollm2", "--recipe", "stage1", "--output", str(tmp_path / "o"), "--max-minutes", "0"])
    with pytest.raises(ValueError, match="KEY=VALUE"):
        _run(["--target", "smollm2", "--recipe", "stage1", "--output", str(tmp_path / "o"), "--set", "oops",
              "--device", "cpu"])
    # --set names no training argument / gives a float argument text: refused before the target loads
    with pytest.raises(ValueError, match="unknown training arguments \\['no_such_arg'\\]"):
        _run(["--target", "smollm2", "--recipe", "stage1", "--output", str(tmp_path / "o"), "--set", "no_such_arg=1",
              "--device", "cpu"])
    with pytest.raises(ValueError, match="learning_rate takes a float, got 'abc'"):
        _run(["--target", "smollm2", "--recipe", "stage1", "--output", str(tmp_path / "o"), "--set",
              "learning_rate=abc", "--device", "cpu"])


@pytest.mark.filterwarnings("ignore:recipe data. packages")
def test_cli_gives_the_draft_the_most_frequent_tokens_of_its_data(tmp_path):
    """`draft.draft_vocab_size` in a recipe: the saved draft proposes from the tokens most frequent in its training
    rows (`vocabulary.py`), and decodes exactly."""
    target = make_target("qwen2")
    target.save_pretrained(tmp_path / "target")
    make_char_tokenizer().save_pretrained(tmp_path / "target")
    recipe = tmp_path / "vocab.json"
    recipe.write_text(json.dumps({**TINY_RECIPE, "draft": {"sliding_window": 16, "draft_vocab_size": 20},
                                  "data": {**TINY_RECIPE["data"], "eval_sequences": 0}}))
    _run(["--target", str(tmp_path / "target"), "--recipe", str(recipe), "--device", "cpu", "--output",
          str(tmp_path / "d"), "--max-steps", "1"])
    draft = LongSpecDraft.from_pretrained(tmp_path / "d", target_model=target)
    rows, _, _ = build_datasets(load_recipe(recipe).data, AutoTokenizer.from_pretrained(tmp_path / "target"))
    counts = torch.bincount(torch.cat([row["input_ids"] for row in rows]), minlength=99)
    assert draft.config.draft_vocab_size == 20 and counts[draft.draft_vocab].min() >= counts.sort().values[-20]
    ids = torch.randint(3, 99, (1, 12), generator=torch.Generator().manual_seed(0))
    spec = target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=8)
    assert torch.equal(spec, target.generate(ids, do_sample=False, max_new_tokens=8))
    assert draft.last_generation_stats.draft_vocab_tokens >= 20
