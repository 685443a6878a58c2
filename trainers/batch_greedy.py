"""Greedy answers of a target to a batch of prompts: one static cache, chunked prefill, a replayed decode step.

Chat self-distillation needs thousands of the target's answers inside a lease. `target.generate` on a left-padded
batch grows a dynamic cache by concatenation and pays the host's Python per step, which made it ~440 new
tokens/s for 192 prompts on an H200 (benchmarks/NOTES.md, session 10). Here the batch gets one `StaticCache` of
`capacity` = longest prompt + new tokens rounded up to 512; every row is left-padded to the longest prompt, so all
rows write the same cache slot at every step, and each row's own positions and padding live in an additive mask
built on the device:

    slot     0 ........ pad_r ........ W-1 | W ........ W+n-1       (W = longest prompt, n = new tokens)
    row r    pad pad .. prompt tokens ...  | answer tokens
    position -         0 .... W-1-pad_r    | W-pad_r ...
    query at slot s sees keys k with pad_r <= k <= s (a padding query sees itself, so no softmax row is empty)

The prompt runs in chunks of at most `prefill_tokens` tokens across the batch (bounded activation and mask
memory at 16k-token prompts). Then the one-token step does all of its bookkeeping in place on the device (mask,
forward, argmax, answer buffer, stop flags) and on CUDA is captured once as a CUDA graph and replayed. The host
reads the device every `check_every` steps, to stop once every row has written a stop token. Attention runs as
"longspec_packed_sdpa": it reads the cache's kv heads as they are, where transformers' SDPA would copy them once
per query head under a mask (benchmarks/NOTES.md, session 14: that copy was the step).

Plain argmax decoding, no logits processors: what greedy verification accepts, and what `target.generate(
do_sample=False)` returns for a target whose generation_config asks for no processing (a repetition penalty in a
hub generation_config is not applied here). In fp32 the answers equal the one-by-one greedy ones (tests); in bf16
they may differ from them at near-ties, as any two batch shapes do.

Reference: transformers `StaticCache` (in-place cache, device-side write index) and custom 4D attention masks
(`masking_utils`: a 4D mask is used as given); gpt-fast `generate.py` (static cache, captured one-token step);
PyTorch "CUDA Graphs" (`torch.cuda.graph`, side-stream warm-up before capture).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..cache import _round_up
from ..compat import packed_sdpa_attention

__all__ = ["CAPACITY_STEP", "batch_greedy", "batch_greedy_unsupported", "cut_after_stop", "left_pad"]

CAPACITY_STEP = 512  # cache slots are longest prompt + new tokens rounded up to this
WARM_UP_STEPS = 2  # eager runs of the step on a side stream before capture


def batch_greedy_unsupported(target) -> str | None:
    """Why `batch_greedy` cannot decode `target` (None: it can).

    The one static cache with one mask per row assumes every layer attends to the whole cache: a target with
    sliding-window or chunked layers keeps a rolling cache whose slots the mask would misread.

    Args:
        target: a `*ForCausalLM`.
    Returns: a sentence naming the unsupported feature, or None.
    """
    config = target.config
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if layer_types != {"full_attention"}:
        return f"its layers are {sorted(layer_types)}, not all full attention"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return f"it uses a sliding window of {config.sliding_window} tokens"
    return None


def left_pad(prompts: Sequence[Sequence[int]], pad_token_id: int) -> tuple[torch.Tensor, list[int]]:
    """The prompts right-aligned in one (B, W) int64 tensor (W = longest), padded on the left with `pad_token_id`;
    and each row's padding length (tokens)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(list(prompt), dtype=torch.long)
    return ids, [width - len(p) for p in prompts]


def cut_after_stop(tokens: list[int], stops: set[int]) -> list[int]:
    """`tokens` up to and including the first one in `stops` (all of them when none is)."""
    return tokens[: next((t + 1 for t, token in enumerate(tokens) if token in stops), len(tokens))]


