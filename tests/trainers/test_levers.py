"""The training levers of issue 12 on tiny targets: soft distillation, init from the target, long / mixed rows."""

import json
from collections import Counter
from dataclasses import asdict

import pytest
import torch

from transformers_longspec import LongSpecDraft
from transformers_longspec.trainers import LongSpecTrainer, LongSpecTrainingArguments, TokenCollator
from transformers_longspec.trainers.mix import MixSpec, StepCollator, build_mix
from transformers_longspec.trainers.soft_labels import soft_distill_loss, target_topk, vocabulary_targets

from tiny_models import make_char_tokenizer, make_target

ROWS = [{"input_ids": torch.randint(3, 99, (48,), generator=torch.Generator().manual_seed(i))} for i in range(4)]


def _args(tmp_path, **overrides):
    base = {"output_dir": str(tmp_path), "use_cpu": True, "report_to": [], "disable_tqdm": True,
            "per_device_train_batch_size": 4, "per_device_eval_batch_size": 4, "learning_rate": 1e-2, "max_steps": 4,
            "logging_steps": 1, "save_strategy": "no", "seed": 0}
    return LongSpecTrainingArguments(**{**base, **overrides})


def _train(target, args, rows=ROWS, collator=None, draft=None):
    draft = draft if draft is not None else LongSpecDraft.from_target(target)
    trainer = LongSpecTrainer(model=draft, target_model=target, args=args, train_dataset=rows, eval_dataset=rows,
                              data_collator=collator or TokenCollator(pad_token_id=0))
    before = trainer.evaluate()["eval_loss"]
    trainer.train()
    return before, trainer.evaluate()["eval_loss"], trainer


@pytest.mark.parametrize("weight,distill", [(1.0, False), (0.5, True)])
def test_soft_distillation_lowers_its_loss(tmp_path, weight, distill):
    torch.set_num_threads(1)
    args = _args(tmp_path, soft_labels_topk=8, soft_labels_weight=weight, distill_labels=distill)
    before, after, _ = _train(make_target("qwen2"), args)
    assert after < before - 0.2, (before, after)


def test_soft_loss_with_k1_is_the_argmax_cross_entropy(tmp_path):
    target = make_target("llama")
    hard = _train(target, _args(tmp_path, max_steps=1, distill_labels=True))[0]
    soft = _train(target, _args(tmp_path, max_steps=1, soft_labels_topk=1, soft_labels_weight=1.0))[0]
    assert soft == pytest.approx(hard, rel=1e-5)  # p = one-hot on the argmax: soft CE = hard CE on argmax labels


def test_soft_loss_matches_a_direct_computation():
    torch.manual_seed(0)
    target = make_target("llama").requires_grad_(False)  # frozen, as the trainer makes it
    hidden_t = torch.randn(2, 6, 32)
    top_logits, top_ids = target_topk(target, hidden_t, k=5, chunk=4)
    full = target.lm_head(hidden_t)
    assert torch.equal(top_ids[..., 0], full.argmax(-1))
    draft_hidden = torch.randn(2, 6, 32)
    labels = torch.ones(2, 6, dtype=torch.long)
    labels[1, 4] = -100  # position 3 of row 1 is not supervised
    loss = soft_distill_loss(target.lm_head, draft_hidden, top_logits, top_ids, labels, noise_offset=2, chunk=3)
    log_q = torch.log_softmax(target.lm_head(draft_hidden), -1)
    terms = [-(torch.softmax(top_logits[b, t], -1) * log_q[b, t, top_ids[b, t]]).sum()
             for b in range(2) for t in range(2, 5) if labels[b, t + 1] != -100]
    assert loss.item() == pytest.approx(torch.stack(terms).mean().item(), rel=1e-5)


