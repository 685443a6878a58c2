"""Chat self-distillation on a tiny target: chat template, batched answers = one-by-one greedy, cache, masks."""

import json

import pytest
import torch

from transformers_longspec.trainers.chat_distill import (
    CHAT_TASKS,
    chat_distill_rows,
    chat_prompts,
    generate_answers,
    render_prompts,
)

from tiny_models import make_char_tokenizer, make_target

DOCS = [("python", "def add(a, b):\n    return a + b\n" * 20), ("docs", "Rivers carry water to the sea. " * 30)]


def test_prompts_name_the_task_and_fence_code():
    prompts = chat_prompts(DOCS, 6, prompt_chars=(40, 80), seed=3)
    assert len(prompts) == 6
    assert any("```python\n" in p for p in prompts) and any("Rivers carry" in p and "```" not in p for p in prompts)
    assert all(p.split("\n")[0].endswith((".", ":")) for p in chat_prompts(DOCS, 6, (40, 80), instruction_after=0))
    after = chat_prompts(DOCS, 6, (40, 80), seed=3, instruction_after=1)
    starts = tuple({" ".join(v.split()[:2]) for variants in CHAT_TASKS.values() for v in variants})
    assert all(not p.startswith(starts) and any(part.startswith(starts) for part in p.split("\n\n")[1:])
               and "following" not in p for p in after)
    assert any("the Python file above" in p or "the document above" in p for p in after)
    for bad in (1.5, "0.5", None, True):
        with pytest.raises(ValueError, match="instruction_after"):
            chat_prompts(DOCS, 1, instruction_after=bad)
    with pytest.raises(ValueError, match="pass \\['summarize'\\]"):
        chat_prompts(DOCS, 1, tasks="summarize")
    with pytest.raises(ValueError, match="unknown chat tasks"):
        chat_prompts(DOCS, 1, tasks=["translate"])


def test_excerpts_start_and_end_on_whole_lines_or_words():
    lines, words = {"def add(a, b):", "    return a + b"}, {"Rivers", "carry", "water", "to", "the", "sea."}
    prompts = chat_prompts(DOCS, 40, prompt_chars=(100, 160), seed=5, tasks=["summarize"], instruction_after=0)
    for prompt in prompts:
        body = prompt.split("\n\n", 1)[1]
        if body.startswith("```python\n"):  # a fifth of 100+ characters always holds a line break of this file
            assert set(body.removeprefix("```python\n").removesuffix("\n```").split("\n")) <= lines
        else:
            assert set(body.split()) <= words
    assert {p.startswith("Summarize the following Python") for p in prompts} == {True, False}
    # the summaries' several forms are all asked for
    assert {p.split("\n\n", 1)[0].replace("Python file", "{what}").replace("document", "{what}")
            for p in prompts} == set(CHAT_TASKS["summarize"])


def test_no_batch_starts_that_the_last_batch_time_says_would_end_past_the_budget(monkeypatch):
    from transformers_longspec.trainers import chat_distill

    clock = [0.0]
    monkeypatch.setattr(chat_distill.time, "perf_counter", lambda: clock[0])

    def thirty_seconds(target, prompts, *args):  # a fake batch_greedy on a fake clock
        clock[0] += 30.0
        return [[5, 2]] * len(prompts)

    monkeypatch.setattr(chat_distill, "batch_greedy", thirty_seconds)
    target, tok = make_target("qwen2", seed=1), make_char_tokenizer()
    prompt_ids = render_prompts(tok, ["one", "two", "three", "four"])
    seconds = []
    with pytest.warns(UserWarning, match="time budget of 50 s reached; 2 of 4 prompts"):
        answers = generate_answers(target, tok, prompt_ids, 6, 2, time_budget_s=50.0, batch_seconds=seconds)
    # the second batch would have started at 30 s < 50 s and ended at 60 s: it does not start
    assert seconds == [30.0] and sum(a is not None for a in answers) == 2
    seconds.clear()
    assert None not in generate_answers(target, tok, prompt_ids, 6, 2, time_budget_s=61.0, batch_seconds=seconds)
    assert seconds == [30.0, 30.0]
    with pytest.raises(ValueError, match="batch_seconds is a list to append each batch's seconds to"):
        generate_answers(target, tok, prompt_ids, 6, 2, batch_seconds=())


