"""Retrieval branches: the continuation of the longest earlier match of the latest tokens, as extra tree nodes.

Long inputs are full of text the output repeats (identifiers, whole lines, names, phrases). Beside the draft's
beams a tree can carry one chain of `n` tokens: find the earlier position j whose preceding tokens match the
sequence's last tokens longest (up to `MAX_NGRAM`), and propose the tokens that followed j. The target verifies
the chain in the same forward as the draft's beams, so it is lossless at any temperature (the chain is a
function of the emitted prefix alone, like any draft) and costs `n` more tree rows.

Lookup: the "index" is the token buffer itself, scanned on the device. For every candidate end position j the
match length m(j) is the number of trailing tokens equal to the sequence's last ones (at most `MAX_NGRAM`):

      tokens:   ... a  b  c  d  e ... x  b  c  d  ?        the last token is at p (here `d`)
                        ^j: m(j) = 3                ^p      proposal: e ... (the n tokens after j)

The winner has the longest match, then the longest continuation that is already known (j + n <= p), then the
latest position. The scan is O(capacity × MAX_NGRAM) element-wise work with no host sync and static shapes (it is
captured in the static step's CUDA graph); nothing is built at prefill and nothing is kept beyond the tokens.

Merging with the draft tree: the chain's first k tokens usually agree with a draft path (the draft predicts
copies too). The chain hangs below the deepest draft node m whose path equals its first k tokens; its first k
nodes are marked dead (`DraftTree.alive`: never accepted), so sibling tokens stay distinct — what the
sample-and-match acceptance rule needs to stay exact at T > 0 (`verification.py`).

Reference: prompt lookup decoding (Saxena 2023; transformers `PromptLookupCandidateGenerator`) and suffix-match
drafting (SuffixDecoding, SAM-decoding) for the idea; LongSpec (arXiv 2502.17421) §3.3 for the tree it joins.
"""

from __future__ import annotations

import torch

from .tree import DraftTree

MAX_NGRAM = 8  # longest suffix compared (tokens); longer matches rank equal
DEFAULT_RETRIEVAL_TOKENS = 10  # tokens in the retrieval chain of a call that names a tree but no length
# lengths the tree policy weighs (beside none) when the call names neither: a long chain pays on text that repeats
# long stretches (τ +20-55% at 24 vs 10 on held-out C/C++ and prose, SmolLM2, benchmarks/NOTES.md session 11)
POLICY_RETRIEVAL_TOKENS = (DEFAULT_RETRIEVAL_TOKENS, 24)


