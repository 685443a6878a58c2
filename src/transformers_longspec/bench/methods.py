"""The decoding methods a benchmark compares: how each calls `target.generate` (or runs its own loop).

`METHODS` maps a name to a `Method`; `parse_variant` derives more from the command line (`--variant`). Baselines
(vanilla `generate` with sdpa / eager attention, a compiled static cache, the CUDA-graph plain loop `plain_graph`,
assisted generation, prompt lookup, sampling) are what LongSpec's speed-ups are reported over.

Reference: transformers `GenerationMixin.generate` (assisted generation, prompt lookup,
`cache_implementation="static"`); `transformers_longspec.bench.plain_graph`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from .plain_graph import PlainGraphLoop

__all__ = ["BenchModels", "METHODS", "Method", "parse_variant"]


@dataclass
class BenchModels:
    """The models a benchmark runs with.

    Attributes:
        target: the target `*ForCausalLM` (eval mode), loaded once for every method.
        draft: an attached `LongSpecDraft` or None (methods that need it are skipped with a note).
        assistant: a small `*ForCausalLM` with the target's vocabulary for HF assisted generation, or None.
    """

    target: torch.nn.Module
    draft: torch.nn.Module | None = None
    assistant: torch.nn.Module | None = None


@dataclass(frozen=True)
class Method:
    """How one method decodes: a `target.generate` call, or a loop of its own (`loop`).

    Attributes:
        generate_kwargs: (models, temperature or None) → extra `generate` kwargs (do_sample, assistant_model, ...).
        requires: "draft" or "assistant" when the method needs that model, else None.
        attn_implementation: switch the target's attention for this method ("eager", ...), restored afterwards.
        static_cache: a compiled static-cache method: target forwards not counted, static cache sized to each
            prompt.
        warm_up: one untimed generate of the full length per prompt before the timed calls (its wall seconds are
            reported as compile_s): compiled code, CUDA graphs and buffers for that prompt's lengths are ready, as
            in a server that has seen such a request (the static-cache baseline compiles then; LongSpec's
            static-shape step captures a graph pair per 512-token bucket of the committed length).
        sampling: runs once per `BenchConfig.temperatures` entry, seeded; outputs are not compared with `sdpa`.
        baseline: other methods report their speed-up over this one (at the same temperature).
        loop: builds, per method × prompt, a decoder used instead of `target.generate`: `loop(target, **kwargs)`
            with the method's kwargs, then called as `decoder(ids, max_new_tokens, attention_mask)` → (1, L + n)
            ids; its `forwards` attribute counts the target forwards of the last call. None = `generate`.
    """

    generate_kwargs: Callable[[BenchModels, float | None], dict]
    requires: str | None = None
    attn_implementation: str | None = None
    static_cache: bool = False
    warm_up: bool = False
    sampling: bool = False
    baseline: bool = False
    loop: Callable[..., Callable] | None = None


def _sampling(temperature: float | None) -> dict:
    # pure temperature sampling: top-k / top-p off, whatever the model's generation_config says
    return {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}


METHODS: dict[str, Method] = {
    "sdpa": Method(lambda m, t: {"do_sample": False}, baseline=True),
    "eager": Method(lambda m, t: {"do_sample": False}, attn_implementation="eager", baseline=True),
    "static_compile": Method(lambda m, t: {"do_sample": False, "cache_implementation": "static"},
                             static_cache=True, warm_up=True, baseline=True),
    "plain_graph": Method(lambda m, t: {"compile": True}, warm_up=True, baseline=True, loop=PlainGraphLoop),
    "assisted": Method(lambda m, t: {"do_sample": False, "assistant_model": m.assistant}, requires="assistant",
                       baseline=True),
    "prompt_lookup": Method(lambda m, t: {"do_sample": False, "prompt_lookup_num_tokens": 10}, baseline=True),
    "longspec": Method(lambda m, t: {"do_sample": False, "assistant_model": m.draft}, requires="draft", warm_up=True),
    "sample": Method(lambda m, t: _sampling(t), sampling=True, baseline=True),
    "longspec_sample": Method(lambda m, t: {**_sampling(t), "assistant_model": m.draft}, requires="draft",
                              warm_up=True, sampling=True),
}


def parse_variant(spec: str, known: dict[str, Method] | None = None) -> tuple[str, Method]:
    """A method variant from `NAME=BASE:JSON`, e.g. `longspec_small=longspec:{"longspec_beam_widths": [4, 8, 8]}`.

    The JSON object's keys are extra `generate` kwargs, except "attn_implementation", which switches the target's
    attention for the variant (e.g. `longspec_eager=longspec:{"attn_implementation": "eager"}`). A variant is not a
    baseline.

    Args:
        spec: the text above. known: methods BASE may name (default `METHODS`).
    Returns: (NAME, Method).
    Raises: ValueError for a malformed spec, an unknown BASE or JSON that is not an object.
    """
    known = METHODS if known is None else known
    name, _, rest = spec.partition("=")
    base, _, text = rest.partition(":")
    if not name or not base or not text:
        raise ValueError(f"--variant takes NAME=BASE:JSON, e.g. 'lsw=longspec:{{\"longspec_beam_widths\": [4, 8]}}'; "
                         f"got {spec!r}")
    if base not in known:
        raise ValueError(f"--variant {name}: unknown base method {base!r}; known: {', '.join(known)}")
    try:
        extra = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"--variant {name}: {text!r} is not JSON ({err.msg})") from None
    if not isinstance(extra, dict):
        raise ValueError(f"--variant {name}: the JSON must be an object of generate kwargs, got {text!r}")
    parent = known[base]
    attn = extra.pop("attn_implementation", parent.attn_implementation)
    return name, replace(parent, generate_kwargs=lambda m, t: {**parent.generate_kwargs(m, t), **extra},
                         attn_implementation=attn, baseline=False)
