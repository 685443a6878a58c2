"""The strongest plain baseline: a static-cache greedy loop whose one-token step is replayed from a CUDA graph.

What a user who knows gpt-fast would write around a transformers model, batch 1: a `StaticCache` sized once to
prompt + new tokens (rounded up to `CAPACITY_STEP`), the prefill run eagerly, then a decode step that does all of
its bookkeeping on the device (attention mask from the position, forward, argmax, token and position written
in place) so that it is captured once as a CUDA graph — first compiled with `torch.compile` (`compile=True`,
the default) — and replayed once per token. The host reads the device only every `EOS_CHECK_EVERY` tokens, to stop
at an end-of-sequence token (up to that many - 1 steps past it are computed and thrown away). On a CPU the same
step runs eagerly, uncaptured and uncompiled; its output is what `target.generate(do_sample=False)` returns.

    loop = PlainGraphLoop(target)                  # one per prompt length: it keeps its cache and graph
    out = loop(ids, max_new_tokens=256)            # (1, prompt + new) int64, like generate

Reference: gpt-fast `generate.py` (static cache, compiled one-token step, warm-up); PyTorch "CUDA Graphs"
(`torch.cuda.graph`, side-stream warm-up before capture); transformers `StaticCache`.
"""

from __future__ import annotations

import torch

__all__ = ["CAPACITY_STEP", "EOS_CHECK_EVERY", "PlainGraphLoop", "check_plain_greedy"]

CAPACITY_STEP = 512  # cache rows are prompt + new tokens rounded up to this: a compiled shape per 512-token stretch
EOS_CHECK_EVERY = 8  # tokens between device -> host reads of the new tokens
WARM_UP_STEPS = 3  # eager runs of the step on a side stream before capture (compilation, cuBLAS workspaces)
# generation_config fields whose values, other than these neutral ones, change greedy output; the loop applies none
_NEUTRAL = {"repetition_penalty": (None, 1.0), "encoder_repetition_penalty": (None, 1.0),
            "no_repeat_ngram_size": (None, 0), "min_length": (None, 0), "min_new_tokens": (None, 0),
            "bad_words_ids": (None, []), "suppress_tokens": (None, []), "begin_suppress_tokens": (None, []),
            "forced_bos_token_id": (None,), "forced_eos_token_id": (None,), "sequence_bias": (None, {}),
            "exponential_decay_length_penalty": (None,)}


def check_plain_greedy(target) -> list[int]:
    """The target's end-of-sequence ids; ValueError if its generation_config asks greedy decoding for more.

    Args:
        target: a `*ForCausalLM`.
    Returns: list of EOS token ids (empty: decode until max_new_tokens).
    Raises: ValueError naming the generation_config fields (repetition_penalty, ...) the plain loop does not apply.
    """
    config = target.generation_config
    changed = [name for name, neutral in _NEUTRAL.items() if getattr(config, name, None) not in neutral]
    if changed:
        raise ValueError(f"plain_graph applies no logits processing, but the target's generation_config sets "
                         f"{changed}; reset them (target.generation_config.<field> = None) to compare plain greedy")
    eos = config.eos_token_id
    return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)


def _recompile_limit(limit: int):
    """`torch._dynamo.config.patch` raising the recompilation limit (one compiled step per cache capacity)."""
    import torch._dynamo.config as dynamo_config

    name = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"
    return dynamo_config.patch(**{name: max(limit, getattr(dynamo_config, name))})