def test_init_from_target_copies_the_last_layer_and_trains(tmp_path):
    target = make_target("qwen2")
    draft = LongSpecDraft.from_target(target)  # init_from_target=True is the default
    last = target.model.layers[-1]
    assert torch.equal(draft.block.self_attn.q_proj.weight, last.self_attn.q_proj.weight)
    assert torch.equal(draft.block.self_attn.q_proj.bias, last.self_attn.q_proj.bias)
    assert torch.equal(draft.block.cross_attn.q_proj.weight, last.self_attn.q_proj.weight)
    assert torch.equal(draft.block.mlp.down_proj.weight, last.mlp.down_proj.weight)
    assert torch.equal(draft.norm.weight, target.model.norm.weight)
    before, after, _ = _train(target, _args(tmp_path, distill_labels=True), draft=draft)
    assert after < before - 0.2, (before, after)


def test_mixed_items_with_long_and_chat_rows_train(tmp_path, fake_site):
    torch.set_num_threads(1)
    target, tok = make_target("qwen2"), make_char_tokenizer()
    spec = MixSpec(short_rows=16, short_seq_length=32, short_rows_per_step=4, long_rows=2, long_seq_length=300,
                   long_min_length=200, long_kinds={"python": 1.0, "c_cpp": 1.0}, chat_prompts=4,
                   chat_prompt_chars=[60, 120], chat_max_new_tokens=4, chat_batch_size=4, chat_kinds=["python"],
                   roots=[str(fake_site)], min_chars=100, system_docs=False, eval_items=1)
    train, held, summary = build_mix(spec, tok, target)
    shapes = sorted({tuple(item["input_ids"].shape) for item in train + held})
    assert (4, 32) in shapes and (1, 300) in shapes  # short items of 4 rows; long rows cut to 300 tokens
    chat = [item for item in train + held if item["labels"][0, 0] == -100]
    assert chat and all((item["labels"] != -100).sum() <= 4 * 4 for item in chat)  # answers only
    assert summary["counts"]["chat_rows"] == 4 and summary["skipped_evaluation"]
    repeated, _, _ = build_mix(MixSpec(**{**asdict(spec), "chat_repeat": 3}), tok, target)  # greedy: the same answers
    assert len(repeated) == len(train) + 2 * len([item for item in train if item["labels"][0, 0] == -100])
    with pytest.raises(ValueError, match="chat_repeat must be an int >= 1"):
        MixSpec(chat_repeat=0)
    with pytest.raises(ValueError, match="chat_long_prompt_chars must be"):
        MixSpec(chat_long_prompt_chars=[500, 100])


