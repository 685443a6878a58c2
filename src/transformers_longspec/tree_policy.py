"""The default tree: the shape with the highest predicted speed on this device, target and draft.

When a call names no tree (`longspec_beam_widths` unset on the call and on the `GenerationConfig`), the decode loop
asks `TreePolicy.choose` for one. Predicted speed over plain decoding, for a shape of widths w_1..w_D and a
retrieval branch of R tokens:

      speed = τ̂ / (c_draft(w) + c_verify(1 + N + R)),      costs in units of one plain decode step c_verify(1)

with N = Σw drafted nodes verified, or fewer for a reranked tree (below).

* c_verify(T): seconds of one target forward over T tokens, measured once per (target, device, dtype) at the first
  call (a few forwards at T = 1 ... 128, interpolated). On a GPU it is nearly flat up to ~100 tokens; on a CPU it
  grows almost linearly, which is why a 69-node tree there costs ~20 plain steps.
* c_draft(w): seconds of growing that tree with the draft, measured the same way.
* The draft's share is then calibrated by the calls themselves: the first costs are measured with eager forwards, but
  with static shapes the draft runs as one replayed CUDA graph, relatively much cheaper than an eager draft next to an
  eager verification. After each call, the draft's seconds per step over the verification's, as measured inside the
  decode loop, divided by the same ratio from the measured costs, scales every c_draft (`draft_scale`).
* τ̂ = 1 + Σ over the verified drafted nodes of the probability that the target accepts the node's whole path, + g.
  The target's next token is among the draft's b best with probability F(b) = 1 − (1 − p)^√b (more candidates,
  diminishing returns), so the draft's i-th choice is it with probability q_i = F(i) − F(i − 1), at every depth; a
  path's probability is the product of its choices' q. Depth d keeps the w_d most probable paths among the children
  of depth d − 1, as `tree.grow_tree`'s beam does (for a chain this is 1 + Σ_d p^d; a wider shape counts every path
  the global beam keeps, e.g. `(4, 4, 4, 4)` at p = 0.5: 2.49, where one best child per parent would give 2.41). p
  is the draft's top-1 acceptance, g the tokens per step the retrieval branch adds. p
  starts from a prior (0.5) and follows what the draft achieved in earlier calls of the process (by inverting τ̂ for
  the shape used). g is estimated per prompt
  and per chain length R (none, 10 or 24 tokens when the call names no length: `retrieval.POLICY_RETRIEVAL_TOKENS`;
  24 only where the verification is flat in its token count, `LONG_CHAIN_FLATNESS`):
  the chain the retrieval branch would have proposed at positions inside the prompt, against the tokens that really
  followed (`retrieval.prompt_retrieval_gains`; a repetitive C file scores several tokens, more with the longer
  chain, an essay a fraction of one), times a scale learnt from earlier calls (the gain observed while generating
  over the prompt's estimate). Without a prompt g starts from a prior (0.2) and follows the gains observed.

The candidates are `LADDER` (chains and small trees up to the default) and the draft's own `beam_widths`; the empty
tree (plain decoding through the engine, speed 1 + g / ...) is always one, so the default never predicts slower
than plain decoding. Each shape whose depths differ in width also has a reranked variant (`reranked`): every depth
as wide as the widest, then only the Σw most probable drafted nodes verified (`tree.best_nodes`, EAGLE-2's reranking
by the draft's cumulative log-probability, which the model reads as the paths' probabilities): as many verified
tokens, more of them where the draft is confident, for the cost of growing the wider shape (on a GPU about the
same; on a CPU, where every drafted token costs, more). The choice is reported in `LongSpecStats.beam_widths` /
`tree_nodes` / `retrieval_tokens`. A model here, not a guarantee: every shape is exact, only the speed depends on
it.

The empty tree would otherwise be final: it neither drafts (no acceptance evidence) nor measures again, so one
measurement taken under load (a busy 2-core CPU: every point best of three, yet all three slow) or a few early
prompts the draft got wrong would keep plain decoding for good. After `PROBE_EVERY` calls in a row on the empty tree
the next call measures the costs again, keeping each point's fastest time of all measurements (load only ever adds
time), and if the empty tree still wins it probes the smallest tree (the chain of one) so that `observe` learns the
acceptance again. The interval doubles after each probe that leaves the empty tree chosen (up to `PROBE_EVERY_MAX`
calls), so a device where plain decoding truly wins pays rarely; a probe call reports the probed shape.

Reference: LongSpec (arXiv 2502.17421) §3.3 (dynamic trees); the cost model of tree-size selection in Sequoia
(Chen et al. 2024) and SpecInfer, in simplified form; EAGLE-2 (arXiv 2406.16858): a drafted node's acceptance
follows its cumulative draft probability, and its reranking phase.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field

import torch

from .cache import DraftRingCache
from .retrieval import prompt_retrieval_gains
from .tree import grow_tree, kept_size

LADDER = ((), (1,), (1, 1), (1, 1, 1), (2, 2, 2), (2, 2, 2, 2), (4, 4, 4, 4), (4, 8, 8, 8), (4, 16, 16, 16, 16))
PRIOR_ACCEPTANCE, PRIOR_RETRIEVAL_GAIN = 0.5, 0.2
SWITCH_GAIN = 1.1  # another shape replaces the previous call's only if predicted this many times faster
# A retrieval chain longer than the shortest option is weighed only where the verification is this flat in its token
# count (a GPU): the measured costs leave out the long context's attention, which grows with every tree token, and
# on a CPU a 24-token chain then cost 1.6x the 10-token one per step where the costs said 1.3x (session 11 demo).
LONG_CHAIN_FLATNESS = 1.1
# After this many calls in a row on the empty tree, the next measures the costs again and probes the chain of one;
# the interval doubles after each probe that changes nothing, up to the maximum (calls).
PROBE_EVERY, PROBE_EVERY_MAX = 4, 64
_VERIFY_POINTS = (1, 2, 8, 32, 96, 160)  # tokens per measured target forward (on a CPU 2 already costs ~1.4x 1)


def expected_tau(widths, p: float, retrieval_gain: float = 0.0, nodes: int | None = None) -> float:
    """τ̂ of a tree shape for top-1 acceptance `p` in [0, 1] plus the retrieval branch's gain (tokens per step): 1 +
    the summed probabilities of the drafted paths kept (module docstring). `nodes`: only that many of the most
    probable drafted nodes are verified (a reranked tree, `tree.best_nodes`); None: all of them.

    Returns: τ̂ >= 1 (tokens per target forward). Raises: ValueError for `p` outside [0, 1]."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p={p}: the draft's top-1 acceptance is a probability in [0, 1]")
    if not widths:
        return 1.0 + retrieval_gain
    tops = [1.0 - (1.0 - p) ** math.sqrt(b) for b in range(max(widths) + 1)]  # F(b): the target's token in the top b
    choice = [high - low for low, high in zip(tops, tops[1:])]  # q_i: the draft's i-th choice is the target's token
    level, kept = [1.0], []
    for w in widths:  # the beam: depth d keeps the w most probable paths among the children of depth d - 1
        level = heapq.nlargest(w, (path * q for path in level for q in choice[:w]))
        kept += level
    if nodes is not None:  # a child is never more probable than its parent: the kept nodes form whole paths
        kept = heapq.nlargest(nodes, kept)
    return 1.0 + sum(kept) + retrieval_gain


