"""The LongSpec decode loop behind `target.generate(ids, assistant_model=draft)`.

One step: the draft grows a tree from the last token → the target verifies the whole tree in one forward with
hybrid tree attention → the deepest path the target agrees with is accepted, plus one bonus token → the
accepted K/V are compacted in place into the committed cache → tokens are streamed and stopping criteria
checked token by token, exactly as plain decoding would.

Reference: LongSpec (arXiv 2502.17421) §3; transformers `GenerationMixin._assisted_decoding` (the method this
replaces for LongSpec assistants) and `CandidateGenerator`.
"""

from __future__ import annotations

import math
import operator
import time
from dataclasses import dataclass, field

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList
from transformers.generation.candidate_generator import CandidateGenerator
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, MaxTimeCriteria
from transformers.generation.utils import GenerateDecoderOnlyOutput

from . import compat
from .cache import DraftRingCache, LongSpecCache, initial_capacity
from .call_lock import one_call_at_a_time
from .configuration import validate_beam_widths
from .retrieval import (
    DEFAULT_RETRIEVAL_TOKENS,
    POLICY_RETRIEVAL_TOKENS,
    add_retrieval_branch,
    longest_match_continuation,
    validate_retrieval_tokens,
)
from .static_step import StaticTreeStep, StepClock
from .tree import DraftTree, grow_tree, kept_size
from .tree_policy import TreePolicy
from .verification import Acceptance, accept, choose_next_tokens, process_tree_logits, verify_tree
from .vocabulary import DraftVocabulary


