"""The default tree: predicted τ and its inverse, the choice under GPU-like and CPU-like costs, learning from calls,
measured costs on a real tiny target, and a default-tree call that reports its shape and equals plain greedy."""

import math

import pytest
import torch

from transformers_longspec import LongSpecDraft, tree_policy
from transformers_longspec.tree_policy import LADDER, TreeCosts, TreePolicy, acceptance_from_tau, expected_tau

from tiny_models import make_target

DEFAULT = (4, 16, 16, 16, 16)


def linear_costs(target, draft, candidates) -> TreeCosts:
    """CPU-like: a verification costs as many plain steps as it has tokens; a draft depth a third of one per node."""
    return TreeCosts(verify={1: 1.0, 160: 160.0}, draft={w: sum(w) / 3 for w in candidates if w})


def test_expected_tau_grows_with_acceptance_and_width():
    assert expected_tau((), 0.9) == 1.0 and expected_tau((), 0.9, 0.5) == 1.5
    assert expected_tau((1, 1, 1), 0.5) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    for widths in LADDER[1:]:
        assert expected_tau(widths, 0.3) < expected_tau(widths, 0.6) < 1 + len(widths)
    assert expected_tau((4, 16, 16, 16, 16), 0.4) > expected_tau((1, 1, 1, 1, 1), 0.4)
    for tau in (1.3, 2.0, 2.9):
        p = acceptance_from_tau(DEFAULT, tau)
        assert expected_tau(DEFAULT, p) == pytest.approx(tau, abs=1e-6)
    assert math.isnan(acceptance_from_tau((), 1.0))


def test_reranked_tau_keeps_the_most_probable_paths():
    """The path-probability model by hand: at p = 0.5 the draft's second choice (q2 = F(2) - p = 0.125) is less
    probable than two first choices in a row (0.25), so the best 2 of `(2, 2)` are the chain; at p = 0.2 (q2 = 0.070,
    two first choices 0.04) they are the two first-depth choices. Reranking never predicts less than the shape whole
    at the same verified size, and `acceptance_from_tau` inverts it."""
    q2 = (1 - 0.5 ** math.sqrt(2)) - 0.5
    assert expected_tau((2, 2), 0.5) == pytest.approx(1 + 0.5 + q2 + 0.25 + 0.5 * q2)
    assert expected_tau((2, 2), 0.5, nodes=2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tau((2, 2), 0.2, nodes=2) == pytest.approx(1 + (1 - 0.8 ** math.sqrt(2)))
    assert expected_tau((2, 2), 0.5, nodes=4) == expected_tau((2, 2), 0.5)
    grown, nodes = tree_policy.reranked(DEFAULT)
    assert (grown, nodes) == ((16,) * 5, 68) and tree_policy.reranked((4, 4, 4, 4)) is None
    assert tree_policy.reranked((2, 16), vocab_size=12) is None  # a first depth of 16 cannot be grown from 12 tokens
    assert TreePolicy((2, 16), vocab_size=12).variants == {}
    with pytest.raises(ValueError, match="probability"):
        expected_tau(DEFAULT, 1.5)
    for p in (0.2, 0.45, 0.7):
        assert expected_tau(grown, p, nodes=nodes) > expected_tau(DEFAULT, p)
        assert acceptance_from_tau(grown, expected_tau(grown, p, nodes=nodes), nodes=nodes) == pytest.approx(p)


def test_reranked_variant_where_growing_it_costs_little():
    """GPU-like costs (a verification of any size one plain step, the draft 1% per depth whatever its width): the
    reranked variant of the largest tree verifies as many tokens with more of them accepted, and wins. CPU-like costs
    (each drafted token a third of a plain step): growing 80 nodes to verify 68 does not pay."""
    target = make_target("llama")
    draft = LongSpecDraft.from_target(target, init_from_target=False)
    key = (id(target), torch.device("cpu"), torch.float32)
    gpu = TreePolicy(DEFAULT)
    assert set(gpu.shapes) == set(gpu.candidates) | {(8, 8, 8, 8), (16,) * 5}
    gpu.costs[key] = TreeCosts(verify={1: 1.0, 160: 1.0}, draft={w: 0.01 * len(w) for w in gpu.shapes if w})
    assert gpu.choose(target, draft, (0, 10)) == ((16,) * 5, 10, 68)
    gpu.observe((16,) * 5, 10, [3] * 10, 0, nodes=68)  # the acceptance is learnt through the reranked tree's model
    assert expected_tau((16,) * 5, gpu.acceptance, nodes=68) < expected_tau((16,) * 5, 0.5, nodes=68)
    cpu = TreePolicy(DEFAULT)
    cpu.costs[key] = linear_costs(target, draft, cpu.shapes)
    assert cpu.choose(target, draft, (0,))[2] is None


def test_a_vocabulary_narrower_than_the_variant_keeps_the_shapes_that_fit():
    """A 12-token vocabulary and a draft shape `[2, 16]` (depth 2 may hold 2 x 12 pairs): the reranked variant would
    need 16 tokens at depth 1, so the policy leaves it out and the call stays exact."""
    target = make_target("llama", vocab_size=12)
    draft = LongSpecDraft.from_target(target, init_from_target=False, beam_widths=[2, 16])
    ids = torch.randint(3, 12, (1, 20), generator=torch.Generator().manual_seed(3))
    out = target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=10)
    assert torch.equal(out, target.generate(ids, do_sample=False, max_new_tokens=10))
    assert draft.last_generation_stats.tree_nodes is None