def test_render_applies_the_chat_template():
    tok = make_char_tokenizer()
    ids = render_prompts(tok, ["hello"])[0]
    assert tok.decode(ids) == "<s>user: hello</s><s>assistant: "
    with pytest.raises(ValueError, match="chat template"):
        render_prompts(make_char_tokenizer(chat_template=None), ["hello"])


def test_batched_answers_equal_one_by_one_greedy_and_are_cached(tmp_path):
    torch.set_num_threads(1)
    target, tok = make_target("qwen2", seed=1), make_char_tokenizer()
    prompt_ids = render_prompts(tok, ["hi", "a much longer question here", "mid size"])
    cache = tmp_path / "answers.jsonl"
    answers = generate_answers(target, tok, prompt_ids, max_new_tokens=6, batch_size=2, cache_path=cache)
    for ids, answer in zip(prompt_ids, answers, strict=True):
        alone = target.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=6, pad_token_id=0,
                                eos_token_id=2)[0, len(ids):].tolist()
        end = alone.index(2) + 1 if 2 in alone else len(alone)
        assert answer == alone[:end]  # left padding changes nothing; cut after the first EOS
    assert len(cache.read_text().splitlines()) == 3

    class NoGenerate:  # a second call must come from the cache alone
        generation_config, config = target.generation_config, target.config

        def parameters(self):
            return target.parameters()

        def generate(self, **_):
            raise AssertionError("generate called although every answer is cached")

    assert generate_answers(NoGenerate(), tok, prompt_ids, 6, 2, cache_path=cache) == answers
    with pytest.warns(UserWarning, match="time budget of -1 s reached; 3 of 3 prompts"):
        assert generate_answers(target, tok, prompt_ids, 6, 2, time_budget_s=-1.0) == [None, None, None]
    other = make_target("qwen2", seed=1, num_hidden_layers=3)  # another target, same tokenizer: its own answers
    with pytest.warns(UserWarning, match="time budget"):
        assert generate_answers(other, tok, prompt_ids, 6, 2, time_budget_s=-1.0, cache_path=cache) == [None] * 3
    with cache.open("a") as handle:
        handle.write('{"key": "cut sh')  # a run killed while appending
    with pytest.warns(UserWarning, match="1 unreadable line"):
        assert generate_answers(NoGenerate(), tok, prompt_ids, 6, 2, cache_path=cache) == answers


def test_rows_mask_the_prompt_or_label_everything():
    rows = chat_distill_rows([[5, 6, 7], [8]], [[9, 2], None], loss="answer")
    assert rows == [{"input_ids": [5, 6, 7, 9, 2], "labels": [-100, -100, -100, 9, 2]}]  # no answer: no row
    rows = chat_distill_rows([[5, 6, 7]], [[9, 2]], loss="all", max_length=4)
    assert rows == [{"input_ids": [6, 7, 9, 2], "labels": [6, 7, 9, 2]}]
    with pytest.raises(ValueError, match="'answer'"):
        chat_distill_rows([[5]], [[6]], loss="prompt")
    json.dumps(rows)  # plain lists: cacheable


@pytest.mark.parametrize("family,window", [("mistral", 8), ("qwen2", None)])
def test_answers_are_plain_argmax_whatever_the_generation_config_says(family, window):
    """A sliding-window target is answered by `generate`, the others by `batch_greedy`; both ignore a repetition
    penalty in the target's generation_config (greedy verification accepts the plain argmax) and leave it set."""
    torch.set_num_threads(1)
    target, tok = make_target(family, seed=2, sliding_window=window), make_char_tokenizer()
    prompt_ids = render_prompts(tok, ["a question longer than the window", "short"])
    plain = []
    for ids in prompt_ids:
        alone = target.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=12, pad_token_id=0,
                                eos_token_id=2)[0, len(ids):].tolist()
        plain.append(alone[: alone.index(2) + 1 if 2 in alone else len(alone)])
    target.generation_config.repetition_penalty = 5.0
    penalised = target.generate(torch.tensor([prompt_ids[0]]), do_sample=False, max_new_tokens=12, pad_token_id=0,
                                eos_token_id=2)[0, len(prompt_ids[0]):].tolist()
    assert penalised[: len(plain[0])] != plain[0]  # the penalty changes greedy output here
    assert generate_answers(target, tok, prompt_ids, max_new_tokens=12, batch_size=2) == plain
    assert target.generation_config.repetition_penalty == 5.0