def test_prose_kind_reads_only_the_named_folders(tmp_path, fake_site, monkeypatch):
    """The "prose" kind: short rows, long rows and chat prompts from `prose_roots` alone, never the packages."""
    from transformers_longspec.trainers import mix
    from transformers_longspec.trainers.corpus import corpus_documents

    prose = tmp_path / "prose"
    for i, (folder, word) in enumerate([("news", "Harbour"), ("news", "Council"), ("fiction", "Lantern")]):
        (prose / folder).mkdir(parents=True, exist_ok=True)
        (prose / folder / f"{i}.txt").write_text(f"{word} story {i}. " + f"The {word.lower()} kept its watch. " * 40)
    texts = list(corpus_documents("prose", [prose], min_chars=100))
    assert len(texts) == 3 and all("story" in t for t in texts)  # the packages' README and docs are not prose
    with pytest.raises(ValueError, match="prose kind reads only folders you name"):
        next(corpus_documents("prose", None))
    with pytest.raises(ValueError, match=r"kinds / chat_kinds name the kind 'prose'.*prose_roots"):
        MixSpec(kinds={"python": 0.5, "prose": 0.5}, chat_kinds=["prose"])
    with pytest.raises(ValueError, match="prose_roots .* is the Debian Policy Manual"):
        MixSpec(prose_roots=[str(tmp_path / "debian-policy")])
    with pytest.raises(ValueError, match=r"data.mix.prose_roots is a list of folders"):
        MixSpec(prose_roots=str(prose))
    with pytest.raises(ValueError, match="roots is a list of folders, got the single path"):
        next(corpus_documents("prose", str(prose)))
    with pytest.raises(ValueError, match="prose_roots .*missing.* is not a folder"):
        MixSpec(prose_roots=[str(tmp_path / "missing")])
    joined = next(mix.repository_documents("prose", [prose / "news"], min_chars=2000))
    assert "File:" not in joined and joined.count("story") == 2  # prose: the texts one after another
    (tmp_path / "empty").mkdir()
    with pytest.warns(UserWarning, match="4 of 8 short rows built"):
        mix.short_and_long_rows(MixSpec(kinds={"python": 0.5, "prose": 0.5}, short_rows=8, short_seq_length=32,
                                        roots=[str(fake_site)], prose_roots=[str(tmp_path / "empty")], min_chars=100,
                                        system_docs=False), make_char_tokenizer(), mix.CorpusStats.empty())
    prompts, real_chat_prompts = [], mix.chat_prompts

    def recorded(*args, **kwargs):
        prompts.extend(real_chat_prompts(*args, **kwargs))
        return prompts[-args[1]:]

    monkeypatch.setattr(mix, "chat_prompts", recorded)
    target, tok = make_target("qwen2"), make_char_tokenizer()
    spec = MixSpec(kinds={"python": 0.5, "prose": 0.5}, short_rows=8, short_seq_length=32, short_rows_per_step=4,
                   long_rows=1, long_seq_length=300, long_min_length=200, long_kinds={"prose": 1.0}, chat_prompts=2,
                   chat_prompt_chars=[60, 120], chat_max_new_tokens=2, chat_batch_size=2, chat_kinds=["prose"],
                   roots=[str(fake_site)], prose_roots=[str(prose)], min_chars=100, system_docs=False, eval_items=0)
    _, _, summary = build_mix(spec, tok, target)
    counts = summary["counts"]
    assert counts["short_rows_prose"] == 4 and counts["short_rows_python"] == 4, counts
    assert counts["long_rows_prose"] == 1 and counts["chat_rows"] == 2
    assert len(prompts) == 2 and all("text" in p and ("story" in p or "kept its watch" in p) for p in prompts)


def test_long_chat_prompts_are_answered_over_joined_files(tmp_path, fake_site):
    """`chat_long_prompts`: prompts over long documents (`repository_documents`: a package's neighbouring files
    joined), answered by the target and cached beside the short prompts' answers; their rows carry the whole long
    prompt with the answer alone labelled."""
    target, tok = make_target("qwen2"), make_char_tokenizer()
    spec = MixSpec(short_rows=8, short_seq_length=32, short_rows_per_step=4, chat_prompts=2,
                   chat_prompt_chars=[60, 120], chat_long_prompts=2, chat_long_prompt_chars=[2000, 2600],
                   chat_max_new_tokens=4, chat_batch_size=4, chat_kinds=["python"], roots=[str(fake_site)],
                   min_chars=100, system_docs=False, eval_items=0, chat_cache=str(tmp_path / "answers.jsonl"))
    train, _, summary = build_mix(spec, tok, target)
    assert summary["counts"]["chat_rows"] == 2 and summary["counts"]["chat_long_rows"] == 2
    chat = [item for item in train if item["labels"][0, 0] == -100]
    lengths = sorted(int(item["attention_mask"][r].sum()) for item in chat for r in range(item["labels"].shape[0]))
    assert lengths[-1] > 2000 > 300 > lengths[0]  # two long prompts (joined files), two short ones
    assert all((item["labels"] != -100).sum() <= 5 * item["labels"].shape[0] for item in chat)  # answers only
    assert len((tmp_path / "answers.jsonl").read_text().splitlines()) == 4
    args = _args(tmp_path, per_device_train_batch_size=1, per_device_eval_batch_size=1, max_steps=8,
                 anchor_max_length=64, distill_labels=True)
    before, after, _ = _train(target, args, rows=train, collator=StepCollator())
    assert after < before - 0.2, (before, after)
    with pytest.raises(ValueError, match="per_device_train_batch_size=1"):
        StepCollator()(train[:2])


