"""Retrieval branches: the longest-match lookup against a plain Python reference, the merge into a draft tree,
exact acceptance (greedy and sampling) with the branch, and retrieval in the decode loop (eager and static shapes).
"""

import random

import pytest
import torch
from test_sampling import (
    PROCESSORS,
    exact_two_token_distribution,
    random_tree,
    total_variation,
    tree_two_token_samples,
)
from transformers import LogitsProcessorList

from transformers_longspec import LongSpecDraft, static_step
from transformers_longspec.retrieval import (
    MAX_NGRAM,
    add_retrieval_branch,
    longest_match_continuation,
    prompt_retrieval_gains,
)
from transformers_longspec.tree import DraftTree
from transformers_longspec.verification import deepest_accepted

from tiny_models import make_target


def reference_continuation(seq: list[int], n: int) -> list[int]:
    """Plain Python: longest match of the suffix (<= MAX_NGRAM), then most known tokens after it, then latest."""
    last, best = len(seq) - 1, None
    for j in range(last):
        m = 0
        while m < MAX_NGRAM and j - m >= 0 and seq[j - m] == seq[last - m]:
            m += 1
        key = (m, min(last - j, n), j)
        if m and (best is None or key > best):
            best = key
    return [] if best is None else seq[best[2] + 1 : best[2] + 1 + n]


def test_lookup_matches_reference():
    rng = random.Random(0)
    for _ in range(400):
        length, vocab, n = rng.randint(1, 60), rng.randint(2, 7), rng.randint(1, 12)
        seq = [rng.randrange(vocab) for _ in range(length)]
        buffer = torch.tensor(seq + [rng.randrange(vocab) for _ in range(9)])  # stale tokens past the end
        last = torch.tensor(length - 1) if length % 2 else length - 1  # a device scalar or an int
        continuation, known = longest_match_continuation(buffer, last, n)
        assert continuation[known].tolist() == reference_continuation(seq, n), seq
        assert known.tolist() == sorted(known.tolist(), reverse=True)  # a prefix mask


def test_lookup_prefers_the_longest_match():
    seq = [5, 1, 2, 9, 9, 7, 1, 2, 3, 4, 0, 8, 7, 1, 2]  # "1 2" twice; "7 1 2" only once before the end
    continuation, known = longest_match_continuation(torch.tensor(seq), len(seq) - 1, 3)
    assert continuation[known].tolist() == [3, 4, 0]


def _hand_tree() -> DraftTree:
    """root(0) -> 5 (1), 7 (2); 5 -> 9 (3); 7 -> 4 (4)."""
    tokens = torch.tensor([0, 5, 7, 9, 4])
    parents = torch.tensor([-1, 0, 0, 1, 2])
    depths = torch.tensor([0, 1, 1, 2, 2])
    ancestors = torch.eye(5, dtype=torch.bool)
    for i in range(1, 5):
        ancestors[i] |= ancestors[parents[i]]
    return DraftTree(tokens, parents, depths, ancestors, torch.zeros(5))


def _consistent(tree: DraftTree) -> None:
    for i in range(1, tree.size):
        if tree.alive[i]:
            parent = int(tree.parents[i])
            assert parent < i and tree.depths[i] == tree.depths[parent] + 1
            expected = tree.ancestors[parent].clone()
            expected[i] = True
            assert torch.equal(tree.ancestors[i], expected)


def test_prompt_gain_counts_what_the_chain_would_have_matched():
    """A prompt that repeats itself scores the chain's matching prefix; one that never repeats scores 0."""
    block = torch.arange(100, 400)  # 300 distinct tokens, then the same 300 again
    repeated = torch.cat([block, block])
    # Positions 64..598: in the first copy nothing earlier matches (0); in the second copy (p >= 300) the match at
    # p - 300 predicts every following token, up to the prompt's end (p + t < 600).
    positions = torch.linspace(64, 598, 32).long().unique()
    expected = torch.stack([(p >= 300) * torch.clamp(599 - p, max=10) for p in positions]).float().mean()
    assert prompt_retrieval_gains(repeated, (10,))[10] == pytest.approx(expected.item())
    assert prompt_retrieval_gains(torch.arange(500), (10,))[10] == 0.0
    assert prompt_retrieval_gains(torch.tensor([5, 5]), (10,))[10] == 0.0  # too short to try
    half = torch.cat([block, block[:150], torch.arange(1000, 1150)])  # the copy breaks off halfway
    assert 0.0 < prompt_retrieval_gains(half, (10,))[10] < prompt_retrieval_gains(repeated, (10,))[10]
    gains = prompt_retrieval_gains(repeated, (10, 24))  # one scan: the 24-token proposal, cut to 10 for the other
    expected_24 = torch.stack([(p >= 300) * torch.clamp(599 - p, max=24) for p in positions]).float().mean()
    assert gains == {10: pytest.approx(expected.item()), 24: pytest.approx(expected_24.item())}