@dataclass
class LongSpecStats:
    """Statistics of one LongSpec `generate` call (read them from `draft.last_generation_stats`).

    `draft.last_generation_stats` is None before the draft's first call and from the start of each call until the
    call is accepted (a refused call leaves None). A call that raised or was interrupted leaves `finished=False` and
    the work done until then (tokens emitted, forwards, seconds).

    Attributes:
        prompt_tokens, new_tokens: tokens.
        target_forwards: target forward passes, the prefill included.
        accepted_lengths: tokens emitted by each verification step (accepted drafts + bonus), in order.
        prefill_s, draft_s, verify_s, total_s: wall-clock seconds (CUDA synchronised at phase boundaries); draft_s and
            verify_s count the steps replayed or run as they are, not those that captured a CUDA graph pair.
        capture_steps, capture_s: steps that captured a CUDA graph pair (the first step in each new 512-token
            stretch of the context; on a process's first call it also compiles), and their seconds.
        beam_widths: the tree shape used. retrieval_tokens: length of the retrieval branch (0: none).
        tree_nodes: drafted nodes verified per step when fewer than the shape's (`longspec_tree_nodes`, or the tree
            policy's reranked variant), else None.
        draft_vocab_tokens: tokens the draft proposed from (its own vocabulary plus the prompt's tokens,
            `vocabulary.py`); 0 = the whole vocabulary.
        retrieval_accepted: drafted tokens accepted from the retrieval branch (the rest came from the draft's beams).
        draft_cache_bytes: bytes held by the draft's own cache (ring buffer + tree), constant in the context.
        finished: True once the call returned its output.
    """

    prompt_tokens: int = 0
    new_tokens: int = 0
    target_forwards: int = 0
    accepted_lengths: list[int] = field(default_factory=list)
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    capture_steps: int = 0
    capture_s: float = 0.0
    total_s: float = 0.0
    beam_widths: tuple[int, ...] = ()
    retrieval_tokens: int = 0
    tree_nodes: int | None = None
    draft_vocab_tokens: int = 0
    retrieval_accepted: int = 0
    draft_cache_bytes: int = 0
    finished: bool = False

    @property
    def tau(self) -> float:
        """τ: mean tokens emitted per verification forward (accepted drafts + bonus); NaN when no verification ran
        (max_new_tokens=1, or EOS as the first token): undefined, not zero acceptance."""
        if not self.accepted_lengths:
            return math.nan
        return sum(self.accepted_lengths) / len(self.accepted_lengths)

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens after the first, per second of decoding (prefill excluded)."""
        decode_s = self.total_s - self.prefill_s
        return (self.new_tokens - 1) / decode_s if decode_s > 0 and self.new_tokens > 1 else 0.0

    def acceptance_histogram(self) -> dict[int, int]:
        """{tokens emitted per step: number of steps}."""
        hist: dict[int, int] = {}
        for n in self.accepted_lengths:
            hist[n] = hist.get(n, 0) + 1
        return dict(sorted(hist.items()))


class _Timer:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()


class LongSpecCandidateGenerator(CandidateGenerator):
    """Draft side of LongSpec as a transformers `CandidateGenerator`: proposes a TREE of candidates.

    It keeps the draft's ring-buffer cache in step with the sequence: before each tree it writes the
    self-attention K/V of tokens committed since the last tree (at most `sliding_window` of them), so its memory
    is constant in the context length.

    Args:
        draft: an attached `LongSpecDraft`.
        target_cache: the target's `LongSpecCache` (its last layer feeds the draft's cross-attention).
        beam_widths: tree shape, beam width per depth.
        retrieval_tokens: length of the retrieval branch added to every tree (`retrieval.py`; 0: none).
        vocab: the draft's vocabulary for this call (`vocabulary.DraftVocabulary`, filled), or None.
        tree_nodes: verify the root and the `tree_nodes` best drafted nodes of the grown tree (`tree.best_nodes`);
            None: the whole tree.

    Reference: transformers `CandidateGenerator`; LongSpec §3.1, §3.3; prompt lookup decoding.
    """

    def __init__(self, draft, target_cache: LongSpecCache, beam_widths: tuple[int, ...], retrieval_tokens: int = 0,
                 vocab: DraftVocabulary | None = None, tree_nodes: int | None = None):
        self.draft, self.target_cache, self.beam_widths = draft, target_cache, beam_widths
        self.retrieval_tokens, self.vocab, self.tree_nodes = retrieval_tokens, vocab, tree_nodes
        param = next(draft.parameters())
        c = draft.config
        self.ring = DraftRingCache(c.sliding_window, 1 + sum(beam_widths), c.num_key_value_heads, c.head_dim,
                                   param.dtype, param.device)
        self._ring_end = 0  # every position < _ring_end that fits the window is in the ring
        self.reads_feature = draft.config.target_hidden_input  # the draft reads the target's hidden state
        self.feature_layers = tuple(draft.config.target_feature_layers or ())  # and these layers' outputs
        self.feature = None  # (1, 1, config.target_feature_size): the target's state at the last committed token

    def set_feature(self, hidden: torch.Tensor) -> None:
        """Keep the target's state (config.target_feature_size,) at the last committed token for the next tree."""
        if self.reads_feature:
            self.feature = hidden.reshape(1, 1, -1)

    def draft_tree(self, input_ids: torch.Tensor) -> DraftTree:
        """Grow the tree rooted at the last token of `input_ids` (1, cur_len); see `tree.grow_tree`."""
        root_position = input_ids.shape[1] - 1
        if self.target_cache.get_seq_length() != root_position:
            raise RuntimeError("the target cache must hold exactly the tokens before the root")  # internal invariant
        start = max(self._ring_end, root_position - self.ring.window)
        if start < root_position and self.beam_widths:
            positions = torch.arange(start, root_position, device=input_ids.device)
            self.ring.store_tokens(self.draft, input_ids[0, start:root_position], positions)
        self._ring_end = root_position
        last = self.target_cache.layers[-1]
        tree = grow_tree(self.draft, self.ring, input_ids[0, -1:], root_position, last.keys, last.values,
                         self.beam_widths, target_hidden=self.feature, vocab=self.vocab, nodes=self.tree_nodes)
        if self.retrieval_tokens:
            chain = longest_match_continuation(input_ids[0], root_position, self.retrieval_tokens)
            tree = add_retrieval_branch(tree, *chain)
        return tree

    def get_candidates(self, input_ids: torch.LongTensor, **kwargs) -> tuple[torch.LongTensor, None]:
        """CandidateGenerator API: `input_ids` followed by the flattened tree's drafted tokens (not a chain!).

        Returns: ((1, cur_len + tree_size - 1) int64, None). Use `draft_tree` for the tree structure.
        """
        tree = self.draft_tree(input_ids)
        return torch.cat([input_ids, tree.tokens[None, 1:]], dim=1), None

    def update_candidate_strategy(self, input_ids, scores, num_matches: int) -> None:
        """Nothing to adapt: the tree shape is fixed per call and the ring catches up in `draft_tree`."""