def validate_retrieval_tokens(value) -> int:
    """Check a `longspec_retrieval` value: the retrieval chain's length in tokens (0 = no retrieval branch).

    Raises: ValueError for anything but an int in [0, 64] (True/False are refused too: say 0 or a length).
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 64:
        raise ValueError(f"longspec_retrieval must be an int in [0, 64] (tokens in the retrieval branch, 0 = off, "
                         f"default {DEFAULT_RETRIEVAL_TOKENS}), got {value!r}")
    return value


def longest_match_continuation(tokens: torch.Tensor, last, n: int, max_ngram: int = MAX_NGRAM):
    """The `n` tokens that followed the longest earlier match of the suffix ending at `last`.

    Args:
        tokens: (length,) int64, the sequence (positions > `last` are ignored, so a preallocated buffer works).
        last: position of the sequence's last token (an int, or a 0-dim int64 tensor on the tokens' device).
        n: tokens to propose. max_ngram: longest suffix compared (tokens).
    Returns: (continuation (n,) int64, known (n,) bool). `known[t]` is False where the match has no t-th following
        token yet (past `last`) or where no earlier position matches even the last token; `known` is a prefix mask.
        No host sync.
    Reference: module docstring.
    """
    length = tokens.shape[0]
    device = tokens.device
    last = torch.as_tensor(last, device=device)
    ends = torch.arange(length, device=device)
    back = torch.arange(max_ngram, device=device)
    cand = ends[:, None] - back[None, :]  # (length, max_ngram) positions j - i
    mine = last - back  # positions p - i
    same = (tokens[cand.clamp(min=0)] == tokens[mine.clamp(min=0)][None, :]) & (cand >= 0) & (mine >= 0)[None, :]
    match = same.long().cumprod(dim=1).sum(dim=1)  # (length,) trailing tokens in common
    match = torch.where(ends < last, match, 0)  # earlier end positions only
    ahead = (last - ends).clamp(max=n)  # continuation tokens already known
    best = (match * (n + 1) + ahead) * length + ends  # longest match, then longest known continuation, then latest
    j = best.argmax().view(1)  # indexing with (1,) tensors, never a 0-dim one: that would read it on the host
    offsets = torch.arange(1, n + 1, device=device)
    known = (match[j] > 0) & (j + offsets <= last)
    return tokens[(j + offsets).clamp(max=length - 1)], known


def prompt_retrieval_gains(tokens: torch.Tensor, lengths, samples: int = 32) -> dict[int, float]:
    """Tokens per step a retrieval chain of each length in `lengths` would have added inside the prompt itself: at
    `samples` positions spread over the prompt, the continuation of the longest earlier match is compared with the
    tokens that really followed, and the matching prefix lengths are averaged. A prompt that repeats itself (code, a
    document quoting its own names) scores high, text that never repeats scores 0: the tree policy's per-prompt
    estimate of the retrieval gain (`tree_policy.TreePolicy.choose`). One scan with the longest length; a shorter
    chain is scored as that proposal cut to its length (its own lookup may break a tie between equally long matches
    differently).

    Args:
        tokens: (length,) int64, the prompt (any device). lengths: chain lengths (tokens, ≥ 1). samples: positions.
    Returns: {n: mean accepted tokens per position, in [0, n]}; 0.0 everywhere for prompts shorter than 3 tokens.
        One host sync.
    Reference: module docstring; the acceptance of a chain under greedy verification (`verification.py`).
    """
    length, longest = tokens.shape[0], max(lengths, default=0)
    if length < 3 or longest < 1:
        return dict.fromkeys(lengths, 0.0)
    first = min(64, length // 2)  # leave some history to match against
    positions = torch.linspace(first, length - 2, min(samples, length - 1 - first)).long().unique().tolist()
    accepted = torch.stack([retrieval_accepted(tokens, p, longest) for p in positions]).float()
    return {n: accepted.clamp(max=n).mean().item() for n in lengths}


def retrieval_accepted(tokens: torch.Tensor, last: int, n: int) -> torch.Tensor:
    """How many tokens of the retrieval chain proposed after position `last` (the `n` tokens that followed the longest
    earlier match, looked up in `tokens[: last + 1]`) equal the tokens that really follow `last` in `tokens`: what
    greedy verification accepts from that chain on a known text.

    Args:
        tokens: (length,) int64, a whole known text (any device). last: position of the last committed token (int).
        n: chain length (tokens, >= 1).
    Returns: 0-dim int64 tensor in [0, n]; no host sync.
    Reference: module docstring; the acceptance of a chain under greedy verification (`verification.py`).
    """
    length = tokens.shape[0]
    proposal, known = longest_match_continuation(tokens[: last + 1], last, n)
    offsets = torch.arange(1, n + 1, device=tokens.device)
    real = tokens[(last + offsets).clamp(max=length - 1)]
    hit = known & (proposal == real) & (last + offsets < length)
    return hit.long().cumprod(0).sum()


def add_retrieval_branch(tree: DraftTree, continuation: torch.Tensor, known: torch.Tensor) -> DraftTree:
    """Append a retrieval chain to a draft tree, merged with the draft path that already carries its first tokens.

    Node `size + t - 1` holds `continuation[t - 1]` at depth t (t = 1..n). With k the depth of the deepest draft
    node m whose path equals `continuation[:k]` (all known), chain nodes t <= k and unknown ones are dead; node
    k + 1 hangs below m and each later live node below the previous one.

    Args:
        tree: a draft tree of `size` nodes (its `alive` may be None: all alive).
        continuation: (n,) int64; known: (n,) bool prefix mask (`longest_match_continuation`).
    Returns: a `DraftTree` of size + n nodes with `alive` set; no host sync.
    Reference: module docstring.
    """
    size, n = tree.size, continuation.shape[0]
    device = continuation.device
    steps = torch.arange(1, n + 1, device=device)
    # a node agrees with the chain if every node on its path carries the chain's (known) token at its depth
    at_depth = (tree.depths - 1).clamp(0, n - 1)
    on_chain = (tree.tokens == continuation[at_depth]) & known[at_depth] & (tree.depths <= n)
    on_chain |= tree.depths == 0
    if tree.alive is not None:
        on_chain &= tree.alive
    agree = (on_chain[None, :] | ~tree.ancestors).all(dim=1)
    # the deepest draft node on the chain's path (root: 0), as a (1,) tensor: a 0-dim index would sync with the host
    merged = torch.where(agree, tree.depths, -1).argmax().view(1)
    k = tree.depths[merged]
    alive = (steps > k) & known
    previous = torch.where(steps == 1, 0, size + steps - 2)  # dead nodes t <= k chain from the root
    parents = torch.cat([tree.parents, torch.where(steps == k + 1, merged, previous)])
    is_root = torch.arange(size, device=device) == 0
    draft_part = torch.where((steps > k)[:, None], tree.ancestors[merged], is_root[None, :])
    chain_part = (steps[None, :] <= steps[:, None]) & ((steps[None, :] > k) | (steps[:, None] <= k))
    ancestors = torch.cat([
        torch.cat([tree.ancestors, tree.ancestors.new_zeros(size, n)], dim=1),
        torch.cat([draft_part, chain_part], dim=1),
    ])
    tree_alive = tree.alive if tree.alive is not None else torch.ones(size, dtype=torch.bool, device=device)
    return DraftTree(
        tokens=torch.cat([tree.tokens, continuation]),
        parents=parents,
        depths=torch.cat([tree.depths, steps]),
        ancestors=ancestors,
        scores=torch.cat([tree.scores, tree.scores.new_zeros(n)]),
        alive=torch.cat([tree_alive, alive]),
    )


__all__ = ["DEFAULT_RETRIEVAL_TOKENS", "MAX_NGRAM", "POLICY_RETRIEVAL_TOKENS", "add_retrieval_branch",
           "longest_match_continuation", "prompt_retrieval_gains", "retrieval_accepted", "validate_retrieval_tokens"]
