"""Exactness first: generate with a LongSpec draft returns the same token ids as plain greedy generate."""

import warnings

import pytest
import torch
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

from transformers_longspec import LongSpecDraft, static_step
from transformers_longspec import generation as generation_module
from transformers_longspec.tree import DraftTree, best_nodes, tree_layout

from tiny_models import make_target

SHAPES = [(4, 16, 16, 16, 16), (1, 1, 1, 1), (), (3, 2), (2, 5, 1)]


def _prompt(seed: int, length: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 99, (1, length), generator=g)


def _both(target, draft, ids, longspec_kwargs=None, **kwargs):
    plain = target.generate(ids, do_sample=False, **kwargs)
    spec = target.generate(ids, assistant_model=draft, do_sample=False, **(longspec_kwargs or {}), **kwargs)
    return plain, spec


@pytest.mark.parametrize("widths", SHAPES, ids=str)
def test_untrained_draft_matches_greedy(family, widths):
    target = make_target(family)
    draft = LongSpecDraft.from_target(target, beam_widths=list(widths) or [1], init_from_target=False)
    for seed, length in [(0, 5), (1, 40), (2, 300)]:
        ids = _prompt(seed, length)
        plain, spec = _both(target, draft, ids, {"longspec_beam_widths": list(widths)}, max_new_tokens=24)
        assert torch.equal(plain, spec), (family, widths, seed)
    stats = draft.last_generation_stats
    assert stats.beam_widths == widths and stats.new_tokens == 24
    # the prefill emits one token, each verification step at least one (the last may be cut by max_new_tokens)
    assert sum(stats.accepted_lengths[:-1]) + 1 < 24 <= sum(stats.accepted_lengths) + 1


class _OracleTree:
    """Puts the true greedy continuation on the last branch of every depth: the accept-all path."""

    def __init__(self, continuation: torch.Tensor, widths):
        self.continuation, self.widths = continuation, widths

    def __call__(self, draft, ring, root, root_position, target_keys, target_values, beam_widths, **kwargs):
        root_position = int(root_position)  # a device scalar with static shapes (CPU here: no graph to break)
        depths, ranges = tree_layout(beam_widths)
        size = depths.numel()
        g = torch.Generator().manual_seed(root_position)
        tokens = torch.randint(3, 99, (size,), generator=g)
        parents = torch.full((size,), -1, dtype=torch.long)
        ancestors = torch.eye(size, dtype=torch.bool)
        tokens[0] = root[0]
        for d in range(1, len(beam_widths) + 1):
            (ps, pe), (s, e) = ranges[d - 1], ranges[d]
            parents[s:e] = torch.randint(ps, pe, (e - s,), generator=g)
            parents[e - 1] = pe - 1  # last node of each depth chains from the previous depth's last node
            if root_position + d < self.continuation.numel():
                tokens[e - 1] = self.continuation[root_position + d]
            # children of one parent must carry distinct tokens
            for i in range(s, e - 1):
                while any(tokens[i] == tokens[j] and parents[i] == parents[j] for j in range(s, e) if j != i):
                    tokens[i] = (tokens[i] + 1) % 99
            ancestors[s:e] |= ancestors[parents[s:e]]
        return DraftTree(tokens, parents, depths, ancestors, torch.zeros(size))


@pytest.fixture
def small_tail(monkeypatch):
    """Static-shape buckets of 8 tokens, so that a short generation crosses several of them."""
    monkeypatch.setattr(static_step, "TAIL", 8)


@pytest.mark.parametrize("widths", SHAPES, ids=str)
def test_static_shapes_match_greedy(family, widths, small_tail):
    target = make_target(family)
    draft = LongSpecDraft.from_target(target, beam_widths=list(widths) or [1], init_from_target=False)
    options = {"longspec_beam_widths": list(widths), "longspec_static_shapes": True}
    engines = set()
    for seed, length in [(2, 300), (1, 40), (0, 5)]:
        ids = _prompt(seed, length)
        plain, spec = _both(target, draft, ids, options, max_new_tokens=24)
        assert torch.equal(plain, spec), (family, widths, seed)
        engines.add(id(draft.__dict__["_static_step"]))
    assert len(engines) == 1  # the buffers sized for the longest call were reused by the shorter ones
    draft.free_static_buffers()
    assert "_static_step" not in draft.__dict__