def resolve_beam_widths(draft, generation_config: GenerationConfig, override=None) -> tuple[int, ...] | None:
    """Tree shape for this call: `generate(longspec_beam_widths=...)` > `generation_config.longspec_beam_widths`, or
    None when neither names one (the decode loop then asks `tree_policy.TreePolicy`, which chooses among shapes up to
    the draft config's `beam_widths`). Raises ValueError for an invalid shape (see `validate_beam_widths`)."""
    widths = override if override is not None else getattr(generation_config, "longspec_beam_widths", None)
    if widths is None:
        return None
    widths = validate_beam_widths(widths, draft.config.vocab_size)
    if len(widths) >= draft.config.sliding_window:
        raise ValueError(
            f"a tree of depth {len(widths)} needs sliding_window > depth, got {draft.config.sliding_window}"
        )
    return widths


def resolve_retrieval(generation_config: GenerationConfig, override=None) -> int | None:
    """Retrieval branch length for this call: `generate(longspec_retrieval=...)` >
    `generation_config.longspec_retrieval`, or None when neither names one. Raises ValueError for a value that is not
    an int in [0, 64]."""
    value = override if override is not None else getattr(generation_config, "longspec_retrieval", None)
    return None if value is None else validate_retrieval_tokens(value)


def resolve_draft_vocab(draft, generation_config: GenerationConfig, override=None) -> int:
    """How many of the draft's frequent tokens this call proposes from (`vocabulary.py`; 0: the whole vocabulary):
    `generate(longspec_draft_vocab=...)` > `generation_config.longspec_draft_vocab` > all of them when the draft has
    a vocabulary of its own. True means all, False or 0 none, an integer n the n most frequent (0 ≤ n ≤
    `config.draft_vocab_size`; numpy / 0-dim tensor integers too). Raises ValueError for another value, or for True /
    n > 0 with a draft without a vocabulary of its own."""
    value = override if override is not None else getattr(generation_config, "longspec_draft_vocab", None)
    size = draft.config.draft_vocab_size
    if value is None:
        return size
    if not isinstance(value, bool):
        try:
            value = operator.index(value)
        except TypeError:
            raise ValueError(f"longspec_draft_vocab must be True, False, an int (how many of the draft's frequent "
                             f"tokens) or None (the default: the draft's own vocabulary when it has one), got "
                             f"{value!r}") from None
    if not isinstance(value, bool) and value < 0:
        raise ValueError(f"longspec_draft_vocab={value}: a count of frequent tokens cannot be negative; use a "
                         "positive int, True for all of them or False (0) for the whole vocabulary")
    if value and not size:
        raise ValueError(f"longspec_draft_vocab={value}, but this draft proposes from the whole vocabulary "
                         "(config.draft_vocab_size = 0); drop the option, or give the draft a vocabulary with "
                         "draft.set_draft_vocabulary(...)")
    if isinstance(value, bool):
        return size if value else 0
    if not 0 <= value <= size:
        raise ValueError(f"longspec_draft_vocab={value}: this draft's vocabulary holds {size} frequent tokens; use "
                         f"1 to {size}, True for all of them or False (0) for the whole vocabulary")
    return value


def resolve_tree_nodes(generation_config: GenerationConfig, override=None) -> int | None:
    """Drafted nodes verified per step for this call: `generate(longspec_tree_nodes=...)` >
    `generation_config.longspec_tree_nodes`, or None (every node of the tree shape). An int n >= 1 keeps the n best
    nodes of the grown tree by cumulative draft log-probability (`tree.best_nodes`; a shape of n or fewer nodes is
    verified whole). Raises ValueError for another value."""
    value = override if override is not None else getattr(generation_config, "longspec_tree_nodes", None)
    if value is None:
        return None
    try:
        if isinstance(value, bool):
            raise TypeError
        value = operator.index(value)
    except TypeError:
        raise ValueError(f"longspec_tree_nodes must be an int (drafted nodes verified per step) or None (the whole "
                         f"tree), got {value!r}") from None
    if value < 1:
        raise ValueError(f"longspec_tree_nodes={value}: verify at least 1 drafted node, or pass "
                         "longspec_beam_widths=[] to verify none (retrieval alone)")
    return value