def _mask(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive attention mask (same shape, `dtype`): 0 where `visible`, the dtype's minimum elsewhere."""
    return torch.where(visible, 0.0, torch.finfo(dtype).min).to(dtype)


class _Decoder:
    """The static state of one batch: cache, left padding, answer buffer, stop flags and the one-token step."""

    def __init__(self, target, batch: int, capacity: int, max_new_tokens: int, stop_ids: Sequence[int],
                 device: torch.device):
        from transformers import StaticCache

        self.target, self.dtype = target, target.dtype
        self.cache = StaticCache(config=target.config, max_cache_len=capacity)
        self.key_index = torch.arange(capacity, device=device)  # (capacity,) int64 slot of each key
        self.pad = torch.zeros(batch, dtype=torch.long, device=device)  # (B,) padding slots before each prompt
        self.slot = torch.zeros(1, dtype=torch.long, device=device)  # slot of the token fed to the next step
        self.count = torch.zeros(1, dtype=torch.long, device=device)  # answer tokens so far
        self.token = torch.zeros(batch, 1, dtype=torch.long, device=device)  # (B, 1) next step's input
        self.answers = torch.zeros(batch, max(max_new_tokens, WARM_UP_STEPS + 2), dtype=torch.long, device=device)
        self.done = torch.zeros(batch, dtype=torch.bool, device=device)  # (B,) row has written a stop token
        self.stops = torch.tensor(sorted(set(stop_ids)) or [-1], dtype=torch.long, device=device)
        self.graph = None

    def prefill(self, ids: torch.Tensor, pad: torch.Tensor, prefill_tokens: int) -> None:
        """Reset the cache and run the left-padded prompts (B, W) in chunks; the first answer token lands in
        `answers[:, 0]`."""
        self.cache.reset()
        self.pad.copy_(pad)
        batch, width = ids.shape
        chunk = max(1, prefill_tokens // batch)
        for start in range(0, width, chunk):
            end = min(start + chunk, width)
            query = torch.arange(start, end, device=ids.device)  # (Q,) slots
            keys, rows = self.key_index.view(1, 1, -1), self.pad.view(-1, 1, 1)
            visible = ((keys >= rows) & (keys <= query.view(1, -1, 1))) | (keys == query.view(1, -1, 1))
            positions = (query.view(1, -1) - self.pad.view(-1, 1)).clamp(min=0)  # (B, Q)
            logits = self.target(input_ids=ids[:, start:end], position_ids=positions,
                                 attention_mask=_mask(visible, self.dtype).unsqueeze(1), past_key_values=self.cache,
                                 use_cache=True, logits_to_keep=1).logits
        first = logits[:, -1].argmax(-1)  # (B,) int64
        self.answers[:, 0] = first
        self.token.copy_(first.view(-1, 1))
        self.done.copy_((first.view(-1, 1) == self.stops).any(-1))
        self.slot.fill_(width)
        self.count.fill_(1)

    def step(self) -> None:
        """One token per row, every tensor updated in place (capturable)."""
        visible = (self.key_index >= self.pad.view(-1, 1)) & (self.key_index <= self.slot)  # (B, capacity)
        positions = (self.slot - self.pad).view(-1, 1)  # (B, 1)
        logits = self.target(input_ids=self.token, position_ids=positions,
                             attention_mask=_mask(visible, self.dtype).view(visible.shape[0], 1, 1, -1),
                             past_key_values=self.cache, use_cache=True).logits
        nxt = logits[:, -1].argmax(-1)  # (B,) int64
        self.answers.index_copy_(1, self.count, nxt.view(-1, 1))
        self.done.logical_or_((nxt.view(-1, 1) == self.stops).any(-1))
        self.token.copy_(nxt.view(-1, 1))
        self.slot.add_(1)
        self.count.add_(1)

    def capture(self, device: torch.device) -> None:
        """Warm the step up on a side stream and capture it as one CUDA graph (the state is reset by `prefill`)."""
        self.prefill(torch.zeros(self.pad.numel(), 1, dtype=torch.long, device=device), self.pad, 1)
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for _ in range(WARM_UP_STEPS):
                self.step()
        torch.cuda.current_stream(device).wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.step()


@torch.no_grad()
def batch_greedy(target, prompt_ids: Sequence[Sequence[int]], max_new_tokens: int, stop_ids: Sequence[int] = (),
                 pad_token_id: int = 0, prefill_tokens: int = 16384, check_every: int = 16,
                 cuda_graph: bool = True) -> list[list[int]]:
    """The target's greedy answers to a batch of prompts, each cut after its first stop token (kept).

    Args:
        target: a `*ForCausalLM` in eval mode, full-attention layers only (`batch_greedy_unsupported`); its device
            and dtype are used as they are.
        prompt_ids: B token-id lists (chat-templated prompts), each non-empty; any lengths (left-padded here).
        max_new_tokens: answer length at most (tokens).
        stop_ids: token ids that end an answer (EOS, end of turn; one int or None accepted); empty = always
            `max_new_tokens`.
        pad_token_id: id fed at padding slots (masked; any valid id).
        prefill_tokens: prompt tokens per prefill forward across the batch (memory bound: the chunk's mask is
            B x chunk x capacity, repeated n_heads / n_kv_heads times inside the attention, and its activations
            chunk x B tokens).
        check_every: decode steps between device -> host reads of the stop flags.
        cuda_graph: on CUDA, capture the step and replay it (False: eager steps).
    Returns: B lists of int answer ids, in the order of `prompt_ids`.
    Raises: ValueError for a tensor instead of lists, an empty batch or prompt, max_new_tokens / prefill_tokens /
        check_every not ints >= 1, a pad_token_id that is not an int, or a target `batch_greedy_unsupported` names
        (a sliding window, even one longer than prompt + answer).
    Reference: transformers `StaticCache` and 4D attention masks; gpt-fast `generate.py`; PyTorch CUDA Graphs.
    """
    if isinstance(prompt_ids, torch.Tensor):
        raise ValueError("batch_greedy takes a list of token-id lists (any lengths, no padding), not a tensor: pass "
                         "input_ids.tolist() without the padding")
    if not prompt_ids or any(len(p) == 0 for p in prompt_ids):
        raise ValueError("batch_greedy needs at least one prompt and no empty prompt")
    counts = (max_new_tokens, prefill_tokens, check_every)
    if any(isinstance(n, bool) or not isinstance(n, int) for n in counts) or min(counts) < 1:
        raise ValueError(f"max_new_tokens, prefill_tokens and check_every must be ints >= 1, got {max_new_tokens!r}, "
                         f"{prefill_tokens!r}, {check_every!r}")
    if not isinstance(pad_token_id, int):
        raise ValueError(f"pad_token_id must be a token id (int), got {pad_token_id!r}")
    stop_ids = () if stop_ids is None else [stop_ids] if isinstance(stop_ids, int) else stop_ids
    reason = batch_greedy_unsupported(target)
    if reason is not None:
        raise ValueError(f"batch_greedy cannot decode this target: {reason}; use target.generate instead")
    device = next(target.parameters()).device
    ids, pads = left_pad(prompt_ids, pad_token_id)
    capacity = _round_up(ids.shape[1] + max_new_tokens, CAPACITY_STEP)
    pad = torch.tensor(pads, dtype=torch.long, device=device)
    decoder = _Decoder(target, len(prompt_ids), capacity, max_new_tokens, stop_ids, device)
    with packed_sdpa_attention(target):
        if cuda_graph and device.type == "cuda":
            decoder.capture(device)
        decoder.prefill(ids.to(device), pad, prefill_tokens)
        step = decoder.graph.replay if decoder.graph is not None else decoder.step
        made = 1
        while made < max_new_tokens and not bool(decoder.done.all()):
            for _ in range(min(check_every, max_new_tokens - made)):
                step()
                made += 1
    stops = set(stop_ids)
    return [cut_after_stop(row, stops) for row in decoder.answers[:, :made].tolist()]
