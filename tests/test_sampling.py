"""Sampling (T > 0) is exact: the emitted tokens follow the target's distribution, processors applied per node.

The target here is a Markov "model" over a 6-token vocabulary (its logits after a prefix are a fixed row chosen
by the prefix's last token), so the exact distribution of the first two emitted tokens is computable by
enumeration, with the logits processors applied to each explicit prefix as plain sampling would. The tree
machinery of the decode loop (`process_tree_logits`, `choose_next_tokens`, `deepest_accepted`) runs on 2e5
independent trials at once; the total-variation distance to the exact distribution must be < 0.01, and a
deliberately wrong rule (greedy matching of children, sampled bonus) must exceed it.
"""

import pytest
import torch
from transformers import (
    LogitsProcessorList,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from transformers_longspec import LongSpecDraft
from transformers_longspec.tree import DraftTree, tree_layout
from transformers_longspec.verification import choose_next_tokens, deepest_accepted, process_tree_logits

from tiny_models import make_target

VOCAB, TRIALS = 6, 200_000
TABLE = torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(0)) * 1.5
PROMPT = torch.tensor([[1, 4, 2, 0]])  # last token = the tree's root
PROCESSORS = {
    "plain": [],
    "temperature+top_k": [TemperatureLogitsWarper(0.7), TopKLogitsWarper(4)],
    "repetition+top_p": [RepetitionPenaltyLogitsProcessor(1.8), TopPLogitsWarper(0.8)],
    "no_repeat_ngram": [NoRepeatNGramLogitsProcessor(2), TemperatureLogitsWarper(1.3)],
}


def random_tree(widths, seed: int) -> DraftTree:
    """A tree of the given shape with random parents and distinct sibling tokens (any draft could propose it)."""
    g = torch.Generator().manual_seed(seed)
    depths, ranges = tree_layout(widths)
    size = depths.numel()
    tokens, parents = torch.zeros(size, dtype=torch.long), torch.full((size,), -1, dtype=torch.long)
    ancestors = torch.eye(size, dtype=torch.bool)
    tokens[0] = PROMPT[0, -1]
    for d in range(1, len(widths) + 1):
        (ps, pe), (s, e) = ranges[d - 1], ranges[d]
        used: dict[int, set] = {}
        for i in range(s, e):
            while True:
                parent = int(torch.randint(ps, pe, (1,), generator=g))
                free = [t for t in range(VOCAB) if t not in used.get(parent, set())]
                if free:
                    break
            token = free[int(torch.randint(len(free), (1,), generator=g))]
            used.setdefault(parent, set()).add(token)
            tokens[i], parents[i] = token, parent
            ancestors[i] |= ancestors[parent]
    return DraftTree(tokens, parents, depths, ancestors, torch.zeros(size))


def exact_two_token_distribution(processors) -> torch.Tensor:
    """(VOCAB, VOCAB) P(y1, y2) of plain sampling: processors on each explicit prefix."""
    def probs(prefix):
        return torch.softmax(processors(prefix, TABLE[prefix[0, -1]].clone()[None])[0], dim=-1)

    p1 = probs(PROMPT)
    rows = [probs(torch.cat([PROMPT, torch.tensor([[y]])], dim=1)) for y in range(VOCAB)]
    return p1[:, None] * torch.stack(rows)


def tree_two_token_samples(tree: DraftTree, processors, wrong_rule: bool = False) -> torch.Tensor:
    """(TRIALS, 2) first two emitted tokens: one verification step, then (if it emitted one token) the next root's
    own draw, exactly as the decode loop continues."""
    logits = TABLE[tree.tokens]  # Markov target: the logits after a node depend on the node's token
    scores = process_tree_logits(logits, tree, PROMPT, processors)
    draws = choose_next_tokens(scores.repeat(TRIALS, 1), do_sample=True).view(TRIALS, tree.size)
    if wrong_rule:  # greedy matching at inner nodes, sampled bonus: NOT lossless
        draws = torch.where(tree.depths < tree.depths.max(), scores.argmax(-1), draws)
    last = deepest_accepted(tree, draws)
    depth = tree.depths[last]
    path = tree.path_tokens()[last] if tree.size > 1 else torch.zeros(TRIALS, 0, dtype=torch.long)
    bonus = draws.gather(1, last[:, None])[:, 0]
    y1 = torch.where(depth >= 1, path[:, 0] if path.shape[1] else bonus, bonus)
    continuation = exact_two_token_distribution(processors)
    y2_next_step = torch.multinomial(continuation[y1] / continuation[y1].sum(-1, keepdim=True), 1)[:, 0]
    y2 = torch.where(depth >= 2, path[:, 1] if path.shape[1] > 1 else bonus, torch.where(depth == 1, bonus,
                                                                                          y2_next_step))
    return torch.stack([y1, y2], dim=1)


def total_variation(samples: torch.Tensor, exact: torch.Tensor) -> float:
    counts = torch.bincount(samples[:, 0] * VOCAB + samples[:, 1], minlength=VOCAB * VOCAB).double()
    return 0.5 * (counts / counts.sum() - exact.flatten().double()).abs().sum().item()


@pytest.mark.parametrize("widths", [(3, 4, 2), (1, 1, 1), (4,), (2, 5)], ids=str)
@pytest.mark.parametrize("name", sorted(PROCESSORS))
def test_tree_sampling_matches_plain_sampling(widths, name):
    torch.manual_seed(1)
    processors = LogitsProcessorList(PROCESSORS[name])
    tree = random_tree(widths, seed=len(widths) * 7 + widths[0])
    tv = total_variation(tree_two_token_samples(tree, processors), exact_two_token_distribution(processors))
    print(f"TV {tv:.4f} ({name}, tree {widths}, {TRIALS} trials)")
    assert tv < 0.01


@pytest.mark.parametrize("widths", [(3, 4, 2), (2, 5)], ids=str)
def test_a_wrong_rule_fails_the_same_check(widths):
    torch.manual_seed(1)
    processors = LogitsProcessorList(PROCESSORS["plain"])
    tree = random_tree(widths, seed=3)
    tv = total_variation(tree_two_token_samples(tree, processors, wrong_rule=True),
                         exact_two_token_distribution(processors))
    print(f"TV {tv:.4f} (wrong rule, tree {widths})")
    assert tv > 0.01


def test_seeded_generation_is_reproducible(family):
    target = make_target(family)
    draft = LongSpecDraft.from_target(target, beam_widths=[3, 3, 3])
    ids = torch.randint(3, 99, (1, 20), generator=torch.Generator().manual_seed(0))
    runs = []
    for _ in range(2):
        torch.manual_seed(123)
        runs.append(target.generate(ids, assistant_model=draft, do_sample=True, temperature=0.8, top_k=20,
                                    max_new_tokens=20))
    assert torch.equal(runs[0], runs[1])
    assert runs[0].shape[1] == 40