def acceptance_from_tau(widths, tau: float, retrieval_gain: float = 0.0, nodes: int | None = None) -> float:
    """The p for which `expected_tau(widths, p, retrieval_gain, nodes)` equals `tau` (bisection; clipped to
    [0.01, 0.99])."""
    if not widths:
        return math.nan
    low, high = 0.01, 0.99
    for _ in range(40):
        mid = (low + high) / 2
        low, high = (mid, high) if expected_tau(widths, mid, retrieval_gain, nodes) < tau else (low, mid)
    return (low + high) / 2


def reranked(widths, vocab_size: int | None = None) -> tuple[tuple[int, ...], int] | None:
    """(grown shape, nodes): the reranked variant of a tree shape, every depth as wide as its widest and its
    `sum(widths)` best drafted nodes verified (as many tokens as the shape); None where the widths are all equal
    (the variant would be the shape itself) or the widest is wider than `vocab_size` (its first depth could not be
    grown). Reference: EAGLE-2 (arXiv 2406.16858), its reranking phase."""
    if len(set(widths)) < 2 or (vocab_size is not None and max(widths) > vocab_size):
        return None
    return (max(widths),) * len(widths), sum(widths)


@dataclass
class TreeCosts:
    """Measured seconds: `verify[T]` one target forward over T tokens, `draft[widths]` growing that tree."""

    verify: dict[int, float]
    draft: dict[tuple[int, ...], float] = field(default_factory=dict)

    def verify_s(self, tokens: int) -> float:
        """Seconds for `tokens`, linearly interpolated between measured points (extrapolated past the last)."""
        points = sorted(self.verify.items())
        for (t0, s0), (t1, s1) in zip(points, points[1:]):
            if tokens <= t1:
                break
        return s0 + (s1 - s0) * (tokens - t0) / (t1 - t0)

    def fastest(self, other: TreeCosts) -> TreeCosts:
        """Each point's (verify token count or draft shape) smaller time of `self` and `other`, two measurements of
        the same device (load only ever adds time; a point measured in one only is kept). Returns: a new `TreeCosts`
        in seconds."""
        def low(a: dict, b: dict) -> dict:
            return {k: min(a.get(k, math.inf), b.get(k, math.inf)) for k in {**a, **b}}
        return TreeCosts(verify=low(self.verify, other.verify), draft=low(self.draft, other.draft))