def test_long_chat_prompts_keep_their_share_of_the_time_budget(tmp_path, fake_site, monkeypatch):
    """The short prompts stop at (1 - chat_long_budget_share) of chat_time_budget_s, the long ones get the rest."""
    from transformers_longspec.trainers import mix

    budgets = []

    def fake_answers(target, tokenizer, prompt_ids, max_new_tokens, batch, budget, cache, batch_seconds):
        budgets.append(budget)
        batch_seconds += [3.0, 4.5]
        return [[5, 2]] * len(prompt_ids)

    monkeypatch.setattr(mix, "generate_answers", fake_answers)
    spec = MixSpec(chat_prompts=2, chat_prompt_chars=[60, 120], chat_long_prompts=2,
                   chat_long_prompt_chars=[2000, 2600], chat_time_budget_s=100.0, chat_long_budget_share=0.25,
                   chat_kinds=["python"], roots=[str(fake_site)], min_chars=100, system_docs=False)
    stats = mix.CorpusStats(Counter(), Counter())
    rows = mix.chat_rows(spec, make_char_tokenizer(), None, stats)
    assert len(rows) == 4 and 70.0 < budgets[0] <= 75.0 and 95.0 < budgets[1] <= 100.0
    assert stats.documents["chat_batches"] == stats.documents["chat_long_batches"] == 2
    assert stats.documents["chat_batch_s_max"] == stats.documents["chat_long_batch_s_max"] == 4.5
    for bad in (1.5, "0.5", None, True):
        with pytest.raises(ValueError, match="chat_long_budget_share is a share"):
            MixSpec(chat_long_budget_share=bad)


def test_parts_prompts_ask_for_each_part_in_turn_and_leave_the_other_prompts_as_they_were(tmp_path, fake_site,
                                                                                         monkeypatch):
    """`chat_parts_prompts`: prompts over long documents asking for a summary of each part ("summarize_parts"),
    answered after the short prompts and before the long ones, within the long prompts' share of the budget; the
    short and long prompts are the ones a spec without them builds (their cached answers stay valid)."""
    from transformers_longspec.trainers import mix
    from transformers_longspec.trainers.chat_distill import CHAT_TASKS

    calls = []

    def fake_answers(target, tokenizer, prompt_ids, max_new_tokens, batch, budget, cache, batch_seconds):
        calls.append(([tokenizer.decode(ids) for ids in prompt_ids], budget))
        return [[5, 2]] * len(prompt_ids)

    monkeypatch.setattr(mix, "generate_answers", fake_answers)
    base = dict(chat_prompts=2, chat_prompt_chars=[60, 120], chat_long_prompts=2, chat_long_prompt_chars=[2000, 2600],
                chat_time_budget_s=100.0, chat_long_budget_share=0.25, chat_kinds=["python"],
                roots=[str(fake_site)], min_chars=100, system_docs=False)
    tok = make_char_tokenizer()
    mix.chat_rows(MixSpec(**base), tok, None, mix.CorpusStats(Counter(), Counter()))
    without = [prompts for prompts, _ in calls]
    calls.clear()
    stats = mix.CorpusStats(Counter(), Counter())
    rows = mix.chat_rows(MixSpec(**base, chat_parts_prompts=3), tok, None, stats)
    (short, short_budget), (parts, parts_budget), (long, _) = calls
    assert [short, long] == without and len(parts) == 3 and len(rows) == 7
    assert short_budget <= 75.0 < parts_budget  # the short prompts keep to their share with parts prompts alone too
    keys = [v.split("{what}")[1][:20] for v in CHAT_TASKS["summarize_parts"]]  # e.g. " one part at a time:"
    assert all(sum(k in p for k in keys) == 1 for p in parts) and not any(k in p for k in keys for p in short + long)
    assert all(len(p) > 1600 for p in parts)  # excerpts of the long documents
    assert stats.documents["chat_parts_rows"] == 3 and stats.documents["chat_long_rows"] == 2
    for bad in (-1, 1.5, True, "8", None):
        with pytest.raises(ValueError, match="data.mix.chat_parts_prompts must be an int >= 0, got"):
            MixSpec(chat_parts_prompts=bad)


