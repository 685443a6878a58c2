"""The LongSpec step with static shapes: draft tree growth and target verification as replayable CUDA graphs.

A decode step of a small target is a few milliseconds of GPU work behind tens of milliseconds of Python and
kernel launches. This module gives the draft and the verification forward shapes that do not change from step to
step, so each is captured once as a CUDA graph and then replayed with one launch (on the CPU the same code runs
eagerly: it is the layout the tests check for exactness).

What varies from step to step is only the committed length C (a device scalar here). The target cache is read in
three parts with static sizes, for the bucket B = C rounded down to a multiple of `TAIL`:

      rows:   [ 0 ........ B )[ B ...... C ... B+TAIL )[ B+TAIL ... B+TAIL+T )
              prefix: flash    tail: first C-B rows     the tree's own K/V, written here by the verification
              (no mask)        visible, the rest masked (ancestor mask)

so one pair of graphs serves every C in [B, B + TAIL): a new pair is captured when C enters a new bucket (once
every ~TAIL/τ steps), and graphs are kept for reuse by later calls. The draft's cross-attention reads the same
[prefix | tail] split of the target's last layer; its ring buffer is refreshed for the last `depth + 1` positions
every step (recomputing K/V that are already there is harmless: a one-layer draft's K/V depend only on the token
and its position), which covers every token committed since the previous step.

With `compile=True` the draft side of the step (`draft_phase`: ring refresh, every tree level with its top-k and
bookkeeping, the retrieval lookup and merge) and the target's decoder layers run as `torch.compile` (inductor)
regions while the graphs are captured, so a replay launches fused kernels (one RMSNorm, one RoPE, one SiLU-gate ...
instead of ~47 small kernels per layer, and a few per tree level instead of ~30). The cache update stays outside
the compiled regions and the hybrid attention is an opaque custom op inside them, so the same compiled code serves
every bucket and every layer; it is compiled on the first call (tens of seconds on a GPU; the draft phase once per
tree shape) and reused by later calls in the process.

Greedy calls without logits processors run acceptance, the compaction of the accepted path and the advance of the
sequence (its token buffer and C) inside the verification graph too (`launch_greedy`), so the step after it can be
launched before its result is read back (`chain_greedy`): the host reads step k's accepted tokens, checks stopping
and streams them while the GPU already runs step k + 1, and the GPU never waits for the host. Otherwise (logits
processors, sampling, returned scores) everything after the verification runs eagerly with a single read-back of
the accepted path.

Reference: LongSpec (arXiv 2502.17421) §3.3–3.4; CUDA graphs in PyTorch (`torch.cuda.CUDAGraph`,
`torch.cuda.graph`), the "static cache" idea of transformers' `StaticCache`; regional compilation
(`torch.compile` of repeated blocks).
"""

from __future__ import annotations

import contextlib
import time
import warnings
import weakref
from collections import OrderedDict

import torch
import torch._dynamo

from . import compat
from .cache import DraftRingCache, LongSpecCache, _round_up
from .retrieval import add_retrieval_branch, longest_match_continuation
from .tree import DraftTree, grow_tree, kept_size
from .verification import deepest_accepted
from .vocabulary import DraftVocabulary

TAIL = 512  # tokens per bucket of the committed length; a new graph pair is captured per bucket
MAX_GRAPHS = 64  # graph pairs kept per engine (least recently used evicted): ~21 MB of logits each for a 150k vocab
CAPACITY_STEP = 4096  # engine buffers come and grow in these steps (tokens): calls of similar lengths share graphs