def test_choice_follows_the_costs():
    target = make_target("llama")
    draft = LongSpecDraft.from_target(target, init_from_target=False)
    policy = TreePolicy(DEFAULT)
    policy.costs[(id(target), torch.device("cpu"), torch.float32)] = linear_costs(target, draft, policy.candidates)
    widths, retrieval, nodes = policy.choose(target, draft, (0, 10))
    assert sum(widths) <= 3 and retrieval == 0 and nodes is None  # each extra token a plain step: small or no tree
    policy.acceptance = 0.05  # a draft that is almost never right: plain decoding through the engine
    assert policy.choose(target, draft, (0, 10)) == ((), 0, None)
    flat = TreePolicy(DEFAULT)
    flat.costs = {k: TreeCosts(verify={1: 1.0, 160: 1.0}, draft={w: 0.01 * len(w) for w in flat.candidates if w})
                  for k in policy.costs}
    assert flat.choose(target, draft, (0, 10)) == (DEFAULT, 10, None)  # free verification: the largest, retrieval on


def test_the_previous_choice_stays_unless_another_is_clearly_faster():
    """A new shape costs a compile and new graphs: a shape predicted < SWITCH_GAIN times faster does not replace the
    previous call's; one predicted clearly faster does."""
    target = make_target("llama")
    draft = LongSpecDraft.from_target(target, init_from_target=False)
    policy = TreePolicy(DEFAULT)
    key = (id(target), torch.device("cpu"), torch.float32)
    costs = policy.costs[key] = TreeCosts(verify={1: 1.0, 160: 1.0}, draft={w: 0.5 * len(w) for w in policy.candidates
                                                                            if w})
    first = policy.choose(target, draft, (0,))
    other = next(w for w in policy.candidates if w not in ((), first[0]))

    def make_faster(widths, factor):  # the draft cost at which `widths` is `factor` times the first choice's speed
        target_speed = factor * policy.predicted_speedup(first[0], 0, costs)
        costs.draft[widths] = expected_tau(widths, policy.acceptance) / target_speed - costs.verify_s(1)

    make_faster(other, 1.05)
    assert policy.predicted_speedup(other, 0, costs) > policy.predicted_speedup(first[0], 0, costs)
    assert policy.choose(target, draft, (0,)) == first
    make_faster(other, 1.2)
    assert policy.choose(target, draft, (0,)) == (other, 0, None)


def test_the_prompt_decides_the_retrieval_branch():
    """Under CPU-like costs (a forward over 11 tokens costs ~2.8 plain steps) the policy turns a retrieval branch
    on for a prompt that repeats itself and leaves it off for one that never does, then scales its estimate by what
    calls gained."""
    target = make_target("llama")
    draft = LongSpecDraft.from_target(target, init_from_target=False)
    policy = TreePolicy(DEFAULT)
    policy.costs[(id(target), torch.device("cpu"), torch.float32)] = TreeCosts(
        verify={1: 1.0, 2: 1.4, 32: 6.0, 160: 40.0}, draft={w: sum(w) / 3 for w in policy.candidates if w})
    repetitive = torch.arange(300).repeat(4)  # from position 300 on, the continuation is always right
    assert policy.choose(target, draft, (0, 10), repetitive)[1] == 10
    assert policy.prompt_gain[10] > 7 and policy.expected_gain(10) == policy.prompt_gain[10]
    policy.observe((), 10, [1] * 8, 0)  # the call gained nothing: later estimates are scaled down
    assert policy.retrieval_scale == pytest.approx(0.55)
    assert policy.choose(target, draft, (0, 10), torch.arange(1200))[1] == 0  # nothing repeats
    assert policy.prompt_gain == {10: 0.0}
    assert policy.choose(target, draft, (0,), repetitive)[1] == 0 and policy.prompt_gain is None  # not asked