def test_a_second_chat_round_reuses_the_cached_first_and_answers_new_prompts(tmp_path, fake_site):
    """`chat_rounds`: a run with one round more rebuilds round 0's prompts exactly (their answers come from the
    cache, none is generated again) and answers new prompts over the next documents."""
    from transformers_longspec.trainers import mix

    target, tok, cache = make_target("qwen2"), make_char_tokenizer(), tmp_path / "answers.jsonl"
    spec = dict(chat_prompts=2, chat_prompt_chars=[60, 120], chat_max_new_tokens=4, chat_batch_size=4,
                chat_kinds=["python"], roots=[str(fake_site)], min_chars=100, system_docs=False, chat_cache=str(cache))
    first = mix.CorpusStats(Counter(), Counter())
    one = mix.chat_rows(MixSpec(**spec), tok, target, first)
    assert len(cache.read_text().splitlines()) == 2
    stats = mix.CorpusStats(Counter(), Counter())
    two = mix.chat_rows(MixSpec(**spec, chat_rounds=2), tok, target, stats)
    assert two[:2] == one and len(two) == 4 and stats.documents["chat_rows"] == 4
    assert stats.documents["python"] == first.documents["python"]  # one scan serves both rounds (one file here)
    assert len(cache.read_text().splitlines()) == 4 and stats.documents["chat_batches"] == 1  # the new round only
    prompts = [tok.decode([t for t, label in zip(r["input_ids"], r["labels"]) if label == -100]) for r in two]
    assert not set(prompts[:2]) & set(prompts[2:])
    for bad in (0, 1.0, True):
        with pytest.raises(ValueError, match="chat_rounds must be an int >= 1"):
            MixSpec(chat_rounds=bad)


def test_mix_recipe_builds_step_items_and_checks_its_settings(tmp_path, fake_site):
    from transformers_longspec.trainers.recipes import build_datasets, load_recipe

    recipe = load_recipe("qwen2.5-coder-1.5b-mix")
    assert recipe.training_arguments["per_device_train_batch_size"] == 1 and recipe.data.mix["chat_prompts"] > 0
    path = tmp_path / "mix.json"
    mix = {"short_rows": 8, "short_seq_length": 32, "short_rows_per_step": 4, "roots": [str(fake_site)],
           "min_chars": 100, "system_docs": False, "eval_items": 0}
    path.write_text(json.dumps({"data": {"source": "mix", "format": "mix", "mix": mix}}))
    train, held, collator = build_datasets(load_recipe(path).data, make_char_tokenizer())
    assert isinstance(collator, StepCollator) and held is None
    assert [tuple(item["input_ids"].shape) for item in train] == [(4, 32), (4, 32)]
    path.write_text(json.dumps({"data": {"source": "mix", "format": "mix", "mix": {"short_row": 8}}}))
    with pytest.raises(ValueError, match="short_row"):
        load_recipe(path)
    path.write_text(json.dumps({"data": {"source": "mix", "format": "packed"}}))
    with pytest.raises(ValueError, match="go together"):
        load_recipe(path)


def test_mixed_soft_and_hard_loss_is_one_pass_of_both_terms():
    """w * soft + (1 - w) * hard from one LM-head pass per chunk equals the two losses computed apart."""
    torch.manual_seed(1)
    target = make_target("llama").requires_grad_(False)  # frozen, as the trainer makes it
    draft = LongSpecDraft.from_target(target)
    ids = torch.randint(3, 99, (2, 20))
    labels = ids.clone()
    labels[0, 7] = -100
    keys, values = (torch.randn(2, 2, 20, 8) for _ in range(2))
    out = draft(input_ids=ids, target_keys=keys, target_values=values, labels=labels, noise_offset=2)
    top = target_topk(target, torch.randn(2, 20, 32), k=6)
    soft = soft_distill_loss(draft.lm_logits, out.hidden_states, *top, labels, noise_offset=2, chunk=7)
    mixed = soft_distill_loss(draft.lm_logits, out.hidden_states, *top, labels, noise_offset=2, chunk=7,
                              soft_weight=0.3)
    assert mixed.item() == pytest.approx(0.3 * soft.item() + 0.7 * out.loss.item(), rel=1e-5)
    hard = soft_distill_loss(draft.lm_logits, out.hidden_states, None, None, labels, noise_offset=2, chunk=7)
    assert hard.item() == pytest.approx(out.loss.item(), rel=1e-5)  # the trainer's loss without soft labels
    (grad_fused,) = torch.autograd.grad(hard, out.hidden_states, retain_graph=True)
    (grad_forward,) = torch.autograd.grad(out.loss, out.hidden_states)
    torch.testing.assert_close(grad_fused, grad_forward, rtol=1e-4, atol=1e-7)
    with pytest.raises(ValueError, match="together"):
        soft_distill_loss(draft.lm_logits, out.hidden_states, top[0], None, labels)
    with pytest.raises(ValueError, match="token ids or -100 .*got -5"):  # not clamped to token 0 and trained on
        soft_distill_loss(draft.lm_logits, out.hidden_states, None, None, labels.masked_fill(labels == 5, -5))
    with pytest.raises(ValueError, match=r"labels \(2, 19\) must share"):
        soft_distill_loss(draft.lm_logits, out.hidden_states, None, None, labels[:, 1:])


