"""The benchmark harness runs end to end on tiny targets and its rows are real; a corrupted method is caught."""

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
import torch

from transformers_longspec import LongSpecDraft
from transformers_longspec.bench import BenchConfig, BenchModels, Prompt, parse_variant, run_bench
from transformers_longspec.bench import report as bench_report
from transformers_longspec.bench.report import aggregate, format_table, method_colours, plot_report
from transformers_longspec.cli import main

from tiny_models import make_target

TESTS = Path(__file__).resolve().parent
NEW = 12


def _load(path: Path):
    """Import a script or helper by path (benchmarks/ and tests/trainers/ are not packages)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # dataclasses look their module up while the class is created
    spec.loader.exec_module(module)
    return module


def _prompts(target):
    g = torch.Generator().manual_seed(0)
    return [Prompt(f"p{i}", "random", bucket, torch.randint(3, 99, (1, n), generator=g))
            for i, (bucket, n) in enumerate([(64, 50), (256, 200)])]


def test_rows_are_real_and_a_corrupted_method_is_counted():
    target = make_target("llama")
    draft = LongSpecDraft.from_target(target, beam_widths=[2, 2])
    prompts = _prompts(target)
    plain = [target.generate(p.ids, do_sample=False, max_new_tokens=NEW) for p in prompts]
    banned = [[int(out[0, p.ids.shape[1]])] for out, p in zip(plain, prompts)]  # each prompt's first greedy token
    name, bad = parse_variant(f"bad=sdpa:{json.dumps({'bad_words_ids': banned})}")
    config = BenchConfig(methods=("longspec", "sdpa", "prompt_lookup", "assisted", "bad", "longspec_sample"),
                         temperatures=(0.7,), max_new_tokens=NEW, variants={name: bad})
    models = BenchModels(target, draft=draft, assistant=make_target("llama", seed=1))
    rows, notes = run_bench(models, prompts, config)
    assert notes == []
    assert [r.method for r in rows[:6]] == ["sdpa", "longspec", "prompt_lookup", "assisted", "bad",
                                            "longspec_sample@0.7"]
    by = {(r.method, r.prompt_id): r for r in rows}
    for p, out in zip(prompts, plain):
        ref = by["sdpa", p.id]
        assert ref.new_tokens == out.shape[1] - p.ids.shape[1] and ref.decode_tok_s > 0 and ref.prefill_s > 0
        assert ref.tau == 1.0 and ref.target_forwards == ref.new_tokens and ref.identical is None
        for exact in ("longspec", "prompt_lookup", "assisted"):
            row = by[exact, p.id]
            assert row.identical is True and row.new_tokens == ref.new_tokens and row.error is None, row
        spec = by["longspec", p.id]
        assert spec.tau >= 1 and spec.steps >= 1 and spec.draft_s_per_step > 0 and spec.verify_s_per_step > 0
        assert spec.longspec_decode_tok_s > 0 and spec.peak_memory_bytes is None  # CPU: no CUDA memory
        assert spec.tree == [2, 2]
        corrupted = by["bad", p.id]
        assert corrupted.identical is False and corrupted.first_divergence == 0
        assert corrupted.divergence_tokens[0] == banned[prompts.index(p)][0] and corrupted.top2_gap >= 0
        sampled = by["longspec_sample@0.7", p.id]
        assert sampled.temperature == 0.7 and sampled.identical is None and sampled.tau >= 1
    table = {(a["method"], a["bucket"]): a for a in aggregate(rows)}
    assert table["bad", "all"]["mismatches"] == 2 and table["longspec", "all"]["mismatches"] == 0
    assert set(table["longspec", 64]["speedup_over"]) == {"sdpa", "prompt_lookup", "assisted"}
    assert "| bad | all | 2 |" in format_table(aggregate(rows))


def test_missing_models_skip_with_a_note_and_bad_names_are_refused():
    target = make_target("llama")
    rows, notes = run_bench(BenchModels(target), _prompts(target)[:1],
                            BenchConfig(methods=("sdpa", "assisted", "longspec"), max_new_tokens=4, warmup=False))
    assert [r.method for r in rows] == ["sdpa"] and len(notes) == 2 and "--assistant" in notes[0]
    with pytest.raises(ValueError, match="unknown method"):
        run_bench(BenchModels(target), [], BenchConfig(methods=("nope",)))
    for spec, message in [("x", "NAME=BASE:JSON"), ("x=nope:{}", "unknown base"), ("x=sdpa:[1]", "object"),
                          ("x=sdpa:{oops", "not JSON")]:
        with pytest.raises(ValueError, match=message):
            parse_variant(spec)
    assert parse_variant('e=longspec:{"attn_implementation": "eager"}')[1].attn_implementation == "eager"


@pytest.fixture
def saved_target(tmp_path):
    """A tiny target saved with a character tokenizer, and a data folder of short LongBench-style rows."""
    tokenizer = _load(TESTS / "trainers" / "trainer_helpers.py").make_char_tokenizer()
    make_target("llama").save_pretrained(tmp_path / "target")
    tokenizer.save_pretrained(tmp_path / "target")
    data = tmp_path / "data"
    data.mkdir()
    code = "def add(a, b):\n    return a + b\n\n" * 4
    rows = {"code_completion": [{"_id": f"c{i}", "dataset": "pyrepo-code", "input": "Continue.", "bucket": b,
                                 "context": code * (1 + i)} for i, b in enumerate([2048, 2048, 4096])],
            "summarization": [{"_id": "s0", "dataset": "sotu-summ", "input": "Summarise.", "bucket": 2048,
                               "context": "The state of the union is strong. " * 6}]}
    for name, items in rows.items():
        (data / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in items))
    return tmp_path


def test_cli_end_to_end(saved_target, capsys):
    out = saved_target / "out"
    status = main(["bench", "--target", str(saved_target / "target"),
                   "--methods", "sdpa,static_compile,plain_graph,longspec",
                   "--datasets", "code_completion,summarization", "--buckets", "2048", "--per-bucket", "1",
                   "--max-new-tokens", "6", "--dtype", "fp32", "--device", "cpu",
                   "--data-dir", str(saved_target / "data"), "--out", str(out)])
    assert status == 0
    report = json.loads((out / "bench.json").read_text())
    assert [r["prompt_id"] for r in report["rows"]] == ["c0"] * 4 + ["s0"] * 4  # shortest prompt first
    assert len((out / "rows.jsonl").read_text().splitlines()) == 8
    assert all(r["new_tokens"] and r["error"] is None for r in report["rows"])
    warmed = [r for r in report["rows"] if r["method"] in ("static_compile", "plain_graph", "longspec")]
    assert len(warmed) == 6 and all(r["compile_s"] > 0 and r["identical"] is not None for r in warmed)  # untimed first
    assert all(r["identical"] and r["tau"] == 1.0 for r in warmed if r["method"] == "plain_graph")
    assert report["meta"]["args"]["max_new_tokens"] == 6 and "T(N) - T(1)" in report["meta"]["decode_clock"]
    assert (out / "decode_tok_s.png").stat().st_size > 0 and (out / "tau.png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert "| longspec | all |" in printed and "per LongSpec step:" in printed
    rows = {(r["method"], r["prompt_id"]): r for r in report["rows"]}

    def predicted(prompt_id):  # tau x (plain loop's ms per token) / (LongSpec's ms per step)
        spec, plain = rows["longspec", prompt_id], rows["plain_graph", prompt_id]
        step_ms = 1e3 * (spec["draft_s_per_step"] + spec["verify_s_per_step"] + spec["other_s_per_step"])
        return spec["tau"] * (1e3 / plain["decode_tok_s"]) / step_ms

    steps = {a["method"]: a["step"] for a in report["aggregates"] if a["bucket"] == 2048}
    assert steps["sdpa"] is None and steps["plain_graph"] is None and steps["static_compile"] is None
    s = steps["longspec"]  # bucket 2048 holds c0 and s0 (a median of two is their mean); a 1-token run has no clock
    timed = [predicted(p) for p in ("c0", "s0") if rows["plain_graph", p]["decode_tok_s"]]
    assert timed and s["draft_ms"] > 0 and s["verify_ms"] > 0 and s["other_ms"] is not None and s["plain_token_ms"] > 0
    assert s["predicted_ratio"] == pytest.approx(sum(timed) / len(timed))
    assert s["measured_ratio"] == pytest.approx([a for a in report["aggregates"] if a["method"] == "longspec"
                                                 and a["bucket"] == 2048][0]["speedup_over"]["plain_graph"])
    (out / "tau.png").unlink()
    assert bench_report.main([str(out)]) == 0 and (out / "tau.png").exists()  # rebuilds a (cut-short) report


@pytest.mark.parametrize("argv, message", [
    (["--methods", "sdpa,nope"], "unknown ['nope']"),
    (["--buckets", "8k"], "--buckets takes comma-separated int"),
    (["--temperatures", "0"], "must be > 0"),
    (["--per-bucket", "0"], "--per-bucket must be >= 1"),
    (["--variant", "broken"], "NAME=BASE:JSON"),
    (["--datasets", "nosuch"], "nosuch.jsonl not found"),
    (["--target", "/no/such/model"], "not a model folder"),
    (["--device", "gpu0"], "--device takes cpu, cuda or cuda:N"),
])
def test_cli_user_errors_print_one_line(saved_target, capsys, argv, message):
    base = {"--target": str(saved_target / "target"), "--data-dir": str(saved_target / "data"),
            "--out": str(saved_target / "o"), "--datasets": "code_completion", "--device": "cpu"}
    base.update(dict(zip(argv[::2], argv[1::2])))
    assert main(["bench", *[x for kv in base.items() for x in kv]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("longspec bench: error:") and message in err[0], err


def test_cli_help_and_unknown_flag(capsys):
    with pytest.raises(SystemExit) as done:
        main(["bench", "--help"])
    assert done.value.code == 0 and "--temperatures" in capsys.readouterr().out
    with pytest.raises(SystemExit) as done:
        main(["bench", "--target", "x", "--out", "y", "--no-such-flag"])
    assert done.value.code == 2


def test_micro_attention_smoke(tmp_path):
    micro = _load(TESTS.parent / "benchmarks" / "micro_attention.py")
    report = micro.main(["--tiny", "--out", str(tmp_path)])
    assert len(report["attention"]) == 4 and json.loads((tmp_path / "micro_attention.json").read_text())
    for row in report["attention"]:
        assert row["err_hybrid"] < 1e-5 and row["err_eager_mask"] < 1e-5 and row["err_flash_nomask"] < 1e-5
        assert row["hybrid_us"] > 0 and row["eager_mask_us"] > 0 and row["flash_nomask_us"] > 0
    step = report["step"]
    assert step["tree"] == 5 and step["verify_us"] > 0 and step["decode_static_us"] > 0


def test_tau_matrix_takes_named_configurations_and_tree_shapes():
    module = _load(TESTS.parent / "benchmarks" / "tau_matrix.py")
    assert module.config_kwargs("tree:8-16-16+10") == {"longspec_beam_widths": [8, 16, 16], "longspec_retrieval": 10}
    assert module.config_kwargs("tree:2") == {"longspec_beam_widths": [2], "longspec_retrieval": 0}
    assert module.config_kwargs("tree:16-16@20+10") == {"longspec_beam_widths": [16, 16], "longspec_retrieval": 10,
                                                          "longspec_tree_nodes": 20}
    assert module.config_kwargs("chain") == module.CONFIGS["chain"]
    for bad in ("tree:", "wide", "tree:8-"):
        with pytest.raises(ValueError, match="tree:W1-W2"):
            module.config_kwargs(bad)
    with pytest.raises(ValueError, match="commas separate configurations"):
        module.config_kwargs("16")  # what is left of "tree:8,16" after the split


@pytest.mark.parametrize("argv,message", [
    (["--configs", "tree:8,16"], "commas separate configurations"),
    (["--data-dir", "no-such-folder"], "code_completion.jsonl not found"),
])
def test_tau_matrix_refuses_bad_arguments_before_loading_a_model(monkeypatch, capsys, argv, message):
    module = _load(TESTS.parent / "benchmarks" / "tau_matrix.py")
    # a target that cannot load: the refusal must come first
    monkeypatch.setattr(sys, "argv", ["tau_matrix.py", "--target", "no-such-model", "--out", "x.json", *argv])
    with pytest.raises(SystemExit) as done:
        module.main()
    assert done.value.code == 2 and message in capsys.readouterr().err


def _replayed_chain(module, target, draft, ids, new_tokens, retrieval=0):
    """(the chain steps accept_matrix.py replays on the plain greedy text, the steps `generate` records)."""
    plain = target.generate(ids, do_sample=False, max_new_tokens=new_tokens)
    depth, prompt_len = 6, ids.shape[1]
    passed = module.target_pass(target, plain, draft.config.target_feature_layers)
    choices = module.level_choices(draft, plain, prompt_len, depth, 4, passed)
    replayed = module.decode_steps(plain, prompt_len, module.chain_accepted(choices, plain, prompt_len), retrieval)
    spec = target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=new_tokens,
                           longspec_beam_widths=[1] * depth, longspec_retrieval=retrieval)
    assert torch.equal(spec, plain)
    return replayed, draft.last_generation_stats.accepted_lengths


def test_accept_matrix_replays_chain_decoding_with_feature_layers_and_a_draft_vocabulary():
    module = _load(TESTS.parent / "benchmarks" / "accept_matrix.py")
    target = make_target("llama")
    draft = LongSpecDraft.from_target(target, target_hidden_input=True, target_feature_layers=[0], sliding_window=8)
    draft.set_draft_vocabulary(torch.arange(3, 60))
    ids = torch.randint(3, 99, (1, 30), generator=torch.Generator().manual_seed(0))
    replayed, real = _replayed_chain(module, target, draft, ids, 40)
    # the last step may accept past max_new_tokens in `generate` (then cut); the text here ends there
    assert len(replayed) == len(real) and replayed[:-1] == real[:-1] and max(real) >= 2


@pytest.mark.parametrize("retrieval", [0, 10])
def test_accept_matrix_replays_chain_decoding_on_real_smollm2(smollm2, eval_rows, retrieval):
    """Teacher forcing on the plain greedy text gives the accepted lengths of a real chain decode, step by step."""
    from transformers_longspec.demo import DEFAULT_DRAFT_DIR, eval_prompt

    module = _load(TESTS.parent / "benchmarks" / "accept_matrix.py")
    target, tokenizer = smollm2
    draft = LongSpecDraft.from_pretrained(DEFAULT_DRAFT_DIR, target_model=target)
    deepest = 0
    for name in ("summarization", "code_completion"):
        ids = eval_prompt(eval_rows(name, 1)[0], tokenizer, 384)
        replayed, real = _replayed_chain(module, target, draft, ids, 48, retrieval)
        assert len(replayed) == len(real) and replayed[:-1] == real[:-1]
        deepest = max(deepest, *real[:-1])
    assert deepest >= (7 if retrieval else 3)  # deep runs happened, so the levels' offsets were checked


@pytest.mark.parametrize("argv,message", [
    (["--drafts", "no-such-draft.safetensors"], "draft not found: ['no-such-draft.safetensors']"),
    (["--drafts", "{draft}", "--data-dir", "no-such-folder"], "code_completion.jsonl not found"),
    (["--drafts", "{draft}", "--depth", "0"], "--depth and --width must be >= 1"),
    (["--drafts", "{draft}", "--retrieval", "-1"], "longspec_retrieval must be an int in [0, 64]"),
    (["--drafts", "{draft}", "--buckets", "8k"], "--buckets takes comma-separated token counts"),
    (["--drafts", "{draft}", "--datasets", "summarization:abc"], "prompts per bucket must be a positive number"),
    (["--drafts", "{draft}", "--per-bucket", "0"], "prompts per bucket must be a positive number"),
])
def test_accept_matrix_refuses_bad_arguments_before_loading_a_model(monkeypatch, capsys, tmp_path, argv, message):
    module = _load(TESTS.parent / "benchmarks" / "accept_matrix.py")
    draft = tmp_path / "draft.safetensors"
    draft.write_bytes(b"")
    argv = [a.format(draft=draft) for a in argv]
    monkeypatch.setattr(sys, "argv", ["accept_matrix.py", "--target", "no-such-model", "--out", "x.json", *argv])
    with pytest.raises(SystemExit) as done:
        module.main()
    assert done.value.code == 2 and message in capsys.readouterr().err


def test_eval_lossless_uses_the_shared_helpers():
    module = _load(TESTS.parent / "benchmarks" / "eval_lossless.py")
    assert module.top2_logits.__module__ == "transformers_longspec.bench.exactness"
    assert module.select_eval_rows.__module__ == "transformers_longspec.bench.prompts"


def test_cpu_defaults_to_fp32_and_a_cut_context_is_labelled_by_its_length(saved_target):
    out = saved_target / "cut"
    assert main(["bench", "--target", str(saved_target / "target"), "--methods", "sdpa,plain_graph",
                 "--datasets", "code_completion", "--buckets", "2048,4096", "--max-context", "40",
                 "--max-new-tokens", "3", "--device", "cpu", "--data-dir", str(saved_target / "data"),
                 "--out", str(out)]) == 0
    report = json.loads((out / "bench.json").read_text())
    assert report["meta"]["args"]["dtype"] == "fp32"
    assert {r["bucket"] for r in report["rows"]} == {40} and {r["prompt_tokens"] for r in report["rows"]} == {40}
    assert {a["bucket"] for a in report["aggregates"]} == {40, "all"}


def test_generate_command_compares_with_plain_greedy(saved_target, capsys):
    assert main(["generate", "--target", str(saved_target / "target"), "--prompt", "def add(a, b):",
                 "--max-new-tokens", "12", "--tree", "2,2", "--device", "cpu"]) in (0, None)
    out = capsys.readouterr().out
    assert "tree [2, 2] (draft tokens per level)" in out
    assert re.search(r"LongSpec \d+\.\d\dx plain; (\(below 1: either few draft tokens were accepted, tau "
                     r"\d\.\d\d, or other work .*\); )?identical output: True", out), out


def test_generate_command_verifies_the_best_tree_nodes(saved_target, capsys):
    assert main(["generate", "--target", str(saved_target / "target"), "--prompt", "def add(a, b):",
                 "--max-new-tokens", "12", "--tree", "2,2", "--tree-nodes", "3", "--device", "cpu"]) in (0, None)
    out = capsys.readouterr().out
    assert "tree [2, 2] (draft tokens per level, best 3 verified)" in out and "identical output: True" in out, out


def test_generate_command_says_when_no_drafting_ran(saved_target, capsys, monkeypatch):
    """No draft tree and no retrieval branch (what the policy may choose on a busy CPU): both runs do the same work,
    so the printed ratio is flagged as timing noise."""
    from transformers_longspec import generation

    monkeypatch.setattr(generation, "DEFAULT_RETRIEVAL_TOKENS", 0)
    assert main(["generate", "--target", str(saved_target / "target"), "--prompt", "def add(a, b):",
                 "--max-new-tokens", "6", "--tree", "none", "--device", "cpu"]) in (0, None)
    out = capsys.readouterr().out
    assert "tree [] (draft tokens per level), retrieval branch 0 tokens" in out, out
    assert "no drafting chosen on this device's measured costs: the ratio is timing noise" in out
    assert "identical output: True" in out


def test_generate_command_says_why_drafting_can_look_slower(saved_target, capsys, monkeypatch):
    """With drafting chosen and the plain run timed faster (a busy CPU), the ratio below 1 comes with why."""
    from transformers_longspec.cli import generate as generate_cli

    monkeypatch.setattr(generate_cli._DecodeClock, "tokens_per_s", lambda self: 1e9)  # the plain run, as if instant
    assert main(["generate", "--target", str(saved_target / "target"), "--prompt", "def add(a, b):",
                 "--max-new-tokens", "6", "--tree", "2,2", "--device", "cpu"]) in (0, None)
    out = capsys.readouterr().out
    assert re.search(r"LongSpec 0\.00x plain; \(below 1: either few draft tokens were accepted, tau \d\.\d\d, or "
                     r"other work on this machine slowed one of the two runs", out), out
    assert "identical output: True" in out


def test_a_method_keeps_its_colour_in_every_plot(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    aggregates = [{"method": m, "bucket": b, "median_decode_tok_s": 10.0, "median_tau": None if m == "static" else 1.5}
                  for m in ("sdpa", "static", "longspec") for b in (64, 256, "all")]
    drawn = []  # per PNG: {label: colour} of its lines
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: drawn.append(
        {line.get_label(): line.get_color() for line in fig.axes[0].lines}))
    plot_report({"aggregates": aggregates, "meta": {"device": "cpu", "commit": None}}, tmp_path)
    speed, tau = drawn
    assert set(speed) == {"sdpa", "static", "longspec"} and set(tau) == {"sdpa", "longspec"}  # static: no τ
    assert len(set(speed.values())) == 3 and all(tau[m] == speed[m] for m in tau)
    assert method_colours(aggregates) == speed