def test_the_prompt_decides_the_retrieval_length():
    """GPU-like costs (a forward over 35 tokens costs ~1.05 plain steps): a prompt that repeats long stretches gets
    the 24-token chain (its estimate ~2.4x the 10-token one's), one whose repeats break off after 4 tokens keeps 10
    (both chains would gain the same; the longer costs a little more), one that never repeats gets none. Under
    CPU-like costs the long chain is not weighed at all (`LONG_CHAIN_FLATNESS`)."""
    target = make_target("llama")
    draft = LongSpecDraft.from_target(target, init_from_target=False)
    policy = TreePolicy(DEFAULT)
    policy.acceptance = 0.05  # a draft that is almost never right: the choice is the retrieval branch's
    policy.costs[(id(target), torch.device("cpu"), torch.float32)] = TreeCosts(
        verify={1: 1.0, 32: 1.05, 160: 1.5}, draft={w: 0.5 * len(w) for w in policy.candidates if w})
    long_repeats = torch.arange(300).repeat(4)
    assert policy.choose(target, draft, (0, 10, 24), long_repeats) == ((), 24, None)
    assert policy.prompt_gain[24] > 2 * policy.prompt_gain[10] > 14
    g = torch.Generator().manual_seed(0)
    runs = [torch.cat([torch.arange(4), torch.randint(100, 10_000, (8,), generator=g)]) for _ in range(100)]
    short_repeats = torch.cat(runs)  # "0 1 2 3" then 8 random tokens, 100 times: a match predicts 0..3 only
    policy._last = None
    assert policy.choose(target, draft, (0, 10, 24), short_repeats) == ((), 10, None)
    assert policy.prompt_gain[24] == policy.prompt_gain[10] > 0
    policy._last = None
    assert policy.choose(target, draft, (0, 10, 24), torch.arange(1200)) == ((), 0, None)
    cpu = TreePolicy(DEFAULT)  # CPU-like (11 tokens ~2.8 plain steps, 25 ~4.9): the long chain is not weighed
    cpu.acceptance = 0.05
    cpu.costs = {k: TreeCosts(verify={1: 1.0, 2: 1.4, 32: 6.0, 160: 40.0}, draft=policy.costs[k].draft)
                 for k in policy.costs}
    assert cpu.choose(target, draft, (0, 10, 24), long_repeats) == ((), 10, None)


def test_observe_learns_acceptance_and_retrieval_gain():
    policy = TreePolicy(DEFAULT)
    policy.observe(DEFAULT, 10, [1, 1, 1, 1, 1, 1], 0)  # nothing accepted
    assert policy.acceptance < 0.5 / 2 + 0.01 and policy.retrieval_gain == pytest.approx(0.1)
    low = policy.acceptance
    policy.observe(DEFAULT, 10, [4, 5, 3, 4], 8)
    assert policy.acceptance > low and policy.retrieval_gain == pytest.approx(0.05 + 1.0)
    before = (policy.acceptance, policy.retrieval_gain)
    policy.observe(DEFAULT, 10, [3, 3], 2)  # too few steps to learn from
    assert (policy.acceptance, policy.retrieval_gain) == before