def test_rows_cache_is_built_once_and_refused_when_stale(tmp_path, fake_site, monkeypatch):
    """`longspec data` writes the short and long rows; a build with the same settings reads them instead of scanning
    (the same items), other settings are refused naming them."""
    from transformers_longspec.cli import main
    from transformers_longspec.trainers import mix as mix_module

    recipe = tmp_path / "mix.json"
    rows = tmp_path / "rows.pt"
    mix = {"short_rows": 8, "short_seq_length": 32, "short_rows_per_step": 4, "long_rows": 1, "long_seq_length": 300,
           "long_min_length": 200, "long_kinds": {"python": 1.0}, "roots": [str(fake_site)], "min_chars": 100,
           "system_docs": False, "eval_items": 0, "rows_cache": str(rows)}
    recipe.write_text(json.dumps({"data": {"source": "mix", "format": "mix", "mix": mix}}))
    tok = make_char_tokenizer()
    monkeypatch.setattr("transformers_longspec.cli.train.load_tokenizer", lambda spec: tok)
    assert main(["data", "--recipe", str(recipe), "--target", "unused"]) == 0 and rows.is_file()
    fresh, _, fresh_summary = build_mix(MixSpec(**{**mix, "rows_cache": None}), tok)
    real_documents = mix_module.corpus_documents
    monkeypatch.setattr(mix_module, "corpus_documents", None)  # a scan would fail now: the cache must serve
    monkeypatch.setattr(mix_module, "repository_documents", None)
    cached, _, summary = build_mix(MixSpec(**mix), tok)
    assert [item["input_ids"].tolist() for item in cached] == [item["input_ids"].tolist() for item in fresh]
    assert summary["counts"]["short_rows_python"] == fresh_summary["counts"]["short_rows_python"]
    with pytest.raises(ValueError, match=r"other \['short_rows'\]"):
        build_mix(MixSpec(**{**mix, "short_rows": 4}), tok)
    assert main(["data", "--recipe", "qwen2.5-coder-1.5b-mix", "--target", "unused"]) == 2  # no rows_cache named
    chat = {**mix, "chat_prompts": 3, "chat_prompt_chars": [60, 120], "chat_max_new_tokens": 4, "chat_batch_size": 2,
            "chat_kinds": ["python"], "chat_cache": str(tmp_path / "answers.jsonl")}
    recipe.write_text(json.dumps({"data": {"source": "mix", "format": "mix", "mix": chat}}))
    monkeypatch.setattr(mix_module, "corpus_documents", real_documents)
    dtypes = []
    monkeypatch.setattr("transformers_longspec.cli.train.load_target",
                        lambda spec, dtype, device: dtypes.append(dtype) or (make_target("qwen2"), tok))
    assert main(["data", "--chat", "--recipe", str(recipe), "--target", "unused", "--device", "cpu"]) == 0
    assert len((tmp_path / "answers.jsonl").read_text().splitlines()) == 3  # the answers train reads, not regenerates
    assert main(["data", "--chat", "--recipe", str(recipe), "--target", "unused", "--device", "cpu",
                 "--dtype", "bf16"]) == 0
    assert dtypes == [torch.float32, torch.bfloat16]  # auto on a CPU is fp32; --dtype bf16 asks for bf16