def test_calls_of_similar_length_share_the_static_engine(small_tail):
    """A 1-token call then a 64-token call on one prompt (what a benchmark's T(1), T(N) do): one engine, so the
    graphs captured by the first call serve the second (its buffers come in steps of CAPACITY_STEP tokens)."""
    target = make_target("llama")
    draft = LongSpecDraft.from_target(target)
    ids = _prompt(4, 100)  # the two calls need 247 and 310 rows: different engines if buffers came in 256s
    options = {"longspec_static_shapes": True}
    _both(target, draft, ids, options, max_new_tokens=1)
    engine = draft.__dict__["_static_step"]
    plain, spec = _both(target, draft, ids, options, max_new_tokens=64)
    assert torch.equal(plain, spec) and draft.__dict__["_static_step"] is engine
    assert engine.capacity % static_step.CAPACITY_STEP == 0


def test_compiled_static_step_matches_greedy(small_tail):
    """`longspec_compile=True` (the default on a GPU): the draft side of the step and the target's decoder layers run
    as torch.compile regions; tokens equal plain greedy, later calls (new prompt, new buckets) reuse the compiled code,
    and the models are left uncompiled afterwards."""
    from torch._dynamo.utils import counters

    target = make_target("qwen2", num_hidden_layers=3)
    draft = LongSpecDraft.from_target(target, beam_widths=[4, 4, 4])
    # a named tree: the default-tree policy may choose another shape for the second call (a new draft-phase graph)
    options = {"longspec_static_shapes": True, "longspec_compile": True, "longspec_beam_widths": [4, 4, 4],
               "longspec_retrieval": 6}
    before = counters["stats"]["unique_graphs"]
    plain, spec = _both(target, draft, _prompt(2, 60), options, max_new_tokens=40)
    assert torch.equal(plain, spec)
    compiled = counters["stats"]["unique_graphs"]
    assert compiled > before  # the regions were compiled
    plain, spec = _both(target, draft, _prompt(5, 90), options, max_new_tokens=40)
    assert torch.equal(plain, spec)
    assert counters["stats"]["unique_graphs"] == compiled  # no recompilation for a new prompt and new buckets
    assert all("forward" not in vars(m) for m in target.modules()) and "step" not in vars(draft)


def test_compile_failure_falls_back_with_a_warning(small_tail, monkeypatch):
    """A model torch.compile cannot handle: one RuntimeWarning naming the fix, then the same tokens as plain greedy
    without the compiled regions (the engine remembers; the next call does not warn again)."""
    import torch._dynamo

    def untraceable(*args, **kwargs):
        raise torch._dynamo.exc.TorchDynamoException("simulated: dynamo cannot trace this model")

    def regions(target):
        return {cls: (name, untraceable) for cls, (name, _) in real(target).items()}

    real = static_step._compile_regions
    monkeypatch.setattr(static_step, "_compile_regions", regions)
    monkeypatch.setattr(static_step, "_compile_draft_phase", lambda: untraceable)
    target = make_target("mistral")
    draft = LongSpecDraft.from_target(target, beam_widths=[3, 3])
    options = {"longspec_static_shapes": True, "longspec_compile": True, "longspec_beam_widths": [3, 3]}
    with pytest.warns(RuntimeWarning, match="longspec_compile=False"):
        plain, spec = _both(target, draft, _prompt(6, 50), options, max_new_tokens=20)
    assert torch.equal(plain, spec) and len(draft.last_generation_stats.accepted_lengths) > 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plain, spec = _both(target, draft, _prompt(7, 30), options, max_new_tokens=20)
    assert torch.equal(plain, spec)
    assert all("forward" not in vars(m) for m in target.modules()) and "step" not in vars(draft)


def _generate_with_oracle(target, draft, ids, oracle, monkeypatch, **options):
    """40 greedy tokens with `oracle` growing every tree (the eager and the static-shape decode loops alike)."""
    monkeypatch.setattr(generation_module, "grow_tree", oracle)
    monkeypatch.setattr(static_step, "grow_tree", oracle)
    return target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=40, **options)


@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
@pytest.mark.parametrize("widths", [(4, 16, 16, 16, 16), (1, 1, 1), (3, 2)], ids=str)
def test_oracle_draft_accepts_deep_paths_and_matches_greedy(family, widths, static, small_tail, monkeypatch):
    target = make_target(family)
    draft = LongSpecDraft.from_target(target, beam_widths=list(widths))
    ids = _prompt(7, 50)
    plain = target.generate(ids, do_sample=False, max_new_tokens=40)
    spec = _generate_with_oracle(target, draft, ids, _OracleTree(plain[0], widths), monkeypatch,
                                 longspec_static_shapes=static, longspec_beam_widths=list(widths))
    assert torch.equal(plain, spec)
    lengths = draft.last_generation_stats.accepted_lengths
    assert max(lengths) == len(widths) + 1  # full-depth acceptance happened
    assert draft.last_generation_stats.tau > 2