@pytest.mark.measured_costs  # calibration on (its costs are set by hand here)
def test_observed_step_times_calibrate_the_drafts_cost():
    """Costs measured eagerly make the draft look expensive; calls whose draft phase is cheap next to their
    verification (a replayed CUDA graph) scale the draft's costs down, and the choice moves to a larger tree."""
    target = make_target("llama")
    draft = LongSpecDraft.from_target(target, init_from_target=False)
    policy = TreePolicy(DEFAULT)
    policy.costs[(id(target), torch.device("cpu"), torch.float32)] = TreeCosts(
        verify={1: 1.0, 160: 1.0}, draft={w: 0.6 * len(w) for w in policy.candidates if w})
    small, _, _ = policy.choose(target, draft, (0,))
    assert len(small) < len(DEFAULT)
    for _ in range(8):  # measured: draft 3.0 vs verification 1.0 per step; observed: 0.3 vs 1.0
        policy.observe(DEFAULT, 0, [2] * 10, 0, draft_s=0.3 * 10, verify_s=1.0 * 10)
    assert policy.draft_scale == pytest.approx(0.1, rel=0.1)
    assert policy.choose(target, draft, (0,))[0] == DEFAULT


@pytest.mark.measured_costs
def test_measured_costs_on_a_real_target():
    target = make_target("qwen2")
    draft = LongSpecDraft.from_target(target, init_from_target=False)
    policy = TreePolicy(DEFAULT)
    costs = tree_policy.measure_costs(target, draft, policy.candidates)
    assert sorted(costs.verify) == [1, 2, 8, 32, 96, 160] and all(s > 0 for s in costs.verify.values())
    assert set(costs.draft) == set(policy.candidates) - {()} and all(s > 0 for s in costs.draft.values())
    assert costs.verify_s(64) == pytest.approx((costs.verify[32] + costs.verify[96]) / 2)


@pytest.mark.parametrize("costs", ["cpu-like", "gpu-like"])
def test_default_tree_call_reports_its_shape_and_is_exact(family, costs, monkeypatch):
    """A call naming no tree equals plain greedy and reports the policy's choice: under CPU-like costs a small tree
    without retrieval; under GPU-like costs (conftest) the reranked variant of the draft's largest shape. A named tree
    is used as named."""
    if costs == "cpu-like":
        monkeypatch.setattr(tree_policy, "measure_costs", linear_costs)
    target = make_target(family)
    draft = LongSpecDraft.from_target(target, init_from_target=False)
    ids = torch.randint(3, 99, (1, 30), generator=torch.Generator().manual_seed(5))
    out = target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=12)
    assert torch.equal(out, target.generate(ids, do_sample=False, max_new_tokens=12))
    stats = draft.last_generation_stats
    if costs == "cpu-like":
        assert sum(stats.beam_widths) <= 3 and stats.retrieval_tokens == 0 and stats.tree_nodes is None
    else:
        assert (stats.beam_widths, stats.tree_nodes) == tree_policy.reranked(tuple(draft.config.beam_widths))
    named = target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=12,
                            longspec_beam_widths=[2, 2])
    assert torch.equal(named, out) and draft.last_generation_stats.beam_widths == (2, 2)
    assert draft.last_generation_stats.retrieval_tokens == 10  # a named tree keeps the default retrieval branch


def quiet_costs(target, draft, candidates) -> TreeCosts:
    """CPU-like but mild: a forward over 2 tokens costs 1.1 plain steps, over 8 1.6; a cheap draft. Trees pay."""
    return TreeCosts(verify={1: 1.0, 2: 1.1, 8: 1.6, 160: 20.0}, draft={w: 0.05 * sum(w) for w in candidates if w})


def loaded_then_quiet(counter: list):
    """A `measure_costs` whose first measurement ran under load (every forward over > 1 token and every draft
    growth ~6x slow: the empty tree wins) and every later one on a quiet device; appends to `counter` per call."""
    def measure(target, draft, candidates) -> TreeCosts:
        counter.append(len(counter))
        costs = quiet_costs(target, draft, candidates)
        if len(counter) > 1:
            return costs
        return TreeCosts(verify={t: s if t == 1 else 6 * s for t, s in costs.verify.items()},
                         draft={w: 6 * s for w, s in costs.draft.items()})
    return measure