def test_chat_prompts_cache_serves_the_same_prompts_and_rows(tmp_path, fake_site, monkeypatch, capsys):
    """`longspec data --prompts` renders the chat prompts with the tokenizer alone; the answers and the training rows
    built from the cache equal those built by scanning, and a cache of other settings is refused naming them."""
    from transformers_longspec.cli import main
    from transformers_longspec.trainers import mix as mix_module
    from transformers_longspec.trainers.corpus import CorpusStats
    from transformers_longspec.trainers.mix import chat_prompt_ids, chat_rows

    recipe, prompts = tmp_path / "mix.json", tmp_path / "prompts.pt"
    mix = {"short_rows": 8, "short_seq_length": 32, "short_rows_per_step": 4, "roots": [str(fake_site)],
           "min_chars": 100, "system_docs": False, "eval_items": 0, "chat_prompts": 3, "chat_prompt_chars": [60, 120],
           "chat_long_prompts": 1, "chat_long_prompt_chars": [150, 400], "chat_rounds": 2, "chat_max_new_tokens": 4,
           "chat_batch_size": 2, "chat_kinds": ["python"], "chat_prompts_cache": str(prompts)}
    recipe.write_text(json.dumps({"data": {"source": "mix", "format": "mix", "mix": mix}}))
    tok, target = make_char_tokenizer(), make_target("qwen2")
    monkeypatch.setattr("transformers_longspec.cli.train.load_tokenizer", lambda spec: tok)
    assert main(["data", "--prompts", "--recipe", str(recipe), "--target", "unused"]) == 0 and prompts.is_file()
    assert "8 chat prompts" in capsys.readouterr().out  # 3 short + 1 long, two rounds
    scanned_stats, cached_stats = CorpusStats.empty(), CorpusStats.empty()
    scanned = chat_prompt_ids(MixSpec(**{**mix, "chat_prompts_cache": None}), tok, scanned_stats)
    monkeypatch.setattr(mix_module, "corpus_documents", None)  # a scan would fail now: the cache must serve
    monkeypatch.setattr(mix_module, "repository_documents", None)
    cached = chat_prompt_ids(MixSpec(**mix), tok, cached_stats)
    assert cached == scanned and [len(r) for r in scanned["chat"]] == [3, 3] and len(scanned["chat_long"]) == 2
    assert scanned["chat"][0] != scanned["chat"][1]  # the second round quotes other documents
    assert cached_stats.documents == scanned_stats.documents and cached_stats.files_seen == scanned_stats.files_seen
    with_cache = chat_rows(MixSpec(**mix), tok, target, CorpusStats.empty())
    monkeypatch.undo()
    without = chat_rows(MixSpec(**{**mix, "chat_prompts_cache": None}), tok, target, CorpusStats.empty())
    assert with_cache == without and len(without) == 8
    with pytest.raises(ValueError, match=r"chat_prompts_cache .* other \['chat_rounds'\]"):
        chat_prompt_ids(MixSpec(**{**mix, "chat_rounds": 1}), tok, CorpusStats.empty())
    recipe.write_text(json.dumps({"data": {"source": "mix", "format": "mix",
                                           "mix": {**mix, "chat_prompts": 0, "chat_long_prompts": 0}}}))
    monkeypatch.setattr("transformers_longspec.cli.train.load_tokenizer", lambda spec: tok)
    assert main(["data", "--prompts", "--recipe", str(recipe), "--target", "unused"]) == 2
    assert "asks for none: set --set-mix chat_prompts=N" in capsys.readouterr().err
    # a mix recipe without the cache file to write: the message names the option, not another recipe
    recipe.write_text(json.dumps({"data": {"source": "mix", "format": "mix",
                                           "mix": {**mix, "chat_prompts_cache": None}}}))
    assert main(["data", "--prompts", "--recipe", str(recipe), "--target", "unused"]) == 2
    err = capsys.readouterr().err
    assert "--prompts writes data.mix.chat_prompts_cache, which recipe" in err and "use such a recipe" not in err
    with pytest.raises(SystemExit):  # one of --chat / --prompts
        main(["data", "--prompts", "--chat", "--recipe", str(recipe), "--target", "unused"])


