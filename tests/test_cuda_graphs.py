"""CUDA-graph-replayed LongSpec steps (GPU only): exact against plain greedy, and replays equal eager runs."""

import pytest
import torch

from transformers_longspec import LongSpecDraft, static_step
from transformers_longspec import generation as generation_module

from tiny_models import make_target

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")


def _prompt(seed: int, length: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 99, (1, length), generator=g).cuda()


# Compiling the draft phase costs tens of seconds per tree shape and model: the tests of graphs run without the
# compiled regions (longspec_compile=False) except where compiling is what they test.
UNCOMPILED = {"longspec_compile": False}


@pytest.fixture
def small_tail(monkeypatch):
    monkeypatch.setattr(static_step, "TAIL", 16)  # many buckets, so many captures and replays per generation


@pytest.mark.parametrize("widths", [(4, 16, 16, 16, 16), (1, 1, 1), (3, 2)], ids=str)
def test_graphs_match_plain_greedy_fp32(family, widths, small_tail):
    target = make_target(family).cuda()
    draft = LongSpecDraft.from_target(target, beam_widths=list(widths), init_from_target=False).cuda()
    for seed, length in [(2, 300), (1, 40), (0, 5)]:
        ids = _prompt(seed, length)
        plain = target.generate(ids, do_sample=False, max_new_tokens=64)
        spec = target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=64, **UNCOMPILED)
        assert torch.equal(plain, spec), (family, widths, seed)
    engine = draft.__dict__["_static_step"]
    assert engine.cuda_graphs and len(engine._graphs) >= 4  # several buckets captured, and replayed since
    stats = draft.last_generation_stats  # the steps that captured a bucket's graphs are counted apart
    assert stats.capture_steps >= 1 and stats.capture_s > 0 and stats.draft_s > 0


@pytest.mark.parametrize("layers", [None, [0]], ids=["final", "feature_layers"])
@pytest.mark.parametrize("processor", [False, True], ids=["on_device_acceptance", "host_acceptance"])
def test_feature_draft_graphs_match_plain_greedy(family, processor, layers, small_tail):
    """A draft reading the target's hidden state (`target_hidden_input`; with `target_feature_layers`, a decoder
    layer's output too), with the retrieval branch: the state lives in graph buffers (written by the acceptance graph,
    or copied after host acceptance with a logits processor)."""
    target = make_target(family).cuda()
    draft = LongSpecDraft.from_target(target, target_hidden_input=True, target_feature_layers=layers).cuda()
    with torch.no_grad():
        draft.block.hidden_proj.weight.normal_(0.0, 0.5)
        if layers:
            draft.block.feature_proj.weight.normal_(0.0, 0.5)
    extra = {"repetition_penalty": 1.2} if processor else {}
    for seed, length in [(2, 300), (0, 5)]:
        ids = _prompt(seed, length).repeat(1, 2)
        plain = target.generate(ids, do_sample=False, max_new_tokens=64, **extra)
        spec = target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=64, **extra, **UNCOMPILED)
        assert torch.equal(plain, spec), (family, processor, layers, seed)
    assert len(draft.__dict__["_static_step"]._graphs) >= 4


@pytest.mark.parametrize("family,compile", [("llama", False), ("mistral", False), ("qwen2", True)])
def test_draft_vocabulary_graphs_match_plain_greedy(family, compile, small_tail):
    """A draft with its own vocabulary (`vocabulary.py`): the LM-head rows live in a graph-read buffer refilled per
    call, so the graphs captured for one prompt serve the next prompt's vocabulary."""
    target = make_target(family).cuda()
    draft = LongSpecDraft.from_target(target, target_hidden_input=True).cuda()
    draft.set_draft_vocabulary(torch.arange(30, 80))
    for seed, length in [(2, 300), (3, 290), (0, 5)]:
        ids = _prompt(seed, length)
        plain = target.generate(ids, do_sample=False, max_new_tokens=64)
        spec = target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=64,
                               longspec_compile=compile)
        assert torch.equal(plain, spec), (family, compile, seed)
        assert draft.last_generation_stats.draft_vocab_tokens == 50 + len(set(ids[0].tolist()) - set(range(30, 80)))
    assert len(draft.__dict__["_static_step"]._graphs) >= 4


def test_graph_replay_equals_eager_static_bf16(small_tail, monkeypatch):
    """Same kernels, same static layout: replayed graphs give bit-identical tokens to running the code eagerly."""
    target = make_target("qwen2", hidden_size=128, num_attention_heads=4, intermediate_size=256).cuda().bfloat16()
    draft = LongSpecDraft.from_target(target, init_from_target=False).cuda().bfloat16()
    ids = _prompt(5, 200)
    graphed = target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=96)
    stats = draft.last_generation_stats
    assert stats.draft_s > 0 and stats.verify_s > 0

    def without_graphs(target, draft, widths, retrieval_tokens, capacity, compile, draft_vocab=False):
        return static_step.StaticTreeStep(target, draft, widths, capacity, cuda_graphs=False, compile=compile,
                                          retrieval_tokens=retrieval_tokens, draft_vocab=draft_vocab)

    monkeypatch.setattr(generation_module, "_static_engine", without_graphs)
    eager = target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=96)
    assert torch.equal(graphed, eager)


@pytest.mark.parametrize("compile", [False, True])
def test_graphs_with_and_without_compile_match_plain_greedy(compile, small_tail):
    target = make_target("qwen2", num_hidden_layers=4).cuda()
    draft = LongSpecDraft.from_target(target, init_from_target=False).cuda()
    for seed, length in [(4, 120), (6, 33)]:
        ids = _prompt(seed, length)
        plain = target.generate(ids, do_sample=False, max_new_tokens=80)
        spec = target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=80,
                               longspec_compile=compile)
        assert torch.equal(plain, spec), (compile, seed)
    engine = draft.__dict__["_static_step"]
    assert engine.compile is compile and len(engine._graphs) >= 4
    assert all("forward" not in vars(m) for m in target.modules()) and "step" not in vars(draft)


def test_sampling_with_graphs_is_seeded(small_tail):
    target = make_target("llama").cuda()
    draft = LongSpecDraft.from_target(target, init_from_target=False).cuda()
    ids = _prompt(3, 50)
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        runs.append(target.generate(ids, assistant_model=draft, do_sample=True, temperature=0.7, max_new_tokens=40))
    assert torch.equal(runs[0], runs[1])
