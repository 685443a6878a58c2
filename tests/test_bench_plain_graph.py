"""`plain_graph`, the strongest plain baseline: its greedy output is `generate`'s, on tiny targets of every family
and on the real SmolLM2 (CPU: the step runs eagerly; CUDA: replayed from a graph, compiled or not)."""

import pytest
import torch

from transformers_longspec.bench import BenchConfig, BenchModels, PlainGraphLoop, Prompt, run_bench
from transformers_longspec.bench.plain_graph import CAPACITY_STEP, EOS_CHECK_EVERY
from transformers_longspec.demo import eval_prompt

from tiny_models import make_target


def _random_ids(n: int, seed: int, device="cpu") -> torch.Tensor:
    return torch.randint(3, 99, (1, n), generator=torch.Generator().manual_seed(seed)).to(device)


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
def test_equals_generate_on_tiny_targets(family):
    target = make_target(family)
    loop = PlainGraphLoop(target)
    for seed, (length, new) in enumerate([(40, 1), (40, 5), (300, EOS_CHECK_EVERY + 3), (600, 21), (12, 20)]):
        ids = _random_ids(length, seed)
        plain = target.generate(ids, do_sample=False, max_new_tokens=new)
        out = loop(ids, new)
        assert torch.equal(out, plain), (family, length, new)
        produced = out.shape[1] - length  # stopped at an EOS: at most a chunk of steps past it
        assert loop.forwards == new or produced <= loop.forwards < produced + EOS_CHECK_EVERY
        assert loop.capacity % CAPACITY_STEP == 0 and loop.capacity >= length + new


def test_stops_after_eos_like_generate():
    target = make_target("llama")
    ids = _random_ids(30, 7)
    free = target.generate(ids, do_sample=False, max_new_tokens=24)
    for index in (0, 3, EOS_CHECK_EVERY + 2):  # EOS as the prefill's token, inside the first chunk, in a later one
        target.generation_config.eos_token_id = int(free[0, ids.shape[1] + index])
        plain = target.generate(ids, do_sample=False, max_new_tokens=24)
        out = PlainGraphLoop(target)(ids, 24)
        assert torch.equal(out, plain) and out.shape[1] <= ids.shape[1] + index + 1


def test_refuses_what_it_does_not_apply():
    target = make_target("llama")
    target.generation_config.repetition_penalty = 1.1
    with pytest.raises(ValueError, match="repetition_penalty"):
        PlainGraphLoop(target)
    target.generation_config.repetition_penalty = 1.0
    loop = PlainGraphLoop(target)
    with pytest.raises(ValueError, match="one unpadded sequence"):
        loop(_random_ids(8, 0).repeat(2, 1), 4)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1"):
        loop(_random_ids(8, 0), 0)


def test_harness_row_is_a_baseline_with_tau_one():
    target = make_target("qwen2")
    prompts = [Prompt("p0", "random", 64, _random_ids(50, 3))]
    config = BenchConfig(methods=("sdpa", "plain_graph"), max_new_tokens=9)
    rows, notes = run_bench(BenchModels(target), prompts, config)
    plain = {r.method: r for r in rows}["plain_graph"]
    assert notes == [] and plain.is_baseline and plain.identical is True and plain.error is None
    assert plain.new_tokens == 9 and plain.target_forwards == 9 and plain.tau == 1.0 and plain.compile_s > 0


@pytest.mark.slow
def test_equals_generate_on_real_smollm2(smollm2, eval_rows):
    target, tokenizer = smollm2
    loop = PlainGraphLoop(target)
    rows = eval_rows("code_completion", 2) + eval_rows("summarization", 1)
    prompts = [eval_prompt(row, tokenizer, 320) for row in rows]
    chat = [{"role": "user", "content": "What is 2+2? Reply with one word."}]  # a short answer: EOS inside the budget
    prompts.append(torch.tensor([tokenizer.apply_chat_template(chat, add_generation_prompt=True,
                                                               return_dict=True)["input_ids"]]))
    hit_eos = False
    for ids in prompts:
        plain = target.generate(ids, do_sample=False, max_new_tokens=24)
        assert torch.equal(loop(ids, 24), plain)
        hit_eos |= plain.shape[1] < ids.shape[1] + 24
    assert hit_eos


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("compile", [False, True])
def test_graph_replay_equals_generate_on_cuda(compile):
    target = make_target("llama").cuda()
    loop = PlainGraphLoop(target, compile=compile)
    for seed, (length, new) in enumerate([(100, 30), (90, 17), (700, 12)]):  # the third one recaptures
        ids = _random_ids(length, seed, "cuda")
        assert torch.equal(loop(ids, new), target.generate(ids, do_sample=False, max_new_tokens=new))