class StaticTreeStep:
    """Static-shape draft + verification for one (target, draft, tree shape), reusable across `generate` calls.

    Args:
        target: the target `*ForCausalLM` (batch size 1).
        draft: an attached `LongSpecDraft` on the same device.
        beam_widths: tree shape (see `tree.grow_tree`).
        capacity: tokens the target cache must hold at first (the prompt and the first new tokens); buffers are sized
            for it plus the tail block and the tree, rounded up to a multiple of `CAPACITY_STEP`, so later calls of
            similar lengths (a 1-token and a 256-token call on one prompt) reuse the engine and its captured graphs.
            A longer output grows them in `CAPACITY_STEP`s (`_grow_for`).
        cuda_graphs: capture and replay CUDA graphs (CUDA only); False runs the same static-shape code eagerly.
        compile: run `draft_phase` and the target's decoder layers as `torch.compile` regions (module docstring).
        retrieval_tokens: length of the retrieval branch every tree carries (`retrieval.py`; 0: none); the lookup
            runs inside the draft graph over the token buffer.
        draft_vocab: n > 0: the draft proposes from the n most frequent tokens of its own vocabulary
            (`vocabulary.py`) and the prompt's, refilled per call by `start`; 0: from the whole vocabulary (the decode
            loop asks for a vocabulary only with a tree: retrieval alone never runs the draft).
        tree_nodes: verify the root and the `tree_nodes` best drafted nodes of the grown tree (`tree.best_nodes`);
            None: the whole tree.

    Buffers (all on the target's device): the target cache (`LongSpecCache`, capacity rows), the draft's ring
    cache, the sequence's tokens `(capacity,)` int64, and the committed length `(,)` int64.

    Raises: ValueError if `cuda_graphs` is requested off CUDA.
    Reference: module docstring.
    """

    def __init__(self, target, draft, beam_widths: tuple[int, ...], capacity: int, cuda_graphs: bool,
                 compile: bool = False, retrieval_tokens: int = 0, draft_vocab: int = 0,
                 tree_nodes: int | None = None):
        device = next(target.parameters()).device
        if cuda_graphs and device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA target, got one on {device}; use longspec_static_shapes=False "
                             "or move the model to a GPU")
        self.target_ref, self.draft_ref = weakref.ref(target), weakref.ref(draft)
        self._weights = _weight_storage(target, draft)  # graphs read these buffers: new weights need new graphs
        self.beam_widths, self.cuda_graphs, self.device = tuple(beam_widths), cuda_graphs, device
        self.retrieval_tokens, self.tree_nodes = retrieval_tokens, tree_nodes
        self.vocab = DraftVocabulary(draft, draft_vocab) if draft_vocab else None
        self.tree_size, self.depth = kept_size(beam_widths, tree_nodes) + retrieval_tokens, len(beam_widths)
        self.capacity = _round_up(capacity + TAIL + self.tree_size, CAPACITY_STEP)
        self.cache = LongSpecCache(target.config.get_text_config().num_hidden_layers, self.capacity)
        self.cache.storage.dynamic_length = compile
        param = next(draft.parameters())
        c = draft.config
        self.ring = DraftRingCache(c.sliding_window, 1 + sum(beam_widths), c.num_key_value_heads, c.head_dim,
                                   param.dtype, device)
        # the target's final hidden state at the last committed token (then its target_feature_layers' outputs
        # there), read by drafts with target_hidden_input
        self.reads_feature = c.target_hidden_input
        self.feature_layers = tuple(c.target_feature_layers or ())
        self.feature = (torch.zeros(1, 1, c.target_feature_size, dtype=param.dtype, device=device)
                        if self.reads_feature else None)
        self.tokens = torch.zeros(self.capacity, dtype=torch.long, device=device)
        self.committed = torch.zeros((), dtype=torch.long, device=device)
        self._path_slots = torch.arange(max(self.depth, retrieval_tokens) + 1, device=device)  # root + deepest path
        # the packed greedy results of the last two launched steps, copied out before the next step overwrites them
        self._host_packed = [torch.zeros(1 + 2 * self._path_slots.numel(), dtype=torch.long,
                                         pin_memory=device.type == "cuda") for _ in range(2)]
        self._tail = torch.arange(TAIL, device=device)
        self._graphs: OrderedDict[tuple[int, bool], tuple] = OrderedDict()
        self.hidden: torch.Tensor | None = None  # (tree_size, feature size) of the latest verification (feature drafts)
        self._pool = torch.cuda.graph_pool_handle() if cuda_graphs else None
        self._stream = torch.cuda.Stream(device) if cuda_graphs else None
        self.compile = compile
        self._compiled = _compile_regions(target) if compile else {}
        self._draft_phase = _compile_draft_phase() if compile else draft_phase

    def fits(self, target, draft, beam_widths, capacity: int, compile: bool = False, retrieval_tokens: int = 0,
             draft_vocab: int = 0, tree_nodes: int | None = None) -> bool:
        """True if this engine serves a call with these models, tree shape (and `tree_nodes`), retrieval branch,
        capacity (tokens), compile flag and draft vocabulary choice."""
        return (self.target_ref() is target and self.draft_ref() is draft and self.beam_widths == tuple(beam_widths)
                and self.tree_nodes == tree_nodes
                and self.compile == compile and self.retrieval_tokens == retrieval_tokens
                and (self.vocab.frequent if self.vocab is not None else 0) == draft_vocab
                and capacity + TAIL + self.tree_size <= self.capacity
                and _weight_storage(target, draft) == self._weights)

    def start(self, input_ids: torch.Tensor) -> LongSpecCache:
        """Reset for a new call with prompt `input_ids` (1, prompt_len); returns the empty target cache to prefill."""
        self.cache.set_length(0)
        self.ring.ring_positions.fill_(-1)
        self.tokens[: input_ids.shape[1]] = input_ids[0]
        self._written, self._ring_ready = input_ids.shape[1], False
        if self.vocab is not None:
            self.vocab.fill(self.draft_ref(), input_ids[0])
        return self.cache

    def record(self, sequences: torch.Tensor) -> None:
        """Copy the tokens of `sequences` (1, length) int64 emitted since the last call into the token buffer (grown
        first if the next step would not fit, `_grow_for`)."""
        self._grow_for(sequences.shape[1])
        self.tokens[self._written : sequences.shape[1]] = sequences[0, self._written :]
        self._written = sequences.shape[1]

    def _grow_for(self, length: int) -> None:
        """Make room for a step on a sequence of `length` tokens: `length + TAIL + tree_size` cache rows. Beyond the
        current capacity, the target cache and token buffer are reallocated in steps of `CAPACITY_STEP` tokens (the
        committed rows copied over) and the captured graphs, which read the old buffers, are dropped (they are captured
        again on the next step of each bucket)."""
        if length + TAIL + self.tree_size <= self.capacity:
            return
        self.capacity = _round_up(length + TAIL + self.tree_size, CAPACITY_STEP)
        committed = length - 1  # every token before the root
        self.cache.storage.resize(self.capacity, keep=committed)
        self.cache.set_length(committed)
        tokens = self.tokens.new_zeros(self.capacity)
        tokens[: self._written] = self.tokens[: self._written]
        self.tokens = tokens
        self._graphs.clear()

    def tree_start(self, committed: int) -> int:
        """Cache row where the verification writes tree node 0, for `committed` tokens."""
        return committed // TAIL * TAIL + TAIL

    # ------------------------------------------------------------------ the step
    def draft_and_verify(self, committed: int) -> tuple[DraftTree, torch.Tensor, StepClock]:
        """Grow the tree rooted at sequence position `committed` and verify it with the target.

        Args:
            committed: C, tokens whose K/V are committed in the target cache (the root is token C).
        Returns: (tree, logits, clock): the logits (tree_size, vocab) in the target's dtype — a static buffer, valid
            until the next step — and the `StepClock` bracketing the draft and verification phases.
        """
        self._root_at(committed)
        return self._run(committed // TAIL * TAIL, accept_greedy=False)

    def launch_greedy(self, sequences: torch.Tensor) -> GreedyStep:
        """Launch one greedy step rooted at the last token of `sequences` (1, length) int64, without waiting for it:
        draft, verification, greedy acceptance, compaction of the accepted path and the advance of the device's
        token buffer and C by the emitted tokens (`_accept_greedy`). Read it with `GreedyStep.result()`."""
        self.record(sequences)
        committed = sequences.shape[1] - 1
        self._root_at(committed)
        return self._launch(committed // TAIL * TAIL, committed)

    def chain_greedy(self, in_flight: GreedyStep, max_length: int | None) -> GreedyStep | None:
        """Launch the step after `in_flight` before `in_flight` is read back: its graph has already advanced the
        device's C and token buffer, so the new step reads its root from there.

        The host does not know that step's C yet, only that it lies in (C', C' + deepest path + 1] for the root C' of
        `in_flight`; returns None (launch it with `launch_greedy` once `in_flight` is read) when that range crosses a
        bucket boundary, when the step might not fit the buffers, or when `in_flight` may reach `max_length` tokens
        and end the call (its successor would be wasted work).
        """
        first, last = in_flight.committed + 1, in_flight.committed + self._path_slots.numel()
        if (first // TAIL != last // TAIL or last + 1 + TAIL + self.tree_size > self.capacity
                or (max_length is not None and last + 1 >= max_length)):
            return None
        step = self._launch(first // TAIL * TAIL, None)
        in_flight.successor = step
        return step

    def _root_at(self, committed: int) -> None:
        """Set the device's C from the host (and fill the draft's ring on a call's first step)."""
        if not self._ring_ready:  # once per call: the draft's ring takes the last window of the prompt
            self._fill_ring(committed)
        self.committed.fill_(committed)

    def _launch(self, bucket: int, committed: int | None) -> GreedyStep:
        _, packed, clock = self._run(bucket, accept_greedy=True)
        clock.mark()
        host = self._host_packed[0]
        self._host_packed.reverse()
        host.copy_(packed, non_blocking=True)  # enqueued before the next step overwrites `packed`
        done = None
        if self.device.type == "cuda":
            done = torch.cuda.Event()
            done.record()
        return GreedyStep(committed, host, done, clock)

    def _run(self, bucket: int, accept_greedy: bool) -> tuple[DraftTree, torch.Tensor, StepClock]:
        """Draft + verification (+ greedy acceptance) for the bucket at row `bucket`: graph replay, or a capture on a
        bucket's first step, or the eager code without CUDA graphs. Reads C from the device."""
        events = StepClock(self.device)
        if not self.cuda_graphs:
            tree, out = self._eager_step(bucket, accept_greedy, events)
            return tree, out, events
        key = (bucket, accept_greedy)
        if key in self._graphs:
            self._graphs.move_to_end(key)
            draft_graph, verify_graph, tree, out, self.hidden = self._graphs[key]
            draft_graph.replay()
            events.mark()
            verify_graph.replay()
            return tree, out, events
        tree, out = self._capture(bucket, accept_greedy, events)
        return tree, out, events

    def _capture(self, bucket: int, accept_greedy: bool, events: StepClock):
        # The first step in a bucket runs eagerly on the capture stream (this also warms up cuBLAS and Triton for
        # it), then the same code is captured for the following steps. Its result is returned as is.
        stream = self._stream
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            tree, out = self._eager_step(bucket, accept_greedy)
        torch.cuda.synchronize(self.device)
        events.mark()  # the eager first step of a bucket and its capture: `LongSpecStats.capture_s`
        events.captured = True
        while len(self._graphs) >= MAX_GRAPHS:
            self._graphs.popitem(last=False)
        draft_graph, verify_graph = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        hidden = self.hidden
        with self._compiled_regions():
            with torch.cuda.graph(draft_graph, pool=self._pool, stream=stream):
                static_tree = self._draft(bucket)
            with torch.cuda.graph(verify_graph, pool=self._pool, stream=stream):
                static_out = self._verify(bucket, static_tree)
                if accept_greedy:
                    static_out = self._accept_greedy(bucket, static_tree, static_out)
        self._graphs[(bucket, accept_greedy)] = (draft_graph, verify_graph, static_tree, static_out, self.hidden)
        self.hidden = hidden  # this step's (eager) hidden states, not the graph's buffer
        return tree, out

    def _eager_step(self, bucket: int, accept_greedy: bool = False, events: StepClock | None = None
                    ) -> tuple[DraftTree, torch.Tensor]:
        """Draft + verification run eagerly (under the compiled regions, if any), marking `events` in between.

        If torch.compile fails on these models (an architecture or wrapper dynamo cannot trace), warn and go on
        without the compiled draft phase, then, if the target's layers fail too, without any compiled region for this
        engine: the same tokens, slower steps. The step only writes buffers that a rerun rewrites, so it is simply
        run again.
        """
        try:
            with self._compiled_regions():
                tree = self._draft(bucket)
                if events is not None:
                    events.mark()
                logits = self._verify(bucket, tree)
                return tree, self._accept_greedy(bucket, tree, logits) if accept_greedy else logits
        except torch._dynamo.exc.TorchDynamoException as err:
            if not self._compiling():
                raise
            first_line = (str(err).strip().splitlines() or [""])[0][:200]
            dropped = "the compiled draft phase" if self._draft_phase is not draft_phase else "compiled regions"
            warnings.warn(f"LongSpec: torch.compile failed on this target or draft ({type(err).__name__}: "
                          f"{first_line}); decoding goes on without {dropped}. Pass longspec_compile=False to skip "
                          "the attempt.", RuntimeWarning, stacklevel=2)
            if self._draft_phase is not draft_phase:
                self._draft_phase = draft_phase
            else:
                self._compiled = {}
            if events is not None:
                del events.points[1:]
            return self._eager_step(bucket, accept_greedy, events)

    def _compiling(self) -> bool:
        return bool(self._compiled) or self._draft_phase is not draft_phase

    def _compiled_regions(self):
        """Within the block the target's decoder layers are the compiled ones (if `compile`; `draft_phase` is compiled
        as a function)."""
        if not self._compiling():
            return contextlib.nullcontext()
        target = self.target_ref()
        modules = [m for m in target.modules() if type(m) in self._compiled and "forward" not in vars(m)]
        return compat.compiled_methods([(m, *self._compiled[type(m)]) for m in modules])

    def _fill_ring(self, committed: int) -> None:
        start = max(0, committed - self.ring.window)
        if start < committed:
            positions = torch.arange(start, committed, device=self.device)
            self.ring.store_tokens(self.draft_ref(), self.tokens[start:committed], positions)
        self._ring_ready = True

    def _draft(self, bucket: int) -> DraftTree:
        """Static-shape tree growth for committed lengths in [bucket, bucket + TAIL) (reads `self.committed`)."""
        keys, values = self.cache.layers[-1].rows(bucket + TAIL)  # marked dynamic when compiling: every bucket
        return self._draft_phase(self.draft_ref(), self.ring, self.tokens, self.committed, keys, values,
                                 self._tail < self.committed - bucket, self.feature, self.beam_widths,
                                 self.retrieval_tokens, self.vocab, self.tree_nodes)

    def _verify(self, bucket: int, tree: DraftTree) -> torch.Tensor:
        """Static-shape verification forward; the tree's K/V land at rows bucket + TAIL ... (see module docstring).
        Returns the logits (tree_size, vocab); for a draft that reads the target's hidden states, `self.hidden` is
        then (tree_size, hidden), the state after each node."""
        c = self.committed
        mask = torch.cat([(self._tail < c - bucket).expand(self.tree_size, -1), tree.ancestors], dim=1)
        self.cache.set_length(bucket + TAIL)
        target = self.target_ref()
        with compat.final_hidden_states(target, self.reads_feature, self.feature_layers) as seen:
            out = target(
                input_ids=tree.tokens[None],
                position_ids=(c + tree.depths)[None],
                attention_mask=mask[None, None],
                past_key_values=self.cache,
                use_cache=True,
                longspec_tree_mask=mask,
            )
        self.hidden = seen[0][0] if seen else None
        return out.logits[0]

    def set_feature(self, hidden: torch.Tensor) -> None:
        """Store the target's state (config.target_feature_size,) at the last committed token for the next tree
        (no-op for a draft without `target_hidden_input`)."""
        if self.feature is not None:
            self.feature.copy_(hidden.view_as(self.feature))


    def _accept_greedy(self, bucket: int, tree: DraftTree, logits: torch.Tensor) -> torch.Tensor:
        """Greedy acceptance and compaction of the accepted path, on the device (capturable: no host sync).

        The target's choice after each node is the argmax of its logits (the bf16 → fp32 cast of the eager path is
        exact, and both take the first index of a tie); the accepted path is `verification.deepest_accepted`'s. The
        path's K/V rows move to the committed rows C, C + 1, ... of every layer, padded to `slots` = deepest path + 1
        rows: the padding rows lie past the new committed length, where nothing reads them before they are rewritten.

        Then the sequence advances on the device: the emitted tokens land in the token buffer after the root (the
        padding slots write past the new root, where nothing reads) and C grows by n, so the next step can start from
        the device's state (`chain_greedy`).

        Returns: (1 + 2 * slots,) int64 = [n, emitted tokens (n used: the accepted drafts, then the bonus), accepted
            tree indices (n used, root first)].
        Reference: LongSpec §3.3; `verification.accept` and `LongSpecCache.commit_path` (the eager twins).
        """
        choices = logits.argmax(dim=-1)
        last = deepest_accepted(tree, choices).view(1)  # a (1,) index: a 0-dim one would be read on the host
        if self.feature is not None:  # the next tree reads the state after the deepest accepted node
            self.feature.copy_(self.hidden[last].view_as(self.feature))
        slots = self._path_slots
        depth_slot = torch.where(tree.ancestors[last][0], tree.depths, slots.numel())  # off-path nodes: a spare slot
        path = torch.zeros(slots.numel() + 1, dtype=torch.long, device=self.device)
        path = path.scatter(0, depth_slot, torch.arange(tree.size, device=self.device))[:-1]
        n = tree.depths[last] + 1
        drafted = tree.tokens[path[(slots + 1).clamp(max=slots.numel() - 1)]]
        emitted = torch.where(slots < n - 1, drafted, choices[last])
        buffer = self.cache.storage.tensor
        rows = buffer.index_select(4, path + self.tree_start(bucket))  # gather first: sources and targets overlap
        buffer.index_copy_(4, self.committed + slots, rows)
        self.tokens.index_copy_(0, self.committed + 1 + slots, emitted)
        self.committed.add_(n[0])
        return torch.cat([n, emitted, path])


def draft_phase(draft, ring: DraftRingCache, tokens: torch.Tensor, committed: torch.Tensor, target_keys, target_values,
                tail_mask: torch.Tensor, feature, beam_widths: tuple[int, ...], retrieval_tokens: int,
                vocab: DraftVocabulary | None = None, tree_nodes: int | None = None) -> DraftTree:
    """The draft side of one static-shape step, capturable (no host sync) and compiled as one region.

    Refreshes the ring with the last `depth + 1` committed tokens (idempotent: a one-layer draft's K/V depend only on
    token and position), grows the tree rooted at token C (`tree.grow_tree`) and adds the retrieval branch found in
    the token buffer (`retrieval.py`). Compiled as a whole, the bookkeeping between the draft's forwards (top-k,
    scatters, masks, the retrieval scan and merge) fuses into a few kernels instead of ~30 per tree level.

    Args:
        draft: an attached `LongSpecDraft`. ring: its `DraftRingCache`.
        tokens: (capacity,) int64, the sequence's token buffer. committed: (,) int64, C (the root is token C).
        target_keys, target_values: (1, n_kv_heads, bucket + TAIL, head_dim), the target's last layer.
        tail_mask: (TAIL,) bool, which rows of the last block are committed. feature: (1, 1, hidden) or None.
        beam_widths: tree shape. retrieval_tokens: retrieval chain length (0: none).
        vocab: the draft's vocabulary for this call, or None (the whole vocabulary).
        tree_nodes: drafted nodes kept of the grown tree (`tree.best_nodes`), or None (all).
    Returns: the `DraftTree` (static size).
    Reference: LongSpec §3.3; module docstring.
    """
    if beam_widths:  # retrieval alone never runs the draft
        positions = (committed + torch.arange(-(len(beam_widths) + 1), 0, device=tokens.device)).clamp(min=0)
        ring.store_tokens(draft, tokens[positions], positions)
    tree = grow_tree(draft, ring, tokens[committed.view(1)], committed, target_keys, target_values, beam_widths,
                     target_tail_mask=tail_mask, target_hidden=feature, vocab=vocab, nodes=tree_nodes)
    if retrieval_tokens:
        tree = add_retrieval_branch(tree, *longest_match_continuation(tokens, committed, retrieval_tokens))
    return tree


def _compile_regions(target) -> dict[type, tuple[str, object]]:
    """{module class: (method name, its `torch.compile`d function)} for the target's decoder layers (the classes
    named in `_no_split_modules`, transformers' list of its repeated blocks). Layers that carry an instance-level
    `forward` (accelerate hooks, e.g. `device_map`) are left eager by `_compiled_regions`.
    """
    names = set(getattr(target, "_no_split_modules", None) or ())
    layers = {type(m) for m in target.modules() if type(m).__name__ in names}
    return {cls: ("forward", torch.compile(cls.forward)) for cls in layers}


def _compile_draft_phase():
    """`draft_phase` compiled (one region for the whole draft side of a step; dynamo keeps its code per tree shape)."""
    return torch.compile(draft_phase)


def _weight_storage(target, draft) -> tuple:
    """Addresses, dtypes and shapes of every parameter of both models: equal iff a captured graph still reads the
    live weights (`.to(dtype)`, re-loading or merging adapters replaces them)."""
    params = list(target.parameters()) + list(draft.parameters())
    return tuple((p.data_ptr(), p.dtype, p.shape) for p in params)


class GreedyStep:
    """A greedy step launched on the device (`StaticTreeStep.launch_greedy` / `chain_greedy`), read back once.

    Attributes:
        committed: C, the step's root position (None for a chained step until its predecessor is read).
        clock: the `StepClock` of its draft and verification.
        successor: the step chained behind this one, if any (its C is set when this one is read).
    """

    def __init__(self, committed: int | None, packed: torch.Tensor, done, clock: StepClock):
        self.committed, self.clock, self.successor = committed, clock, None
        self._packed, self._done = packed, done

    def result(self) -> tuple[int, list[int], list[int]]:
        """(n, the n emitted tokens (accepted drafts, then the bonus), the accepted tree indices root first); waits
        for the step (its one device-to-host read)."""
        if self._done is not None:
            self._done.synchronize()
        values = self._packed.tolist()
        slots = (len(values) - 1) // 2
        n = values[0]
        if self.successor is not None:
            self.successor.committed = self.committed + n
        return n, values[1 : 1 + n], values[1 + slots : 1 + slots + n]


class StepClock:
    """Marks phase boundaries of one decode step without a host sync: CUDA events on a GPU, perf_counter otherwise.

    Reference: `torch.cuda.Event(enable_timing=True)`.
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.points = []
        self.captured = False  # the step captured its graph pair (its time is capture, not draft + verification)
        self.mark()

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.points.append(event)
        else:
            self.points.append(time.perf_counter())

    def seconds(self) -> list[float]:
        """Durations (s) between consecutive marks; call after the work is done (synchronises on CUDA)."""
        if self.cuda:
            self.points[-1].synchronize()
            return [a.elapsed_time(b) / 1e3 for a, b in zip(self.points, self.points[1:])]
        return [b - a for a, b in zip(self.points, self.points[1:])]


__all__ = ["GreedyStep", "StaticTreeStep", "StepClock", "TAIL", "draft_phase"]