def test_a_measurement_under_load_does_not_lock_in_plain_decoding(monkeypatch):
    """Issue 13: the first measurement, taken under load, makes the empty tree win. It used to stay chosen for good
    (no drafting, so no new evidence, and never measured again); after PROBE_EVERY calls on it the costs are measured
    again, each point's fastest time kept, and the policy moves to a tree and stays there without measuring more."""
    measured = []
    monkeypatch.setattr(tree_policy, "measure_costs", loaded_then_quiet(measured))
    target = make_target("llama")
    draft = LongSpecDraft.from_target(target, init_from_target=False)
    policy = TreePolicy(DEFAULT)
    choices = [policy.choose(target, draft, (0,)) for _ in range(tree_policy.PROBE_EVERY)]
    assert choices == [((), 0, None)] * tree_policy.PROBE_EVERY and len(measured) == 1
    widths, _, _ = policy.choose(target, draft, (0,))
    assert widths and len(measured) == 2
    key = (id(target), torch.device("cpu"), torch.float32)
    assert policy.costs[key].verify == quiet_costs(target, draft, policy.candidates).verify  # the fastest of both
    assert [policy.choose(target, draft, (0,))[0] for _ in range(10)] == [widths] * 10 and len(measured) == 2


def test_trees_fastest_keeps_each_points_smaller_time():
    a = TreeCosts(verify={1: 1.0, 8: 5.0}, draft={(1,): 0.5, (2, 2): 2.0})
    b = TreeCosts(verify={1: 2.0, 8: 3.0, 32: 9.0}, draft={(1,): 0.7})
    both = a.fastest(b)
    assert both.verify == {1: 1.0, 8: 3.0, 32: 9.0} and both.draft == {(1,): 0.5, (2, 2): 2.0}
    assert a.verify == {1: 1.0, 8: 5.0}  # not changed in place


def test_probes_relearn_the_acceptance_on_the_empty_tree(monkeypatch):
    """Early prompts the draft got wrong drive the acceptance down until the empty tree wins; periodic probes with the
    chain of one keep collecting evidence. A draft that now gets every token right wins its tree back after one probe;
    one that stays wrong is probed ever more rarely (the interval doubles) and the empty tree stays the choice."""
    monkeypatch.setattr(tree_policy, "measure_costs", quiet_costs)
    target = make_target("llama")
    draft = LongSpecDraft.from_target(target, init_from_target=False)

    def calls(policy, n, accepted_per_token):  # n simulated calls of 10 steps; returns the shapes chosen
        shapes = []
        for _ in range(n):
            widths, retrieval, nodes = policy.choose(target, draft, (0,))
            policy.observe(widths, retrieval, [1 + accepted_per_token * len(widths)] * 10, 0, nodes=nodes)
            shapes.append(widths)
        return shapes

    for good in (True, False):
        policy = TreePolicy(DEFAULT)
        assert policy.choose(target, draft, (0,))[0]  # the prior acceptance: a tree
        policy.observe(DEFAULT, 0, [1] * 10, 0)  # nothing accepted, twice: the empty tree wins
        policy.observe(DEFAULT, 0, [1] * 10, 0)
        policy._last = None
        if good:
            shapes = calls(policy, tree_policy.PROBE_EVERY + 3, 1)
            assert shapes[:tree_policy.PROBE_EVERY] == [()] * tree_policy.PROBE_EVERY
            assert shapes[tree_policy.PROBE_EVERY] == (1,)  # the probe ...
            assert all(shapes[tree_policy.PROBE_EVERY + 1:])  # ... brings back a tree
        else:
            shapes = calls(policy, 40, 0)
            assert [i for i, w in enumerate(shapes) if w] == [4, 13, 30]  # every 4, then 8, then 16 plain calls
            assert {w for w in shapes if w} == {(1,)} and policy._last == ((), 0, None)


def test_default_tree_recovers_from_a_measurement_under_load_and_stays_exact(monkeypatch):
    """End to end: every call equals plain greedy; the first PROBE_EVERY calls (costs measured under load) report the
    empty tree, the next, measured again on a quiet device, reports a tree."""
    monkeypatch.setattr(tree_policy, "measure_costs", loaded_then_quiet([]))
    target = make_target("llama")
    draft = LongSpecDraft.from_target(target, init_from_target=False)
    ids = torch.randint(3, 99, (1, 30), generator=torch.Generator().manual_seed(5))
    plain = target.generate(ids, do_sample=False, max_new_tokens=12)
    shapes = []
    for _ in range(tree_policy.PROBE_EVERY + 1):
        out = target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=12, longspec_retrieval=0)
        assert torch.equal(out, plain)
        shapes.append(draft.last_generation_stats.beam_widths)
    assert shapes[:-1] == [()] * tree_policy.PROBE_EVERY and shapes[-1]
