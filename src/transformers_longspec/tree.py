"""Draft trees: layout, masks and dynamic beam-search growth (pure tensors, no host syncs).

Layout of a tree of `tree_size = 1 + sum(beam_widths)` nodes, flattened depth by depth:

    index:  0 | 1 .. w1 | w1+1 .. w1+w2 | ...
    depth:  0 |    1    |       2       | ...          root = the last committed token (the previous bonus)

Every node's parent has a smaller index; nodes of one depth are sorted by cumulative draft log-probability. A
retrieval chain (`retrieval.py`) may follow the draft's nodes, one node per depth 1, 2, ...; a tree reranked to its
best nodes (`best_nodes`) is ordered by score instead. Neither is laid out depth by depth, so code reads `depths` /
`ancestors` rather than index ranges.
`ancestors[i, j]` is True iff node j lies on the path root → i (i itself included), which is exactly the
tree part of the verification attention mask. A node at depth d sits at position `root_position + d`.

Reference: LongSpec (arXiv 2502.17421) §3.3 (dynamic beam-search tree, tree mask, positions).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .cache import DraftRingCache
from .kernels import beam_select


@dataclass
class DraftTree:
    """One draft tree.

    Attributes:
        tokens: (tree_size,) int64, root first.
        parents: (tree_size,) int64, parent index of each node, -1 for the root.
        depths: (tree_size,) int64.
        ancestors: (tree_size, tree_size) bool, ancestor-or-self mask.
        scores: (tree_size,) fp32, cumulative draft log-probability of the path to each node (root 0).
        alive: (tree_size,) bool or None (= all): nodes that may be accepted. A retrieval chain's nodes that a draft
            path already carries are dead (`retrieval.add_retrieval_branch`); they are verified but never accepted.
            So are a draft vocabulary's padding slots (score -inf) when it holds fewer tokens than a level's width.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    ancestors: torch.Tensor
    scores: torch.Tensor
    alive: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return self.tokens.shape[0]

    def path_tokens(self) -> torch.Tensor:
        """(tree_size, max_depth) int64: tokens on the path root → node at depths 1..d (0 past the node's depth)."""
        max_depth = int(self.depths.max()) if self.size > 1 else 0
        out = self.tokens.new_zeros(self.size, max_depth)
        for d in range(1, max_depth + 1):
            on_level = self.ancestors & (self.depths == d)[None, :]
            out[:, d - 1] = (on_level.long() * self.tokens[None, :]).sum(1)
        return out


def tree_layout(beam_widths) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """Depth of each node and the (start, end) index range of each depth for a tree shape.

    Args:
        beam_widths: widths per depth, e.g. (4, 16, 16, 16, 16).
    Returns: depths (tree_size,) int64 on CPU, and a list of (start, end) per depth 0..len(beam_widths).
    """
    ranges, start = [(0, 1)], 1
    for w in beam_widths:
        ranges.append((start, start + w))
        start += w
    depths = torch.cat([torch.full((e - s,), d, dtype=torch.long) for d, (s, e) in enumerate(ranges)])
    return depths, ranges


def kept_size(beam_widths, nodes: int | None = None) -> int:
    """Nodes of the tree `grow_tree(..., beam_widths, nodes=nodes)` returns: the root and every drafted node, or the
    root and the `nodes` best (`best_nodes`; `nodes >= sum(beam_widths)` keeps them all). Before any retrieval
    branch (`retrieval.add_retrieval_branch`) follows them."""
    drafted = sum(beam_widths)
    return 1 + (drafted if nodes is None else min(nodes, drafted))


def _window_visible(ring: DraftRingCache, query_position: torch.Tensor) -> torch.Tensor:
    """(window,) bool: ring slots a query at `query_position` sees (filled, inside its sliding window)."""
    pos = ring.ring_positions
    return (pos >= 0) & (pos > query_position - ring.window) & (pos < query_position)