def _default_tree(target, draft, widths, n_retrieval, nodes,
                  prompt) -> tuple[tuple[int, ...], int, int | None, TreePolicy | None]:
    """(beam_widths, retrieval_tokens, tree_nodes, the policy that chose them or None): a named tree is used as named
    (retrieval `DEFAULT_RETRIEVAL_TOKENS` unless named too, `nodes` as named); otherwise the draft's
    `tree_policy.TreePolicy` (kept on it, costs measured on first use) picks the shape of highest predicted speed on
    this device, whole or reranked, and the retrieval length too when the call names none (its gain estimated on
    `prompt`, (length,) int64)."""
    if widths is not None:
        return widths, DEFAULT_RETRIEVAL_TOKENS if n_retrieval is None else n_retrieval, nodes, None
    largest = validate_beam_widths(draft.config.beam_widths, draft.config.vocab_size)
    policy = draft.__dict__.get("_tree_policy")
    if policy is None or policy.largest != largest:
        policy = draft.__dict__["_tree_policy"] = TreePolicy(largest, draft.config.vocab_size)
    options = (0, *POLICY_RETRIEVAL_TOKENS) if n_retrieval is None else (n_retrieval,)
    return (*policy.choose(target, draft, options, prompt), policy)


@one_call_at_a_time
def longspec_tree_decode(
    target,
    draft,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config: GenerationConfig,
    streamer=None,
    beam_widths=None,
    static_shapes=None,
    compile=None,
    retrieval=None,
    draft_vocab=None,
    tree_nodes=None,
    **model_kwargs,
) -> GenerateDecoderOnlyOutput | torch.LongTensor:
    """Lossless LongSpec tree decoding for batch size 1 (called by the patched `generate`).

    Args:
        target: the target `*ForCausalLM`. draft: an attached `LongSpecDraft`.
        input_ids: (1, prompt_len) int64. logits_processor, stopping_criteria, generation_config: as prepared by
            `generate`. streamer: a transformers streamer or None.
        beam_widths: per-call tree shape (`generate(longspec_beam_widths=...)`), optional.
        static_shapes: `generate(longspec_static_shapes=...)`: True runs the draft and the verification with
            static shapes, captured as CUDA graphs on a GPU (`static_step.py`); False runs them eagerly with exactly
            sized tensors; None (default) means True on CUDA and False elsewhere. Both are lossless. With static
            shapes the target cache and the graphs are kept on the draft for the next call (free them with
            `draft.free_static_buffers()`) and the returned output carries no past_key_values.
        compile: `generate(longspec_compile=...)`: True runs the draft step and the target's decoder layers as
            `torch.compile` regions inside the static-shape step (fused kernels; compiled on the first call, tens of
            seconds on a GPU, then reused); None (default) means True with static shapes on CUDA, False elsewhere.
        retrieval: `generate(longspec_retrieval=...)`: tokens in the retrieval branch that every tree carries beside
            the draft's beams (the continuation of the longest earlier match of the latest tokens, `retrieval.py`);
            0 turns it off; None (default) means `retrieval.DEFAULT_RETRIEVAL_TOKENS`. With
            `longspec_beam_widths=[]` the draft is never run: retrieval alone (exact prompt lookup).
        draft_vocab: `generate(longspec_draft_vocab=...)`: the draft proposes only from its own vocabulary and the
            prompt's tokens (`vocabulary.py`: its LM head reads a fraction of the rows); None (default) means True
            for a draft that has one (`config.draft_vocab_size > 0`); an int n keeps its n most frequent tokens
            (fewer rows, a cheaper draft step). Lossless either way.
        tree_nodes: `generate(longspec_tree_nodes=...)`: grow the tree shape, then verify only its `tree_nodes` best
            drafted nodes by cumulative draft log-probability (`tree.best_nodes`, EAGLE-2's reranking): deep where
            the draft is confident, wide where it is not, at the verification cost of `tree_nodes + 1` tokens. Without
            a named shape the candidates are the draft config's `beam_widths` (no tree policy). None (default):
            every node of a named shape; with no shape named the tree policy may choose a reranked variant of one
            (`tree_policy.reranked`), reported in `LongSpecStats.tree_nodes`.
            All six options may also be set on the `GenerationConfig` (`longspec_compile=...`); the call wins.
        **model_kwargs: from `generate` (attention_mask, past_key_values, use_cache, ...).
    Returns: (1, prompt_len + new) int64, or `GenerateDecoderOnlyOutput` with `return_dict_in_generate=True`.
    Raises: ValueError for what cannot be honoured (see `compat.check_generate_call`).
    Calls sharing a target or a draft run one at a time (a second thread waits; `call_lock.one_call_at_a_time`).
    Reference: LongSpec §3; transformers `GenerationMixin._assisted_decoding`.
    """
    compat.check_generate_call(target, draft, input_ids, generation_config, model_kwargs, logits_processor)
    widths, n_retrieval = resolve_beam_widths(draft, generation_config, beam_widths), resolve_retrieval(
        generation_config, retrieval)
    use_vocab = resolve_draft_vocab(draft, generation_config, draft_vocab)  # every option checked before any work
    nodes = resolve_tree_nodes(generation_config, tree_nodes)
    if nodes is not None and widths == ():
        raise ValueError(f"longspec_tree_nodes={nodes} with longspec_beam_widths=[]: there is no draft tree to keep "
                         "nodes of; drop longspec_tree_nodes (retrieval alone) or name a tree shape")
    if nodes is not None and widths is None:  # reranking a named number of nodes: the largest shape, no policy
        widths = validate_beam_widths(draft.config.beam_widths, draft.config.vocab_size)
    device = input_ids.device
    static_shapes, compile = _resolve_static_options(static_shapes, compile, generation_config, device)
    widths, n_retrieval, nodes, policy = _default_tree(target, draft, widths, n_retrieval, nodes, input_ids[0])
    use_vocab = use_vocab if widths else 0
    nodes = nodes if nodes is not None and nodes < sum(widths) else None
    stats = LongSpecStats(prompt_tokens=input_ids.shape[1], beam_widths=widths, retrieval_tokens=n_retrieval,
                          tree_nodes=nodes)
    draft.last_generation_stats = stats
    timer = _Timer(device)
    start = timer.now()
    capacity = initial_capacity(input_ids.shape[1], generation_config.max_length) + 1 + sum(widths) + n_retrieval
    if static_shapes:
        drafter = _static_engine(target, draft, widths, n_retrieval, capacity, compile, use_vocab, nodes)
        cache = drafter.start(input_ids)
    else:
        cache = LongSpecCache(target.config.get_text_config().num_hidden_layers, capacity)
        vocab = DraftVocabulary.for_prompt(draft, input_ids[0], use_vocab) if use_vocab else None
        drafter = LongSpecCandidateGenerator(draft, cache, widths, n_retrieval, vocab, nodes)
    stats.draft_vocab_tokens = drafter.vocab.tokens if drafter.vocab is not None else 0
    logits = _prefill(target, drafter, input_ids, cache)
    scores = logits_processor(input_ids, logits.clone()) if logits_processor else logits
    new_tokens = choose_next_tokens(scores, generation_config.do_sample)
    stats.target_forwards, stats.prefill_s = 1, timer.now() - start
    output = _Output(input_ids, generation_config, stopping_criteria, streamer, stats)
    done = output.extend(new_tokens, logits, scores)
    stats.draft_cache_bytes = drafter.ring.nbytes()
    draft_size = kept_size(widths, nodes)  # tree nodes at or past this index: the retrieval branch
    from_retrieval = torch.zeros((), dtype=torch.long, device=device)  # summed on the device: no extra sync
    # greedy without processors or returned scores: acceptance and compaction run inside the step's graphs
    on_device = static_shapes and output.host_stop is not None and not (
        generation_config.do_sample or logits_processor or output.keeps_scores)
    with compat.tree_attention(target):
        if on_device:
            if not done:
                from_retrieval += _greedy_steps_on_device(drafter, output, stats, draft_size)
        else:
            while not done:
                committed = output.sequences.shape[1] - 1  # the root, the last emitted token, is not in the cache yet
                accepted, logits, scores, clock = _host_step(target, drafter, cache, output.sequences, committed,
                                                             logits_processor, generation_config.do_sample)
                _count_step(stats, clock, accepted.new_tokens.numel())
                from_retrieval += (accepted.path >= draft_size).sum()
                done = output.extend(accepted.new_tokens, logits[accepted.path], scores[accepted.path])
    if streamer is not None:
        streamer.end()
    stats.new_tokens = output.sequences.shape[1] - stats.prompt_tokens
    stats.retrieval_accepted = int(from_retrieval)
    if policy is not None:
        policy.observe(widths, n_retrieval, stats.accepted_lengths, stats.retrieval_accepted, stats.draft_s,
                       stats.verify_s, nodes)
    stats.total_s = timer.now() - start
    return output.result(None if static_shapes else cache)