class _RankedOracle(_OracleTree):
    """The oracle tree with scores that rank its accept-all chain (the last node of every depth) above every other
    node, reranked to `nodes` drafted nodes by `best_nodes` as `grow_tree(nodes=...)` does: the kept tree is no
    longer laid out depth by depth."""

    def __call__(self, *args, nodes=None, **kwargs):
        tree = super().__call__(*args, **kwargs)
        _, ranges = tree_layout(self.widths)
        cost = 1 + torch.rand(tree.size, generator=torch.Generator().manual_seed(tree.size))
        cost[0] = 0
        cost[[end - 1 for _, end in ranges[1:]]] = 0.01
        tree.scores = -(tree.ancestors.float() @ cost)  # a child never scores above its parent
        return tree if nodes is None or nodes >= tree.size - 1 else best_nodes(tree, nodes)


@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
@pytest.mark.parametrize("widths, nodes", [((4, 16, 16, 16, 16), 12), ((3, 2), 2)], ids=str)
def test_tree_nodes_accept_deep_reranked_paths_and_match_greedy(family, widths, nodes, static, small_tail,
                                                                 monkeypatch):
    """`longspec_tree_nodes`: the verified tree is the best `nodes` of the grown one, nodes ordered by score rather
    than by depth; the decode loop (eager and static) still accepts full-depth paths and emits plain greedy's ids."""
    target = make_target(family)
    draft = LongSpecDraft.from_target(target, beam_widths=list(widths))
    ids = _prompt(7, 50)
    plain = target.generate(ids, do_sample=False, max_new_tokens=40)
    spec = _generate_with_oracle(target, draft, ids, _RankedOracle(plain[0], widths), monkeypatch,
                                 longspec_static_shapes=static, longspec_beam_widths=list(widths),
                                 longspec_tree_nodes=nodes)
    assert torch.equal(plain, spec)
    stats = draft.last_generation_stats
    assert stats.tree_nodes == nodes and max(stats.accepted_lengths) == len(widths) + 1


@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
def test_tree_nodes_match_greedy(family, static, small_tail):
    """A real (untrained) draft's trees reranked to 1, 20 and 67 of 68 nodes; 68 or more verifies the whole shape."""
    target = make_target(family)
    draft = LongSpecDraft.from_target(target, beam_widths=[4, 16, 16, 16, 16])
    for nodes in (1, 20, 67, 68, 500):
        for seed, length in [(0, 5), (2, 300)]:
            ids = _prompt(seed, length)
            plain, spec = _both(target, draft, ids, {"longspec_tree_nodes": nodes, "longspec_static_shapes": static},
                                max_new_tokens=24)
            assert torch.equal(plain, spec), (family, nodes, seed)
        assert draft.last_generation_stats.tree_nodes == (nodes if nodes < 68 else None)
        assert draft.last_generation_stats.beam_widths == (4, 16, 16, 16, 16)  # the draft's shape, no policy


def test_compiled_step_with_tree_nodes_matches_greedy(small_tail):
    """Reranking inside the compiled draft region (a stable sort and gathers, what a GPU step replays) with the
    retrieval branch after the kept nodes."""
    target = make_target("qwen2", num_hidden_layers=3)
    draft = LongSpecDraft.from_target(target, beam_widths=[4, 4, 4])
    options = {"longspec_static_shapes": True, "longspec_compile": True, "longspec_beam_widths": [6, 6, 6, 6],
               "longspec_tree_nodes": 9, "longspec_retrieval": 6}
    for seed, length in [(2, 60), (5, 90)]:
        plain, spec = _both(target, draft, _prompt(seed, length), options, max_new_tokens=40)
        assert torch.equal(plain, spec)
    assert draft.last_generation_stats.tree_nodes == 9