@torch.no_grad()
def measure_costs(target, draft, candidates) -> TreeCosts:
    """Time target forwards over `_VERIFY_POINTS` tokens and the draft growing each candidate tree (best of three
    passes), with the models' own device and dtype. Cost: 18 target forwards of <= 160 tokens, 3 growths per tree.
    A reranked variant's selection of its best nodes (`tree.best_nodes`) is not timed: the calls' own draft times
    cover it (`TreePolicy.calibrate`).

    Returns: `TreeCosts` in seconds.
    """
    device = next(target.parameters()).device
    vocab = target.config.get_text_config().vocab_size
    ids = torch.arange(max(_VERIFY_POINTS), device=device)[None] % vocab
    decoder, head = target.get_decoder(), target.get_output_embeddings()

    def forward(t: int):  # the decoder and the LM head over t tokens (not through `target`, whose LM head is watched
        hidden = decoder(input_ids=ids[:, :t], use_cache=False).last_hidden_state  # for NaN prefill logits)
        return head(hidden)

    c = draft.config
    param = next(draft.parameters())
    keys = torch.zeros(1, c.num_key_value_heads, 16, c.head_dim, dtype=param.dtype, device=device)
    feature = (torch.zeros(1, 1, c.target_feature_size, dtype=param.dtype, device=device) if c.target_hidden_input
               else None)
    rings = {w: DraftRingCache(c.sliding_window, 1 + sum(w), c.num_key_value_heads, c.head_dim, param.dtype, device)
             for w in candidates if w}
    work = {("verify", t): (lambda t=t: forward(t)) for t in _VERIFY_POINTS}
    work.update({("draft", w): (lambda w=w: grow_tree(draft, rings[w], ids[0, :1], 16, keys, keys, w,
                                                      target_hidden=feature)) for w in rings})
    best = dict.fromkeys(work, math.inf)
    for _ in range(3):  # three passes over everything, the best of each kept: the first warms up, drift averages out
        for name, fn in work.items():
            best[name] = min(best[name], _timed(fn, device))
    return TreeCosts(verify={t: best[("verify", t)] for t in _VERIFY_POINTS},
                     draft={w: best[("draft", w)] for w in rings})