class PlainGraphLoop:
    """Greedy decoding of one target, batch 1, with a static cache and a replayed one-token step.

    Attributes:
        target: the `*ForCausalLM` (eval mode; weights not copied).
        compile: compile the step with `torch.compile` before capture (CUDA only).
        forwards: target forwards of the last call (prefill + steps, including steps past an EOS).
    """

    def __init__(self, target, compile: bool = True):
        self.target, self.compile = target, compile
        self.eos = check_plain_greedy(target)
        self.capacity, self.forwards, self.device = 0, 0, None
        self._graph = self.cache = None
        self.new = torch.zeros(0, dtype=torch.long)

    def _allocate(self, rows: int, new_tokens: int, device: torch.device) -> None:
        """Cache of `rows` positions, the step's static tensors, and (CUDA) the captured step."""
        from transformers import StaticCache

        self._graph = self.cache = None  # free the previous cache and graph pool first
        self.capacity, self.device = rows, device
        self.cache = StaticCache(config=self.target.config, max_cache_len=rows)
        self.token = torch.zeros(1, 1, dtype=torch.long, device=device)  # last token, input of the next step
        self.position = torch.zeros(1, dtype=torch.long, device=device)  # its position in the sequence
        self.count = torch.zeros(1, dtype=torch.long, device=device)  # new tokens so far
        self.new = torch.zeros(max(new_tokens, WARM_UP_STEPS + 1), dtype=torch.long, device=device)
        self.key_index = torch.arange(rows, device=device)
        self._step_fn = self._step
        if device.type == "cuda":
            self._capture()

    def _step(self) -> None:
        """One decode step on the device: (1, 1) token at `position` → next greedy token, all state in place."""
        dtype = self.target.dtype
        visible = self.key_index <= self.position  # (rows,) bool: keys at or before the query position
        mask = torch.where(visible, 0.0, torch.finfo(dtype).min).to(dtype)  # (rows,) additive attention mask
        logits = self.target(input_ids=self.token, position_ids=self.position.view(1, 1),
                             attention_mask=mask.view(1, 1, 1, -1), past_key_values=self.cache, use_cache=True).logits
        nxt = logits[:, -1].argmax(-1)  # (1,) int64
        self.new.index_copy_(0, self.count, nxt)
        self.token.copy_(nxt.view(1, 1))
        self.position.add_(1)
        self.count.add_(1)

    def _capture(self) -> None:
        """Compile (optionally) and warm the step up on a side stream, then capture it as one CUDA graph.

        The warm-up runs touch the cache and the step's tensors; every call resets them before its prefill.
        """
        self._prefill(torch.zeros(1, 1, dtype=torch.long, device=self.device))
        step = torch.compile(self._step, dynamic=False) if self.compile else self._step
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with _recompile_limit(64), torch.cuda.stream(stream):
            for _ in range(WARM_UP_STEPS):
                step()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        self._graph = torch.cuda.CUDAGraph()
        with _recompile_limit(64), torch.cuda.graph(self._graph):
            step()
        self._step_fn = self._graph.replay

    def _prefill(self, ids: torch.Tensor) -> None:
        """Reset the cache and run the prompt (1, L) eagerly; the first new token lands in `new[0]`."""
        self.cache.reset()
        length = ids.shape[1]
        positions = torch.arange(length, device=ids.device).view(1, -1)
        logits = self.target(input_ids=ids, position_ids=positions, past_key_values=self.cache, use_cache=True,
                             logits_to_keep=1).logits
        first = logits[:, -1].argmax(-1)
        self.new[0] = first[0]
        self.token.copy_(first.view(1, 1))
        self.position.fill_(length)
        self.count.fill_(1)

    def _stop(self, tokens: torch.Tensor) -> int | None:
        """Index of the first EOS among `tokens` (1-D, host), or None."""
        for i, token in enumerate(tokens.tolist()):
            if token in self.eos:
                return i
        return None

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor, max_new_tokens: int, attention_mask=None) -> torch.Tensor:
        """Greedy continuation of `input_ids`, as `target.generate(do_sample=False)` would return it.

        Args:
            input_ids: (1, L) int64 on the target's device. max_new_tokens: ≥ 1.
            attention_mask: ignored when all ones (batch 1, no padding); anything else raises.
        Returns: (1, L + n) int64, n ≤ max_new_tokens (stops after the first EOS, which is kept).
        Raises: ValueError for a batch above 1, padding or max_new_tokens < 1.
        """
        if input_ids.shape[0] != 1 or (attention_mask is not None and not bool(attention_mask.all())):
            raise ValueError("plain_graph decodes one unpadded sequence: pass input_ids of shape (1, L), no padding")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        length = input_ids.shape[1]
        needed = length + max(max_new_tokens, WARM_UP_STEPS + 1)
        if needed > self.capacity or self.new.numel() < max_new_tokens or input_ids.device != self.device:
            self._allocate(-(-needed // CAPACITY_STEP) * CAPACITY_STEP, max_new_tokens, input_ids.device)
        self._prefill(input_ids)
        done, end = 1, self._stop(self.new[:1].cpu())
        while end is None and done < max_new_tokens:
            chunk = min(EOS_CHECK_EVERY, max_new_tokens - done)
            for _ in range(chunk):
                self._step_fn()
            end = self._stop(self.new[done:done + chunk].cpu())
            end, done = (None if end is None else done + end), done + chunk
        self.forwards = done
        kept = done if end is None else end + 1
        return torch.cat([input_ids, self.new[:kept].view(1, -1)], dim=1)