def _prefill(target, drafter, input_ids: torch.Tensor, cache: LongSpecCache) -> torch.Tensor:
    """The target's forward over the prompt (1, prompt_len) into `cache`; returns the fp32 logits (1, vocab) of the
    last position and hands the hidden state there to a draft that reads it (`set_feature`)."""
    with compat.final_hidden_states(target, drafter.reads_feature, drafter.feature_layers) as seen:
        logits = target(input_ids=input_ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[0, -1:]
    if seen:
        drafter.set_feature(seen[0][0, -1])
    return logits.float()


def _host_step(target, drafter, cache: LongSpecCache, sequences: torch.Tensor, committed: int, logits_processor,
               do_sample: bool) -> tuple[Acceptance, torch.Tensor, torch.Tensor, StepClock]:
    """One step with acceptance on the host: tree, verification, logits processors per node, acceptance, compaction
    of the accepted path, and the target's hidden state after its last node for the next tree (feature drafts).
    Returns: (acceptance, fp32 logits and processed scores (tree_size, vocab), the step's clock)."""
    engine = isinstance(drafter, StaticTreeStep)
    with compat.final_hidden_states(target, drafter.reads_feature and not engine, drafter.feature_layers) as seen:
        tree, logits, clock, tree_start = _draft_and_verify(target, drafter, cache, sequences, committed)
    scores = process_tree_logits(logits, tree, sequences, logits_processor)
    accepted = accept(tree, choose_next_tokens(scores, do_sample))
    cache.commit_path(committed, accepted.path, tree_start)
    hidden = drafter.hidden if engine else (seen[0][0] if seen else None)
    if hidden is not None:
        drafter.set_feature(hidden[accepted.path[-1]])
    return accepted, logits, scores, clock


def _draft_and_verify(target, drafter, cache: LongSpecCache, sequences: torch.Tensor, committed: int):
    """One tree and its verification, with static shapes (`drafter` a `StaticTreeStep`) or eagerly (a
    `LongSpecCandidateGenerator`). Returns (tree, fp32 logits (tree_size, vocab), clock, cache row of tree node 0 or
    None for "right after the committed rows")."""
    if isinstance(drafter, StaticTreeStep):
        drafter.record(sequences)
        tree, logits, clock = drafter.draft_and_verify(committed)
        tree_start = drafter.tree_start(committed)
    else:
        clock = StepClock(sequences.device)
        tree = drafter.draft_tree(sequences)
        clock.mark()
        logits, tree_start = verify_tree(target, tree, cache), None
    logits = logits.float()
    clock.mark()
    return tree, logits, clock, tree_start


def _greedy_steps_on_device(engine: StaticTreeStep, output: _Output, stats: LongSpecStats, draft_size: int) -> int:
    """Greedy decoding with acceptance inside the step's graphs, until a stopping criterion is met; returns the drafted
    tokens accepted from the retrieval branch (tree indices >= `draft_size`).

    Each step is launched before the previous one is read back where the host can tell its bucket
    (`StaticTreeStep.chain_greedy`), so the host's work on step k (read-back, stopping checks, streaming) overlaps
    the GPU's work on step k + 1. A step chained behind the one that meets a stopping criterion is dropped unread
    (it only wrote cache rows and tokens past the output).
    """
    from_retrieval = 0
    step = engine.launch_greedy(output.sequences)
    while True:
        ahead = engine.chain_greedy(step, output.host_stop.max_length)
        n, tokens, path = step.result()
        _count_step(stats, step.clock, n)
        from_retrieval += sum(index >= draft_size for index in path)
        emitted = engine.tokens[step.committed + 1 : step.committed + 1 + n]  # written there by the step's graph
        if output.extend(emitted, None, None, token_list=tokens):
            return from_retrieval
        step = ahead if ahead is not None else engine.launch_greedy(output.sequences)


def _count_step(stats: LongSpecStats, clock: StepClock, emitted: int) -> None:
    """Add one verification step that emitted `emitted` tokens, and its draft / verification times (or, for a step
    that captured graphs, its capture time), to `stats`."""
    draft_s, verify_s = clock.seconds()
    if clock.captured:
        stats.capture_steps, stats.capture_s = stats.capture_steps + 1, stats.capture_s + draft_s + verify_s
    else:
        stats.draft_s, stats.verify_s = stats.draft_s + draft_s, stats.verify_s + verify_s
    stats.target_forwards += 1
    stats.accepted_lengths.append(emitted)


def _resolve_static_options(static_shapes, compile, generation_config: GenerationConfig,
                            device: torch.device) -> tuple[bool, bool]:
    """(static_shapes, compile) for this call: the `longspec_static_shapes` / `longspec_compile` options of the call,
    else of `generation_config`, else the default (both on CUDA, both off elsewhere). Raises ValueError for a
    non-bool value or compile without static shapes, naming the fix."""
    if static_shapes is None:
        static_shapes = getattr(generation_config, "longspec_static_shapes", None)
    if compile is None:
        compile = getattr(generation_config, "longspec_compile", None)
    for name, value in (("static_shapes", static_shapes), ("compile", compile)):
        if value is not None and not isinstance(value, bool):
            raise ValueError(f"longspec_{name} must be True, False or None (the default), got {value!r}")
    if compile and static_shapes is False:
        raise ValueError("longspec_compile=True compiles the static-shape step: drop longspec_static_shapes=False "
                         "or longspec_compile=True")
    if compile and static_shapes is None and device.type != "cuda":
        raise ValueError(f"longspec_compile=True compiles the static-shape step, which is off by default on "
                         f"{device.type}: add longspec_static_shapes=True (compiling on a CPU takes tens of seconds) "
                         "or drop longspec_compile")
    static_shapes = device.type == "cuda" if static_shapes is None else static_shapes
    return static_shapes, (static_shapes and device.type == "cuda") if compile is None else compile


def _static_engine(target, draft, widths, retrieval_tokens: int, capacity: int, compile: bool = False,
                   draft_vocab: int = 0, tree_nodes: int | None = None) -> StaticTreeStep:
    """The draft's `StaticTreeStep` for this call, reused when it fits (same models, tree and tree_nodes, compile
    flag, draft vocabulary choice, enough capacity)."""
    engine = draft.__dict__.get("_static_step")
    if engine is None or not engine.fits(target, draft, widths, capacity, compile, retrieval_tokens, draft_vocab,
                                         tree_nodes):
        draft.__dict__.pop("_static_step", None)  # free the old buffers before allocating new ones
        on_cuda = next(target.parameters()).device.type == "cuda"
        engine = StaticTreeStep(target, draft, widths, capacity, cuda_graphs=on_cuda, compile=compile,
                                retrieval_tokens=retrieval_tokens, draft_vocab=draft_vocab, tree_nodes=tree_nodes)
        draft.__dict__["_static_step"] = engine
    return engine


class _Output:
    """Emitted tokens (and optional scores/logits), appended one token at a time like plain decoding.

    Stopping is decided on the host from one read-back of the step's tokens when every stopping criterion is a
    known host-checkable kind (max length, EOS, max time); otherwise each criterion is called token by token
    with the sequence so far, exactly as plain decoding calls it.
    """

    def __init__(self, input_ids: torch.Tensor, generation_config: GenerationConfig, stopping_criteria, streamer,
                 stats: LongSpecStats):
        self.sequences, self.stats = input_ids, stats
        self.config = generation_config
        self.stopping_criteria, self.streamer = stopping_criteria, streamer
        self.host_stop = _host_stop_rule(stopping_criteria)
        # plain decoding calls these per token; beyond the target's context they warn (once), as here
        self.context_warnings = [c for c in stopping_criteria or [] if type(c) is MaxLengthCriteria
                                 and c.max_position_embeddings is not None]
        keep = generation_config.return_dict_in_generate
        self.scores = [] if keep and generation_config.output_scores else None
        self.logits = [] if keep and generation_config.output_logits else None
        self.keeps_scores = self.scores is not None or self.logits is not None

    def extend(self, tokens, logits, scores, token_list: list[int] | None = None) -> bool:
        """Append `tokens` (n,) int64, up to and including the first token that meets a stopping criterion.

        `logits`/`scores` (n, vocab): the raw / processed target scores that chose each token (None when neither is
        kept nor checked: host-checkable stopping criteria). `token_list`: the tokens already read back, if they were.
        Returns: True when generation is finished.
        """
        if token_list is None:
            token_list = tokens.tolist()  # the step's one read-back of emitted tokens
        if self.host_stop is not None:
            keep, done = self.host_stop(self.sequences.shape[1], token_list)
        else:
            keep, done = len(token_list), False
        for i in range(keep):
            if self.host_stop is None:
                self.sequences = torch.cat([self.sequences, tokens[i].view(1, 1)], dim=1)
            if self.scores is not None:
                self.scores.append(scores[i : i + 1])
            if self.logits is not None:
                self.logits.append(logits[i : i + 1])
            if self.streamer is not None:
                self.streamer.put(torch.tensor([token_list[i]]))
            if self.host_stop is None and self.stopping_criteria(self.sequences, scores[i : i + 1]).any():
                return True
        if self.host_stop is not None:
            self.sequences = torch.cat([self.sequences, tokens[None, :keep]], dim=1)
            for criterion in self.context_warnings:
                if self.sequences.shape[1] > criterion.max_position_embeddings:
                    criterion(self.sequences, None)
        self.stats.new_tokens = self.sequences.shape[1] - self.stats.prompt_tokens
        return done

    def result(self, cache: LongSpecCache | None):
        if not self.config.return_dict_in_generate:
            return self.sequences
        return GenerateDecoderOnlyOutput(
            sequences=self.sequences,
            scores=tuple(self.scores) if self.scores is not None else None,
            logits=tuple(self.logits) if self.logits is not None else None,
            past_key_values=cache,
        )


class _HostStop:
    """A host-side equivalent of stopping criteria that are all `MaxLengthCriteria`, `EosTokenCriteria` or
    `MaxTimeCriteria` (what `generate` builds from max_length / max_new_tokens, eos_token_id and max_time), called
    as f(length before, tokens) -> (tokens to keep, done). `max_length`: the smallest max length (tokens) or None."""

    def __init__(self, max_length: int | None, eos: set[int], deadlines: list[float]):
        self.max_length, self.eos, self.deadlines = max_length, eos, deadlines

    def __call__(self, length: int, tokens: list[int]) -> tuple[int, bool]:
        for i, token in enumerate(tokens):
            n = length + i + 1
            if ((self.max_length is not None and n >= self.max_length) or token in self.eos
                    or any(time.time() > d for d in self.deadlines)):
                return i + 1, True
        return len(tokens), False


def _host_stop_rule(stopping_criteria) -> _HostStop | None:
    """`_HostStop` for `stopping_criteria`, or None when one of them is of another kind (checked per token)."""
    max_length, eos, deadlines = None, set(), []
    for criterion in stopping_criteria or []:
        if type(criterion) is MaxLengthCriteria:
            max_length = criterion.max_length if max_length is None else min(max_length, criterion.max_length)
        elif type(criterion) is EosTokenCriteria:
            eos.update(criterion.eos_token_id.flatten().tolist())
        elif type(criterion) is MaxTimeCriteria:
            deadlines.append(criterion.initial_timestamp + criterion.max_time)
        else:
            return None
    return _HostStop(max_length, eos, deadlines)


__all__ = ["longspec_tree_decode", "LongSpecCandidateGenerator", "LongSpecStats", "resolve_beam_widths",
           "resolve_tree_nodes", "resolve_draft_vocab", "resolve_retrieval"]