def test_best_nodes_keeps_the_highest_scoring_whole_paths(monkeypatch):
    """Reranking real grown trees: the n kept drafted nodes carry the n highest scores of the tree, each comes after
    its parent, and each keeps its path (tokens root → node) and score from the grown tree."""
    target = make_target("qwen2")
    draft = LongSpecDraft.from_target(target, beam_widths=[4, 16, 16, 16, 16])
    grown, real = [], generation_module.grow_tree

    def keep_grown(*args, **kwargs):
        grown.append(real(*args, **kwargs))
        return grown[-1]

    monkeypatch.setattr(generation_module, "grow_tree", keep_grown)
    target.generate(_prompt(3, 60), assistant_model=draft, do_sample=False, max_new_tokens=6,
                    longspec_beam_widths=[4, 16, 16, 16, 16])
    assert grown
    for full in grown:
        paths = {tuple(row[:int(d)].tolist()): float(score)
                 for row, d, score in zip(full.path_tokens(), full.depths, full.scores, strict=True)}
        for n in (1, 5, 30, 67):
            kept = best_nodes(full, n)
            assert kept.size == n + 1 and int(kept.depths[0]) == 0 and int(kept.parents[0]) == -1
            assert torch.equal(kept.scores[1:].sort(descending=True).values,
                               full.scores[1:].sort(descending=True).values[:n])
            assert (kept.parents[1:] >= 0).all() and (kept.parents[1:] < torch.arange(1, n + 1)).all()
            assert torch.equal(kept.depths[1:], kept.depths[kept.parents[1:]] + 1)
            for row, d, score in zip(kept.path_tokens(), kept.depths, kept.scores, strict=True):
                assert paths[tuple(row[:int(d)].tolist())] == float(score)


def test_max_new_tokens_one_and_eos(family):
    target = make_target(family, seed=3)
    draft = LongSpecDraft.from_target(target)
    ids = _prompt(11, 30)
    plain, spec = _both(target, draft, ids, max_new_tokens=1)
    assert torch.equal(plain, spec) and spec.shape[1] == 31
    free = target.generate(ids, do_sample=False, max_new_tokens=30)
    eos = int(free[0, 30 + 12])  # a token greedy decoding emits: make it the EOS
    plain, spec = _both(target, draft, ids, max_new_tokens=30, eos_token_id=eos, pad_token_id=0)
    assert torch.equal(plain, spec)
    assert spec.shape[1] < free.shape[1] and int(spec[0, -1]) == eos


def test_custom_stopping_criteria_and_scores(family):
    target = make_target(family, seed=5)
    draft = LongSpecDraft.from_target(target)
    ids = _prompt(13, 20)

    class StopAfterSeven(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), input_ids.shape[1] >= 27, dtype=torch.bool)

    kwargs = dict(max_new_tokens=30, stopping_criteria=StoppingCriteriaList([StopAfterSeven()]),
                  return_dict_in_generate=True, output_scores=True, output_logits=True)
    plain, spec = _both(target, draft, ids, **kwargs)
    assert torch.equal(plain.sequences, spec.sequences) and spec.sequences.shape[1] == 27
    assert len(spec.scores) == len(plain.scores) == 7
    for a, b in zip(plain.scores, spec.scores):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_logits_processors_per_node(family):
    target = make_target(family, seed=9)
    draft = LongSpecDraft.from_target(target, beam_widths=[3, 3, 3])
    ids = _prompt(17, 25)
    config = GenerationConfig(max_new_tokens=30, do_sample=False, repetition_penalty=1.7, no_repeat_ngram_size=2,
                              min_new_tokens=10, eos_token_id=2, pad_token_id=0)
    plain, spec = _both(target, draft, ids, generation_config=config)
    assert torch.equal(plain, spec)


def test_generation_config_tree_shape(family):
    target = make_target(family)
    draft = LongSpecDraft.from_target(target)
    ids = _prompt(3, 12)
    config = GenerationConfig(max_new_tokens=8, do_sample=False, longspec_beam_widths=[2, 2],
                              longspec_static_shapes=True)
    out = target.generate(ids, assistant_model=draft, generation_config=config)
    assert torch.equal(out, target.generate(ids, generation_config=config))
    assert draft.last_generation_stats.beam_widths == (2, 2) and "_static_step" in draft.__dict__  # config options
    draft.free_static_buffers()
    out = target.generate(ids, assistant_model=draft, generation_config=config, longspec_static_shapes=False)
    assert torch.equal(out, target.generate(ids, generation_config=config))
    assert "_static_step" not in draft.__dict__  # the call's option wins over the config's


def test_static_buffers_follow_new_weights(small_tail):
    """The static-shape engine (and its CUDA graphs on a GPU) is rebuilt when the models' weights are replaced."""
    target = make_target("llama")
    draft = LongSpecDraft.from_target(target)
    ids = _prompt(4, 30)
    target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=8, longspec_static_shapes=True)
    engine = draft.__dict__["_static_step"]
    with torch.no_grad():
        target.lm_head.weight = torch.nn.Parameter(target.lm_head.weight.flip(0).clone())  # new weights, new storage
    spec = target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=8, longspec_static_shapes=True)
    assert draft.__dict__["_static_step"] is not engine
    assert torch.equal(spec, target.generate(ids, do_sample=False, max_new_tokens=8))
