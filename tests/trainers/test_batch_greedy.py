"""Batched static-cache greedy answers = one-by-one `generate` greedy, on tiny targets of every family."""

import pytest
import torch

from transformers_longspec.trainers.batch_greedy import batch_greedy, batch_greedy_unsupported

from tiny_models import FAMILIES, make_target


def _alone(target, prompt, new, stops):
    out = target.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=new, pad_token_id=0,
                          eos_token_id=None)[0, len(prompt):].tolist()
    end = next((t + 1 for t, tok in enumerate(out) if tok in stops), len(out))
    return out[:end]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_left_padded_batch_equals_one_by_one_greedy(family):
    torch.set_num_threads(1)
    target = make_target(family, seed=3)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(4, 99, (n,), generator=gen).tolist() for n in (5, 31, 1, 18)]
    # chunked prefill (3 prompt tokens per forward across the batch of 4: chunks of 1 slot) and one long chunk
    for prefill_tokens in (3, 4096):
        answers = batch_greedy(target, prompts, max_new_tokens=20, prefill_tokens=prefill_tokens, check_every=3)
        assert answers == [_alone(target, p, 20, set()) for p in prompts]


def test_answers_stop_after_their_first_stop_token():
    target = make_target("qwen2", seed=1)
    prompts = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
    free = batch_greedy(target, prompts, max_new_tokens=24)
    stop = free[1][3]  # a token the second answer writes: it ends there, and wherever the others write it
    answers = batch_greedy(target, prompts, max_new_tokens=24, stop_ids=[stop], check_every=5)
    for full, cut in zip(free, answers, strict=True):
        end = full.index(stop) + 1 if stop in full else len(full)
        assert cut == full[:end]
    assert answers[1] == free[1][:4] and answers[1][-1] == stop
    assert batch_greedy(target, prompts, max_new_tokens=1) == [a[:1] for a in free]


def test_refuses_bad_input_and_rolling_caches():
    target = make_target("llama")
    for prompts, new, match in (([], 4, "at least one prompt"), ([[5], []], 4, "no empty prompt"),
                                ([[5]], 0, "max_new_tokens"), ([[5]], 2.0, "ints >= 1"),
                                (torch.tensor([[5, 6]]), 4, "not a tensor")):
        with pytest.raises(ValueError, match=match):
            batch_greedy(target, prompts, new)
    with pytest.raises(ValueError, match="pad_token_id must be a token id"):
        batch_greedy(target, [[5]], 4, pad_token_id=None)
    assert batch_greedy(target, [[5, 6]], 6, stop_ids=None) == batch_greedy(target, [[5, 6]], 6)
    first = batch_greedy(target, [[5, 6]], 6)[0]
    assert batch_greedy(target, [[5, 6]], 6, stop_ids=first[1]) == [first[: first.index(first[1]) + 1]]
    assert batch_greedy_unsupported(target) is None
    windowed = make_target("mistral", sliding_window=8)
    assert "sliding window of 8" in batch_greedy_unsupported(windowed)
    with pytest.raises(ValueError, match="use target.generate"):
        batch_greedy(windowed, [[5, 6]], 4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (the captured step)")
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_replayed_step_equals_one_by_one_greedy_on_cuda(family):
    target = make_target(family, seed=4).cuda()
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(4, 99, (n,), generator=gen).tolist() for n in (9, 40, 3)]
    stop = batch_greedy(target, prompts, 30, cuda_graph=False)[0][5]
    answers = batch_greedy(target, prompts, 30, stop_ids=[stop], prefill_tokens=16)
    with torch.device("cuda"):
        assert answers == [_alone(target, p, 30, {stop}) for p in prompts]
    assert answers == batch_greedy(target, prompts, 30, stop_ids=[stop], cuda_graph=False)
