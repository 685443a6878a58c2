"""Chat self-distillation: the target's own greedy answers to instructions over long documents.

A draft serves chat prompts: after the chat template's assistant header the target writes in its own voice, which
no corpus text shows. So we build instructions over documents of the corpus (summarise it, continue this file,
explain it, answer a question about it), render them with the TARGET's chat template, let the target answer
greedily in left-padded batches (bf16 on a GPU, `batch_greedy`), cache the answers' token ids on disk and turn
each into one row:

    input_ids = chat-templated prompt ids + the generated answer ids (through the first end-of-turn token)
    labels    = -100 on the prompt, the answer ids on the answer         (loss="answer", the default)
              = every position                                           (loss="all")

Answer-only by default: the prompt's document is the kind of text the corpus rows already cover, while the
answer after the assistant header is what a chat user's draft must predict; the rows' prompts still go through
the target and the draft, so the answer is learnt with the long document in the target's cache. Under
`distill_labels` the trainer replaces each supervised label by the target's argmax there, which on the answer is
the generated token itself (up to batched bf16 rounding), and leaves -100 alone.

Reference: LongSpec (arXiv 2502.17421) §4.1 (stage 3: task data, answer-only labels) and reference spec §4.6
(LongSFT collators: prompt truncated, answer labelled); transformers `apply_chat_template`, `generate`.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch

from .batch_greedy import batch_greedy, batch_greedy_unsupported, cut_after_stop, left_pad

__all__ = ["CHAT_TASKS", "DEFAULT_CHAT_TASKS", "chat_distill_rows", "chat_prompts", "generate_answers",
           "render_prompts"]

# Instructions per task, one drawn per prompt ({what}: "Python file", "C/C++ source file", "document", "text"); the
# "question" task draws one of the questions below. Summaries come in several forms (short, bulleted, part by part)
# because users ask for all of them and the target answers each in its own layout.
CHAT_TASKS = {
    "summarize": (
        "Summarize the following {what}: its purpose, its main parts and anything unusual about it.",
        "Summarize the following {what} part by part: for each part, what it is about and its main points.",
        "Give a bullet-point summary of the following {what}: the main points first, then the details that matter.",
        "Summarise the following {what} in one paragraph for someone who has not read it.",
    ),
    "continue": ("Continue this {what} from exactly where it stops. Reply with the continuation only.",),
    "explain": (
        "Explain the following {what} to a new colleague, section by section.",
        "Explain the ideas behind the following {what}: what it does or says, and why.",
    ),
    "question": ("Read the following {what} and answer the question at the end.",),
    # over long documents (several files, or texts one after another): a summary of each part in turn, the layout
    # users ask of a bundle of documents; not among the default tasks (data.mix.chat_parts_prompts asks for it)
    "summarize_parts": (
        "Summarize the following {what} one part at a time: for each file or text in it, name it and give its "
        "main points.",
        "Go through the following {what} part by part and, for every part, say what it is and what it says or does "
        "in a few sentences.",
        "Write a summary of each part of the following {what} in turn: its subject first, then its key points and "
        "details.",
    ),
}
# the tasks a prompt draws by default (the order fixes which one a seed draws: cached answers stay valid)
DEFAULT_CHAT_TASKS = ("summarize", "continue", "explain", "question")
_QUESTIONS = {
    "code": (
        "Which function or class here is the most important, and how would you call it correctly?",
        "What could go wrong when using this code, and how would you guard against it?",
        "Which parts would you test first, and what should those tests check?",
        "How would you simplify or speed up the central part of this code? Show the changed code.",
    ),
    "docs": (
        "What is the main point of this text, and what details support it?",
        "Which instructions or rules does this text give? List them briefly.",
        "What would a reader most likely misunderstand here, and how would you clarify it?",
    ),
}
_WHAT = {"python": ("Python file", "python"), "c_cpp": ("C/C++ source file", "cpp"),
         "other_code": ("source file", ""), "docs": ("document", None), "prose": ("text", None)}


def chat_prompts(documents: Sequence[tuple[str, str]], count: int, prompt_chars: tuple[int, int] = (3000, 9000),
                 tasks: Sequence[str] = DEFAULT_CHAT_TASKS, seed: int = 0,
                 instruction_after: float = 0.5) -> list[str]:
    """User messages asking for one task over an excerpt of a document.

    The instruction comes before the excerpt ("Summarize the following document: ...") or, for a share
    `instruction_after` of the prompts, after it ("... Summarize the document above"), as long-document prompts
    usually put it; a question always comes last.

    Args:
        documents: (kind, text) pairs, kind one of "python", "c_cpp", "other_code", "docs", "prose".
        count: prompts to build (documents are reused round-robin if there are fewer).
        prompt_chars: (min, max) characters of document per prompt (~3.5 characters per token).
        tasks: names from `CHAT_TASKS` (default `DEFAULT_CHAT_TASKS`: all but "summarize_parts").
        seed: choice of excerpt, length, task and instruction placement.
        instruction_after: share of prompts (0 to 1) with the instruction after the excerpt.
    Returns: `count` user-message strings (no chat template yet).
    Raises: ValueError for no documents, a negative count, tasks given as one string, an unknown task or kind,
        prompt_chars not 0 < min <= max, or instruction_after not a number in [0, 1].
    Reference: LongSpec §4.1 (task data over long inputs).
    """
    if not documents:
        raise ValueError("chat_prompts needs at least one (kind, text) document")
    if isinstance(tasks, str):
        raise ValueError(f"tasks is a list of task names, got the string {tasks!r}; pass [{tasks!r}]")
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    unknown = sorted(set(tasks) - set(CHAT_TASKS))
    if unknown or not tasks:
        raise ValueError(f"unknown chat tasks {unknown or tasks}; choose from {sorted(CHAT_TASKS)}")
    low, high = prompt_chars
    if not 0 < low <= high:
        raise ValueError(f"prompt_chars must be (min, max) with 0 < min <= max, got {prompt_chars}")
    if isinstance(instruction_after, bool) or not isinstance(instruction_after, (int, float)) or not (
            0.0 <= instruction_after <= 1.0):
        raise ValueError(f"instruction_after is a share of prompts in [0, 1], got {instruction_after}")
    rng = random.Random(seed)
    prompts = []
    for i in range(count):
        kind, text = documents[i % len(documents)]
        if kind not in _WHAT:
            raise ValueError(f"unknown document kind {kind!r}; choose from {sorted(_WHAT)}")
        size = rng.randint(low, high)
        start = rng.randrange(max(len(text) - size, 0) + 1)
        excerpt = _excerpt(text, start, size)
        task = tasks[rng.randrange(len(tasks))]
        what, fence = _WHAT[kind]
        body = excerpt if fence is None else f"```{fence}\n{excerpt}\n```"
        instruction = rng.choice(CHAT_TASKS[task]).format(what=what)
        if instruction_after and rng.random() < instruction_after:
            instruction = instruction.replace(f"the following {what}", f"the {what} above")
            prompt = f"{body}\n\n{instruction}"
        else:
            prompt = f"{instruction}\n\n{body}"
        if task == "question":
            prompt += f"\n\nQuestion: {rng.choice(_QUESTIONS['docs' if kind in ('docs', 'prose') else 'code'])}"
        prompts.append(prompt)
    return prompts


def _excerpt(text: str, start: int, size: int) -> str:
    """`text[start : start + size]` moved onto whole lines, or whole words where no line break is near: the start
    forward to just after the first line break (else whitespace) in the excerpt's first fifth, the end back to the
    last one in its last fifth. A cut that finds neither stays where it is; so does a start or end at the text's
    own start or end."""
    end = min(start + size, len(text))
    slack = max((end - start) // 5, 1)
    if start > 0 and text[start - 1] != "\n":
        head = text[start : start + slack]
        cut = head.find("\n")
        if cut < 0:
            match = re.search(r"\s", head)
            cut = match.start() if match else -1
        start += cut + 1  # -1 + 1: unchanged
    if end < len(text) and text[end] != "\n":
        tail = text[end - slack : end]
        cut = tail.rfind("\n")
        if cut < 0:
            match = re.search(r"\s\S*$", tail)
            cut = match.start() if match else -1
        if cut >= 0:
            end -= slack - cut
    return text[start:end].strip("\n")


def render_prompts(tokenizer, prompts: Sequence[str], system: str | None = None) -> list[list[int]]:
    """Token ids of each user message rendered by the tokenizer's chat template, ending with the assistant header.

    Args:
        tokenizer: the target's tokenizer (must have a chat template).
        prompts: user messages.
        system: optional system message (None = the template's default, e.g. Qwen's "You are Qwen ...").
    Returns: one list of ids per prompt.
    Raises: ValueError if the tokenizer has no chat template.
    Reference: transformers `PreTrainedTokenizerBase.apply_chat_template`.
    """
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("chat self-distillation needs a tokenizer with a chat template (tokenizer.chat_template is "
                         "None); use an Instruct target or set tokenizer.chat_template")
    rendered = []
    for prompt in prompts:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        rendered.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return rendered


def _stop_ids(target, tokenizer) -> set[int]:
    """Token ids that end an answer: the generation config's EOS ids and the tokenizer's EOS."""
    eos = getattr(target.generation_config, "eos_token_id", None)
    ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def _target_name(target) -> list:
    """What tells two targets' answers apart in the cache: the checkpoint's name and its shape."""
    config = target.config.get_text_config()
    return [getattr(target.config, "_name_or_path", ""), config.model_type, config.num_hidden_layers,
            config.hidden_size, config.vocab_size]


def _key(target_name: list, ids: list[int], max_new_tokens: int) -> str:
    return hashlib.sha1(json.dumps([target_name, max_new_tokens, ids]).encode()).hexdigest()


def _load_cache(path: Path | None) -> dict[str, list[int]]:
    """The cached answers of `path`; a line cut short (a run killed while appending) is skipped with a warning."""
    if path is None or not path.is_file():
        return {}
    cache, broken = {}, 0
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            try:
                row = json.loads(line)
                cache[row["key"]] = row["answer_ids"]
            except (json.JSONDecodeError, KeyError, TypeError):
                broken += 1
    if broken:
        warnings.warn(f"{path}: {broken} unreadable line(s) skipped (a run stopped while writing?); their prompts "
                      "are answered again", stacklevel=3)
    return cache


@torch.no_grad()
def generate_answers(target, tokenizer, prompt_ids: Sequence[list[int]], max_new_tokens: int = 384,
                     batch_size: int = 64, time_budget_s: float | None = None, cache_path: str | Path | None = None,
                     prefill_tokens: int = 16384, batch_seconds: list | None = None) -> list[list[int] | None]:
    """The target's greedy answers (token ids) to chat-templated prompts, batched with left padding, cached.

    Prompts are answered longest first in batches of `batch_size` by `batch_greedy` (one static cache per batch,
    chunked prefill, the decode step replayed from a CUDA graph on a GPU); a target with sliding-window layers is
    answered by `target.generate` instead. Both decode by plain argmax, without the logits processors a hub
    generation_config may name (a repetition penalty): what greedy verification accepts. Each answer is cut after
    its first stop token (generation-config EOS, e.g. Qwen's <|im_end|>), which is kept. Answers already in
    `cache_path` (a jsonl of {"key", "answer_ids"}, keyed by the target's name and shape, the prompt ids and
    max_new_tokens) are reused; new ones are appended after every batch, so a run stopped by the time budget or the
    lease keeps what it made.

    Args:
        target: the target `*ForCausalLM` (its device and dtype are used as they are: bf16 on the GPU).
        tokenizer: its tokenizer (pad: its pad token, else EOS).
        prompt_ids: token ids of rendered prompts (`render_prompts`).
        max_new_tokens: answer length at most (tokens).
        batch_size: prompts per batch.
        time_budget_s: seconds (None = no limit); no batch starts once this much time has passed, or would have
            passed by its end if it took as long as the batch before (a budget of 0 or less answers nothing). The
            first batch has no such estimate: it starts while any budget remains and may end past it.
        cache_path: jsonl file of cached answers (created if missing; None = no cache).
        prefill_tokens: prompt tokens per prefill forward across a batch (`batch_greedy`).
        batch_seconds: a list to which each batch's wall time (seconds, its cache write included) is appended
            (None: not recorded).
    Returns: one list of answer ids per prompt, or None for a prompt not reached within the time budget.
    Raises: ValueError if `batch_size` or `max_new_tokens` < 1, `batch_seconds` is neither None nor a list, or the
        tokenizer has no pad and no EOS token.
    Reference: `batch_greedy` (transformers `StaticCache`, 4D masks); transformers `GenerationMixin.generate`.
    """
    if batch_size < 1 or max_new_tokens < 1:
        raise ValueError(f"batch_size and max_new_tokens must be >= 1, got {batch_size}, {max_new_tokens}")
    if batch_seconds is not None and not isinstance(batch_seconds, list):
        raise ValueError(f"batch_seconds is a list to append each batch's seconds to (or None), got "
                         f"{type(batch_seconds).__name__}")
    path = Path(cache_path) if cache_path is not None else None
    cache = _load_cache(path)
    name = _target_name(target)
    keys = [_key(name, list(ids), max_new_tokens) for ids in prompt_ids]
    todo = sorted({k: i for i, k in enumerate(keys) if k not in cache}.values(), key=lambda i: -len(prompt_ids[i]))
    stops = _stop_ids(target, tokenizer) if todo else set()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if todo and pad is None:
        raise ValueError("the tokenizer has neither a pad nor an EOS token: set tokenizer.pad_token first")
    fallback = todo and batch_greedy_unsupported(target) is not None
    start, skipped, last_s = time.perf_counter(), 0, 0.0
    for first in range(0, len(todo), batch_size):
        begun = time.perf_counter()
        # the next batch would end past the budget if it took as long as the last one (prompts run longest first)
        if time_budget_s is not None and begun - start + last_s > time_budget_s:
            skipped = len(todo) - first
            break
        batch = todo[first : first + batch_size]
        prompts = [prompt_ids[i] for i in batch]
        if fallback:
            answers = _generate(target, prompts, max_new_tokens, stops, pad)
        else:
            answers = batch_greedy(target, prompts, max_new_tokens, sorted(stops), pad, prefill_tokens)
        new = [{"key": keys[i], "answer_ids": answer} for i, answer in zip(batch, answers, strict=True)]
        cache.update((row["key"], row["answer_ids"]) for row in new)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a", encoding="utf-8") as handle:
                handle.writelines(json.dumps(r) + "\n" for r in new)
        last_s = time.perf_counter() - begun
        if batch_seconds is not None:
            batch_seconds.append(last_s)
    if skipped:
        warnings.warn(f"generate_answers: time budget of {time_budget_s:.3g} s reached; {skipped} of "
                      f"{len(prompt_ids)} prompts have no answer (raise the time budget, data.mix.chat_time_budget_s, "
                      "or ask for fewer prompts, data.mix.chat_prompts / chat_long_prompts)", stacklevel=3)
    return [cache.get(k) for k in keys]


def _generate(target, prompts: list[list[int]], max_new_tokens: int, stops: set[int], pad: int) -> list[list[int]]:
    """Greedy answers by `target.generate` on one left-padded batch (no logits processors), cut after a stop."""
    from transformers import GenerationConfig

    ids, pads = left_pad(prompts, pad)
    mask = (torch.arange(ids.shape[1]) >= torch.tensor(pads).view(-1, 1)).long()  # 0 on the padding
    device = next(target.parameters()).device
    # the model's own generation_config would fill every field a passed one leaves at its default (a hub config's
    # repetition penalty among them): swap in a neutral one for the call
    saved = target.generation_config
    target.generation_config = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=pad,
                                                eos_token_id=sorted(stops) or None)
    try:
        out = target.generate(input_ids=ids.to(device), attention_mask=mask.to(device))
    finally:
        target.generation_config = saved
    return [cut_after_stop(row, stops) for row in out[:, ids.shape[1] :].tolist()]


def chat_distill_rows(prompt_ids: Sequence[list[int]], answers: Sequence[list[int] | None], loss: str = "answer",
                      max_length: int | None = None) -> list[dict]:
    """Training rows from prompts and the target's answers (prompts without an answer are dropped).

    Args:
        prompt_ids: rendered prompt ids (`render_prompts`).
        answers: answer ids (`generate_answers`), None = no answer.
        loss: "answer" (labels -100 on the prompt) or "all" (every position labelled).
        max_length: keep at most the LAST this many tokens of a row (the answer survives; None = whole row).
    Returns: [{"input_ids": list[int], "labels": list[int]}].
    Raises: ValueError for an unknown `loss` or mismatched lengths.
    Reference: LongSpec §4.1; reference spec §4.6 (answer-only labels of the LongSFT / LongCoT collators).
    """
    if loss not in ("answer", "all"):
        raise ValueError(f"loss must be 'answer' (prompt masked) or 'all' (every position), got {loss!r}")
    if len(prompt_ids) != len(answers):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(answers)} answers")
    rows = []
    for prompt, answer in zip(prompt_ids, answers, strict=True):
        if not answer:
            continue
        ids = list(prompt) + list(answer)
        labels = ids.copy() if loss == "all" else [-100] * len(prompt) + list(answer)
        if max_length is not None:
            ids, labels = ids[-max_length:], labels[-max_length:]
        rows.append({"input_ids": ids, "labels": labels})
    return rows