def _timed(fn, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


class TreePolicy:
    """Chooses the default tree for one draft (kept on it) and learns its acceptance from finished calls.

    Args:
        largest: the draft config's `beam_widths`, a candidate beside `LADDER` (ladder shapes deeper or with more
            nodes are dropped; a reranked variant grows more nodes than its shape but verifies as many).
        vocab_size: the target's vocabulary (tokens), which bounds the reranked variants' widths; None: no bound.

    Attributes: `candidates`, the shapes verified whole; `variants`, {shape: (grown shape, nodes)} for those with a
    reranked variant (`reranked`); `shapes`, every shape the draft grows (the draft costs measured).
    Reference: module docstring.
    """

    def __init__(self, largest, vocab_size: int | None = None):
        self.largest = tuple(largest)
        self.candidates = tuple(dict.fromkeys(
            [w for w in LADDER if len(w) <= len(largest) and sum(w) <= sum(largest)] + [tuple(largest)]))
        self.variants = {w: variant for w in self.candidates if (variant := reranked(w, vocab_size))}
        self.shapes = tuple(dict.fromkeys([*self.candidates, *(grown for grown, _ in self.variants.values())]))
        self.costs: dict[tuple, TreeCosts] = {}
        self.acceptance, self.retrieval_gain = PRIOR_ACCEPTANCE, PRIOR_RETRIEVAL_GAIN
        self.retrieval_scale = 1.0  # gain observed while generating over the prompt's own estimate (calls so far)
        self.prompt_gain: dict[int, float] | None = None  # {chain length: gain} of the current call's prompt
        self.draft_scale = 1.0  # observed draft / verification time per step over the measured ratio (calls so far)
        self._key, self._last = None, None  # the costs and the choice of the last `choose`
        self._plain_calls, self._probe_every = 0, PROBE_EVERY  # calls in a row on the empty tree; probe interval

    def expected_gain(self, retrieval_tokens: int) -> float:
        """g: tokens per step a retrieval branch of that length is expected to add (the prompt's estimate when there
        is one for it, else the gain observed in earlier calls)."""
        if self.prompt_gain is None or retrieval_tokens not in self.prompt_gain:
            return self.retrieval_gain
        return self.retrieval_scale * self.prompt_gain[retrieval_tokens]

    def predicted_speedup(self, widths, retrieval_tokens: int, costs: TreeCosts, nodes: int | None = None) -> float:
        """τ̂ × (plain step seconds) / (draft + verification seconds) for a shape (its `nodes` best drafted nodes
        verified; None: all) and a retrieval length."""
        gain = self.expected_gain(retrieval_tokens) if retrieval_tokens else 0.0
        draft_s = self.draft_scale * costs.draft.get(tuple(widths), 0.0)
        step = draft_s + costs.verify_s(kept_size(widths, nodes) + retrieval_tokens)
        return expected_tau(widths, self.acceptance, gain, nodes) * costs.verify_s(1) / step

    def choose(self, target, draft, retrieval_options,
               prompt: torch.Tensor | None = None) -> tuple[tuple[int, ...], int, int | None]:
        """(beam_widths, retrieval_tokens, tree_nodes) with the highest predicted speed-up, tree_nodes None for the
        whole shape or the drafted nodes a reranked variant verifies; measures costs on first use. The
        previous call's choice is kept unless another is predicted `SWITCH_GAIN` times faster: a new shape costs a new
        compiled draft phase and new graphs, and estimates move a little with every call. After `PROBE_EVERY` (then
        doubling) calls in a row on the empty tree the costs are measured again (`TreeCosts.fastest`) and, if the
        empty tree still wins, this call alone probes the chain of one (module docstring); the empty tree stays the
        previous choice.

        Args:
            retrieval_options: retrieval lengths to consider (tokens): the call's own, or 0 and
                `retrieval.POLICY_RETRIEVAL_TOKENS` when the call names none.
            prompt: (length,) int64, the call's prompt: its own retrieval gain is estimated for every retrieval
                length among the options (`retrieval.prompt_retrieval_gains`); None keeps the gain learnt so far.
        """
        lengths = [r for r in retrieval_options if r]
        self.prompt_gain = None if prompt is None or not lengths else prompt_retrieval_gains(prompt, lengths)
        param = next(target.parameters())
        key = (id(target), param.device, param.dtype)
        probe = key in self.costs and self._plain_calls >= self._probe_every
        if key not in self.costs:
            self.costs[key] = measure_costs(target, draft, self.shapes)
        elif probe:  # the empty tree for a while: measure again, in case the earlier measurement ran under load
            self.costs[key] = self.costs[key].fastest(measure_costs(target, draft, self.shapes))
        self._key = key
        shortest = min(lengths, default=0)
        trees = [(w, None) for w in self.candidates] + [  # reranked variants whose grown shape has a measured cost
            variant for variant in self.variants.values() if variant[0] in self.costs[key].draft]
        options = [(w, r, n) for w, n in trees for r in retrieval_options
                   if r <= shortest or self._verify_flat(kept_size(w, n), shortest, r)]
        speed = {o: self.predicted_speedup(o[0], o[1], self.costs[key], o[2]) for o in options}
        best = max(options, key=speed.get)
        if self._last in speed and speed[best] < SWITCH_GAIN * speed[self._last]:
            best = self._last
        self._last = best
        if best[0]:
            self._plain_calls, self._probe_every = 0, PROBE_EVERY
        elif probe:  # still the empty tree: one call with the chain of one, for `observe` to learn the acceptance
            self._plain_calls, self._probe_every = 0, min(2 * self._probe_every, PROBE_EVERY_MAX)
            return next((w for w in self.candidates if w), ()), best[1], None
        else:
            self._plain_calls += 1
        return best

    def _verify_flat(self, tree_tokens: int, shorter: int, longer: int) -> bool:
        """Whether verifying a tree of `tree_tokens` tokens with a `longer` retrieval chain costs at most
        `LONG_CHAIN_FLATNESS` times the same tree with a `shorter` one (the gate on long chains: see that constant)."""
        costs = self.costs[self._key]
        return costs.verify_s(tree_tokens + longer) <= LONG_CHAIN_FLATNESS * costs.verify_s(tree_tokens + shorter)

    def calibrate(self, widths, retrieval_tokens: int, draft_s: float, verify_s: float,
                  nodes: int | None = None) -> None:
        """Move `draft_scale` halfway to (observed draft / verification seconds) / (the same ratio from the measured
        costs) for the shape a call used, `nodes` of it verified (None: all; no-op without both times or without
        costs for that shape)."""
        costs = self.costs.get(self._key)
        if widths and costs is not None and tuple(widths) in costs.draft and draft_s > 0 and verify_s > 0:
            measured = costs.draft[tuple(widths)] / costs.verify_s(kept_size(widths, nodes) + retrieval_tokens)
            self.draft_scale = 0.5 * self.draft_scale + 0.5 * (draft_s / verify_s) / measured

    def observe(self, widths, retrieval_tokens: int, accepted_lengths, retrieval_accepted: int,
                draft_s: float = 0.0, verify_s: float = 0.0, nodes: int | None = None) -> None:
        """Update the acceptance estimates and the draft's cost scale from a finished call (half weight to the new
        call; >= 4 steps). `draft_s` / `verify_s`: the call's seconds in the draft and the verification phases;
        `nodes`: the drafted nodes it verified of a reranked tree (None: the whole shape)."""
        steps = len(accepted_lengths)
        if steps < 4:
            return
        self.calibrate(widths, retrieval_tokens, draft_s, verify_s, nodes)
        gain = retrieval_accepted / steps
        if retrieval_tokens:
            self.retrieval_gain = 0.5 * self.retrieval_gain + 0.5 * gain
            estimate = (self.prompt_gain or {}).get(retrieval_tokens)
            if estimate:  # how the gain while generating compares with the prompt's own estimate
                ratio = min(max(gain / estimate, 0.1), 10.0)
                self.retrieval_scale = 0.5 * self.retrieval_scale + 0.5 * ratio
        if widths:
            tau = sum(accepted_lengths) / steps
            self.acceptance = 0.5 * self.acceptance + 0.5 * acceptance_from_tau(widths, tau, gain, nodes)


__all__ = ["LADDER", "TreeCosts", "TreePolicy", "acceptance_from_tau", "expected_tau", "measure_costs", "reranked"]
