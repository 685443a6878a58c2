"""Verification of a draft tree by the target: one forward, per-node next tokens, acceptance.

Acceptance rule (greedy and sampling alike, "sample-and-match descent"): the target picks its next token
y(i) after every node i — the argmax of the processed logits at T = 0, a sample from them at T > 0 — with
logits processors applied to node i's own prefix. Starting at the root, descend to the child whose token equals
y(current) (children carry distinct tokens, so at most one does); stop at the first node with no such child
and emit y there as the bonus token. Every emitted token is therefore exactly the token the target would
have chosen (T = 0) or a draw from the target's distribution given the emitted prefix (T > 0): the rule is
lossless for any tree, whatever the draft's probabilities. Computing y for all nodes at once and keeping the
deepest fully-matching path gives the same result as the walk, since draws off that path are never used.

Reference: LongSpec (arXiv 2502.17421) §3.3–3.4; the sampling variant is the "traversal verification with
one-hot drafts" special case of SpecInfer's multi-step speculative sampling (Miao et al. 2024, §4.2) —
the authors' public T > 0 code is not lossless (see reference/longspec-reference-spec.md §2.11).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import LogitsProcessorList

from .cache import LongSpecCache
from .tree import DraftTree


@dataclass
class Acceptance:
    """Result of verifying one tree.

    Attributes:
        path: (n_accepted,) int64 tree indices root → deepest accepted node, increasing (root included).
        new_tokens: (n_accepted,) int64 tokens to emit: the accepted drafted tokens, then the bonus token.
    """

    path: torch.Tensor
    new_tokens: torch.Tensor


def verify_tree(target, tree: DraftTree, cache: LongSpecCache) -> torch.Tensor:
    """Run the target over the flattened tree with hybrid tree attention; return fp32 logits (tree_size, vocab).

    The tree's K/V are appended to `cache` after its committed rows (compact them with `commit_path`).
    Must run inside `compat.tree_attention(target)` so that attention layers dispatch to "longspec".

    Reference: LongSpec §3.4 (hybrid tree attention); transformers custom 4D masks skip mask building.
    """
    committed = cache.get_seq_length()
    positions = (tree.depths + committed)[None]
    out = target(
        input_ids=tree.tokens[None],
        position_ids=positions,
        attention_mask=tree.ancestors[None, None],
        past_key_values=cache,
        use_cache=True,
        longspec_tree_mask=tree.ancestors,
    )
    return out.logits[0].float()


def process_tree_logits(
    logits: torch.Tensor, tree: DraftTree, input_ids: torch.Tensor, logits_processor: LogitsProcessorList | None
) -> torch.Tensor:
    """Apply logits processors to every node with that node's own prefix, exactly as plain `generate` would.

    Args:
        logits: (tree_size, vocab) fp32, the target's logits after each node.
        tree: the draft tree.
        input_ids: (1, cur_len) int64, the sequence so far; its last token is the tree's root.
        logits_processor: transformers processors/warpers (may be empty).
    Returns: (tree_size, vocab) fp32 processed scores. Nodes of one depth are processed in one batched call
        with prefixes (n_nodes, cur_len + depth), so history-dependent processors (repetition penalty, n-gram
        bans, min_new_tokens) see each node's own history.
    Reference: transformers `LogitsProcessor.__call__(input_ids, scores)`.
    """
    if not logits_processor:
        return logits
    path_tokens = tree.path_tokens()
    scores = torch.empty_like(logits)
    for d in range(int(tree.depths.max()) + 1 if tree.size > 1 else 1):
        nodes = (tree.depths == d).nonzero().flatten()
        prefixes = torch.cat([input_ids.expand(nodes.numel(), -1), path_tokens[nodes, :d]], dim=1)
        scores[nodes] = logits_processor(prefixes, logits[nodes].clone())
    return scores


def choose_next_tokens(scores: torch.Tensor, do_sample: bool) -> torch.Tensor:
    """The target's next token after every node: argmax (T = 0) or one multinomial draw per node (T > 0).

    Args:
        scores: (n, vocab) fp32 processed scores (warpers already applied when sampling).
    Returns: (n,) int64.
    Reference: transformers `GenerationMixin._sample` (argmax / softmax + multinomial).
    """
    if do_sample:
        return torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)
    return scores.argmax(dim=-1)


def deepest_accepted(tree: DraftTree, next_tokens: torch.Tensor) -> torch.Tensor:
    """Index of the deepest node whose whole path matches the target's choices (no host sync).

    Args:
        tree: the draft tree.
        next_tokens: (..., tree_size) int64, the target's choice after each node; leading dims are independent
            trials (the statistical tests draw many at once).
    Returns: (...,) int64 node indices (0 = the root: nothing accepted).
    Reference: LongSpec §3.3 (greedy tree verification); module docstring for the sampling case.
    """
    parent_choice = next_tokens[..., tree.parents.clamp(min=0)]
    matches = tree.tokens == parent_choice
    if tree.alive is not None:
        matches &= tree.alive
    matches = matches | (tree.depths == 0)  # the root is always on the path (no in-place scalar write: capturable)
    # a node is on a good path iff none of its ancestors (itself included) mismatches
    bad = (~matches).to(torch.float32) @ tree.ancestors.T.to(torch.float32)
    depth_if_good = torch.where(bad == 0, tree.depths, -1)
    return depth_if_good.argmax(dim=-1)


def accept(tree: DraftTree, next_tokens: torch.Tensor) -> Acceptance:
    """Deepest path whose every drafted token equals the target's choice at its parent, plus the bonus token.

    Args:
        tree: the draft tree.
        next_tokens: (tree_size,) int64, the target's choice after each node (`choose_next_tokens`).
    Returns: `Acceptance`. One device→host sync: the accepted length.
    Reference: LongSpec §3.3 (greedy tree verification); module docstring for the sampling case.
    """
    last = deepest_accepted(tree, next_tokens)
    path = tree.ancestors[last].nonzero().flatten()  # the one host sync of the step: how many were accepted
    new_tokens = torch.cat([tree.tokens[path[1:]], next_tokens[last].view(1)])
    return Acceptance(path=path, new_tokens=new_tokens)


__all__ = ["Acceptance", "verify_tree", "process_tree_logits", "choose_next_tokens", "deepest_accepted", "accept"]