def test_draft_vocab_loss_is_the_soft_loss_with_other_columns_masked():
    """The restricted LM head equals the full one with every column outside the kept ids at -inf; top ids outside
    leave the soft target, and a hard label outside (or a position whose top-k holds no kept id) is unsupervised."""
    torch.manual_seed(0)
    target = make_target("llama").requires_grad_(False)  # frozen, as the trainer makes it
    top_logits, top_ids = target_topk(target, torch.randn(2, 7, 32), k=4, chunk=4)
    labels = torch.randint(3, 99, (2, 7))
    # some positions keep none of their top-4; token 0 stands in for ids outside the set in the full reference below
    kept = torch.unique(torch.cat([torch.tensor([0]), top_ids[0, :3].flatten(), labels[1]]))
    draft_hidden = torch.randn(2, 7, 32)
    soft_logits, soft_ids, soft_labels = vocabulary_targets(kept, 99, top_logits, top_ids, labels)
    restricted = soft_distill_loss(lambda h: h @ target.lm_head.weight[kept].T, draft_hidden, soft_logits, soft_ids,
                                   soft_labels, noise_offset=1, chunk=3, soft_weight=0.5)
    outside = torch.ones(99, dtype=torch.bool)
    outside[kept] = False

    def masked_head(h):
        return (h @ target.lm_head.weight.T).masked_fill(outside, float("-inf"))

    kept_ids = torch.where(outside[top_ids], 0, top_ids)  # full-vocabulary ids; those outside get weight 0 below
    full_labels = torch.where(soft_labels == -100, -100, labels)
    full = soft_distill_loss(masked_head, draft_hidden, top_logits.masked_fill(outside[top_ids], float("-inf"))
                             .masked_fill(outside[top_ids].all(-1, keepdim=True), 0.0), kept_ids, full_labels,
                             noise_offset=1, chunk=3, soft_weight=0.5)
    assert torch.isfinite(restricted) and restricted.item() == pytest.approx(full.item(), rel=1e-5)
    none_kept = outside[top_ids].all(-1)
    assert none_kept[:, :-1].any() and (soft_labels[:, 1:][none_kept[:, :-1]] == -100).all()
    assert (soft_labels[outside[labels.clamp(min=0)]] == -100).all()


def test_draft_vocab_loss_trains_and_is_refused_without_its_parts(tmp_path):
    torch.set_num_threads(1)
    target = make_target("qwen2")
    draft = LongSpecDraft.from_target(target)
    with pytest.raises(ValueError, match="needs a draft with a vocabulary of its own"):
        _train(target, _args(tmp_path, soft_labels_topk=8, draft_vocab_loss=True), draft=draft)
    with pytest.raises(ValueError, match="set soft_labels_topk"):
        _args(tmp_path, draft_vocab_loss=True)
    # rows of ids 3..39 and a vocabulary of 40..59: the loss's softmax runs over 57 of the 99 ids, and the target's
    # argmax labels outside them leave their positions unsupervised
    rows = [{"input_ids": torch.randint(3, 40, (48,), generator=torch.Generator().manual_seed(i))} for i in range(4)]
    draft.set_draft_vocabulary(torch.arange(40, 60))
    batch = torch.stack([r["input_ids"] for r in rows])
    greedy = target_topk(target, target.model(batch).last_hidden_state, k=8)[1][..., 0]
    kept = torch.unique(torch.cat([draft.draft_vocab, batch.flatten()]))
    assert 0 < (~torch.isin(greedy, kept)).float().mean() < 0.9  # the restriction bites, and some labels remain
    before, after, _ = _train(target, _args(tmp_path, soft_labels_topk=8, distill_labels=True, draft_vocab_loss=True),
                              rows=rows, draft=draft)
    assert after < before - 0.2, (before, after)