def grow_tree(draft, ring: DraftRingCache, root: torch.Tensor, root_position, target_keys, target_values,
              beam_widths, target_tail_mask=None, target_hidden=None, vocab=None, nodes=None) -> DraftTree:
    """Grow a draft tree from `root` by dynamic beam search over cumulative draft log-probability.

    Depth d keeps the `beam_widths[d-1]` best (parent, token) pairs among all children of depth d-1; a branch
    whose every child falls out of the beam simply stops growing. One draft forward per depth except the last.

    Args:
        draft: an attached `LongSpecDraft`.
        ring: the draft's ring cache, already holding the committed tokens before `root_position`.
        root: (1,) int64, the last committed token.
        root_position: its absolute position (tokens), = committed length of the target cache; an int, or a 0-dim
            int64 tensor on the draft's device (static shapes: no host value is baked into a CUDA graph).
        target_keys, target_values: (1, n_kv_heads, kv, head_dim), the target's last-layer cache: kv = root_position
            committed rows, or with `target_tail_mask` (m,) bool, rows whose last m are seen only where it is True.
        beam_widths: tuple of positive ints.
        target_hidden: (1, 1, config.target_feature_size), the target's final hidden state at position
            root_position - 1 (the one that chose the root; then its feature layers' outputs there), read by every
            level of a draft with `config.target_hidden_input`; else None.
        vocab: a `vocabulary.DraftVocabulary` the draft proposes from (None: the whole vocabulary).
        nodes: keep only the root and the `nodes` best drafted nodes of the grown tree (`best_nodes`); None, or
            `nodes >= sum(beam_widths)`: the whole tree.
    Returns: `DraftTree` on the draft's device, `1 + sum(beam_widths)` nodes (`1 + nodes` with `nodes`).
    Reference: LongSpec §3.3; EAGLE-2 (arXiv 2406.16858), its reranking phase (`nodes`).
    """
    device = root.device
    _, ranges = tree_layout(beam_widths)
    # built on the device (no host-to-device copy, so the function can be captured in a CUDA graph)
    depths = torch.cat([torch.full((e - s,), d, dtype=torch.long, device=device) for d, (s, e) in enumerate(ranges)])
    size = depths.shape[0]
    tokens = torch.zeros(size, dtype=torch.long, device=device)
    parents = torch.full((size,), -1, dtype=torch.long, device=device)
    scores = torch.zeros(size, dtype=torch.float32, device=device)
    ancestors = torch.eye(size, dtype=torch.bool, device=device)
    tokens[0] = root[0]
    # every level reads the same target state: its term in the residual stream is computed once per tree
    feature = None if target_hidden is None else draft.target_feature(target_hidden)
    for d in range(len(beam_widths)):
        start, end = ranges[d]
        logits, bias = _draft_level(draft, ring, tokens, ancestors, start, end, root_position + d,
                                    target_keys, target_values, target_tail_mask, feature, vocab)
        # the best `width` children of all parents by cumulative log-prob (the Triton kernels on CUDA)
        best, rows, columns = beam_select(logits, scores[start:end], beam_widths[d], bias)
        new_start, new_end = ranges[d + 1]
        parent = start + rows
        tokens[new_start:new_end] = columns if vocab is None else vocab.ids[columns]  # vocabulary slots → ids
        parents[new_start:new_end] = parent
        scores[new_start:new_end] = best
        # (index_copy_ rather than `ancestors[a:b] |= ...`: the same values; inductor's CPU code for the latter fails)
        new_rows = torch.arange(new_start, new_end, device=device)
        ancestors.index_copy_(0, new_rows, ancestors[new_start:new_end] | ancestors[parent])
    tree = DraftTree(tokens=tokens, parents=parents, depths=depths, ancestors=ancestors, scores=scores)
    if nodes is not None and nodes < size - 1:
        tree = best_nodes(tree, nodes)
    # a vocabulary with fewer tokens than a level's width fills it with padding slots (score -inf, all token 0):
    # dead, so the siblings that may be accepted stay distinct (sampling's rule)
    tree.alive = torch.isfinite(tree.scores) if vocab is not None else None
    return tree


def best_nodes(tree: DraftTree, nodes: int) -> DraftTree:
    """The root and the `nodes` drafted nodes of highest cumulative draft log-probability, as a tree of their own.

    A node's score is its parent's plus a log-probability (<= 0), so a parent never ranks below its child: sorting by
    score (ties: the smaller index, i.e. the parent, first) keeps every kept node's path whole, and the kept nodes
    come out root first, each after its parent. The tree then goes deep where the draft is confident and stays wide
    where it is not, for the same verification size (`nodes + 1` tokens) as a fixed shape.

    Args:
        tree: a draft tree of `size` nodes (`grow_tree`: depth by depth; no retrieval branch; `alive` unset).
        nodes: drafted nodes to keep, 1 <= nodes < size.
    Returns: a `DraftTree` of `nodes + 1` nodes (static size: no host sync, capturable).
    Reference: EAGLE-2 (Li et al. 2024, arXiv 2406.16858), the reranking phase of its dynamic draft tree.
    """
    order = torch.sort(-tree.scores[1:], stable=True).indices[:nodes] + 1
    keep = torch.cat([order.new_zeros(1), order])
    new_index = torch.full_like(tree.parents, -1)
    new_index[keep] = torch.arange(nodes + 1, device=keep.device)
    parents = tree.parents[keep]
    return DraftTree(tokens=tree.tokens[keep], parents=torch.where(parents < 0, -1, new_index[parents.clamp(min=0)]),
                     depths=tree.depths[keep], ancestors=tree.ancestors[keep][:, keep], scores=tree.scores[keep])


def _draft_level(draft, ring, tokens, ancestors, start, end, position, target_keys, target_values, tail_mask,
                 feature, vocab):
    """Run the draft on tree nodes [start, end) (all at `position`; `feature`: `draft.target_feature` of the
    tree's target state, or None); store their K/V; return their logits (n, vocab or vocab slots) in the LM head's
    dtype and the bias to add (None without a draft vocabulary)."""
    n = end - start
    device = tokens.device
    position = torch.as_tensor(position, device=device)
    visible = _window_visible(ring, position)
    mask = torch.cat(
        [visible.expand(n, -1), ancestors[start:end, :start], torch.eye(n, dtype=torch.bool, device=device)], dim=1
    )
    past_k = torch.cat([ring.ring_keys, ring.tree_keys[:, :, :start]], dim=2)
    past_v = torch.cat([ring.ring_values, ring.tree_values[:, :, :start]], dim=2)
    positions = position.expand(1, n)
    logits, bias, k, v = draft.step_logits(tokens[None, start:end], positions, past_k, past_v, mask, target_keys,
                                           target_values, tail_mask, vocab=vocab, target_feature=feature)
    ring.tree_keys[:, :, start:end] = k
    ring.tree_values[:, :, start:end] = v
    return logits[0], bias


__all__ = ["DraftTree", "tree_layout", "grow_tree", "best_nodes", "kept_size"]