def test_branch_hangs_below_the_agreeing_draft_path():
    tree = add_retrieval_branch(_hand_tree(), torch.tensor([7, 4, 8, 6]), torch.ones(4, dtype=torch.bool))
    assert tree.size == 9 and tree.tokens[5:].tolist() == [7, 4, 8, 6] and tree.depths[5:].tolist() == [1, 2, 3, 4]
    assert tree.alive.tolist() == [True] * 5 + [False, False, True, True]  # 7, 4 are the draft's nodes 2, 4
    assert tree.parents[7] == 4 and tree.parents[8] == 7
    _consistent(tree)
    # the target agrees with 7, 4, 8, 6: the accepted path runs through the draft's nodes, then the chain
    next_tokens = torch.zeros(9, dtype=torch.long)
    next_tokens[0], next_tokens[2], next_tokens[4], next_tokens[7] = 7, 4, 8, 6
    next_tokens[5], next_tokens[6] = 4, 8  # the dead copies would "match" too: never accepted
    last = deepest_accepted(tree, next_tokens)
    assert last == 8 and tree.ancestors[last].nonzero().flatten().tolist() == [0, 2, 4, 7, 8]


def test_branch_without_agreement_and_with_unknown_tokens():
    known = torch.tensor([True, True, False])
    tree = add_retrieval_branch(_hand_tree(), torch.tensor([3, 5, 6]), known)
    assert tree.alive[5:].tolist() == [True, True, False] and tree.parents[5:7].tolist() == [0, 5]
    _consistent(tree)
    nothing = add_retrieval_branch(_hand_tree(), torch.tensor([3, 5]), torch.zeros(2, dtype=torch.bool))
    assert not nothing.alive[5:].any()
    root_only = DraftTree(torch.tensor([0]), torch.tensor([-1]), torch.tensor([0]), torch.ones(1, 1, dtype=bool),
                          torch.zeros(1))
    chain = add_retrieval_branch(root_only, torch.tensor([3, 5]), torch.ones(2, dtype=torch.bool))
    assert chain.parents.tolist() == [-1, 0, 1] and chain.alive.all()
    _consistent(chain)


@pytest.mark.parametrize("widths", [(3, 4, 2), (2, 5)], ids=str)
@pytest.mark.parametrize("name", ["plain", "repetition+top_p"])
@pytest.mark.parametrize("overlap", [0, 2])
def test_sampling_with_a_retrieval_branch_is_exact(widths, name, overlap):
    """The branch agrees with a draft path for `overlap` tokens (then dead copies), then goes on by itself."""
    torch.manual_seed(1)
    processors = LogitsProcessorList(PROCESSORS[name])
    tree = random_tree(widths, seed=11)
    deepest = int(tree.depths.argmax())
    start = tree.path_tokens()[deepest, :overlap].tolist()
    tail = [t for t in range(6) if t not in tree.tokens[tree.parents == 0].tolist()][:1] if overlap == 0 else [1]
    chain = torch.tensor((start + tail + [2, 3, 4])[:4])
    branched = add_retrieval_branch(tree, chain, torch.ones(4, dtype=torch.bool))
    assert int((~branched.alive).sum()) == overlap
    tv = total_variation(tree_two_token_samples(branched, processors), exact_two_token_distribution(processors))
    assert tv < 0.01


def _repetitive_prompt(seed: int, block: int = 12, repeats: int = 6) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 99, (1, block), generator=g).repeat(1, repeats)


@pytest.mark.parametrize("static_shapes", [False, True], ids=["eager", "static"])
def test_retrieval_alone_is_exact_and_accepts(family, static_shapes, monkeypatch):
    monkeypatch.setattr(static_step, "TAIL", 8)
    target = make_target(family)
    draft = LongSpecDraft.from_target(target, init_from_target=False)
    taus = []
    for seed in range(3):
        ids = _repetitive_prompt(seed)
        plain = target.generate(ids, do_sample=False, max_new_tokens=32)
        for widths in ([], [2, 2]):
            spec = target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=32,
                                   longspec_beam_widths=widths, longspec_retrieval=8,
                                   longspec_static_shapes=static_shapes)
            assert torch.equal(plain, spec), (family, seed, widths)
            stats = draft.last_generation_stats
            assert stats.retrieval_tokens == 8
            taus.append((stats.tau, stats.retrieval_accepted))
    # a random tiny target continues a repeated block often enough: the branch is accepted on some prompts
    assert any(tau > 1.2 and accepted > 0 for tau, accepted in taus), taus


def test_retrieval_off_matches_draft_alone(family):
    target = make_target(family)
    draft = LongSpecDraft.from_target(target, init_from_target=False)
    ids = _repetitive_prompt(4)
    out = target.generate(ids, assistant_model=draft, do_sample=False, max_new_tokens=16, longspec_retrieval=0)
    assert torch.equal(out, target.generate(ids, do_sample=False, max_new_tokens=16))
    stats = draft.last_generation_stats
    assert stats.retrieval_tokens == 0 and stats.retrieval_accepted == 0


@pytest.mark.parametrize("bad", [-1, 65, 2.0, True, "8"])
def test_bad_retrieval_value_is_refused(bad):
    target = make_target("llama")
    draft = LongSpecDraft.from_target(target, init_from_target=False)
    with pytest.raises(ValueError, match="longspec_retrieval must be an int"):
        target.generate(torch.tensor([[5, 6, 7]]), assistant_model=draft, max_new_tokens=2, longspec_retrieval=bad)
