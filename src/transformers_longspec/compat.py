"""Every touch point with transformers internals, in one place.

What we patch or register (idempotently, by `install()`, which `import transformers_longspec` calls):

* `GenerationMixin._assisted_decoding` (private): a `LongSpecDraft` assistant runs the decode loop `install` was
  given (`generation.longspec_tree_decode`); every other assistant runs the original, unchanged.
* `GenerationMixin._extract_generation_mode_kwargs` (private): with a LongSpec assistant, per-call
  `longspec_*` kwargs of `generate` (e.g. `longspec_beam_widths=[4, 8, 8]`) reach the decode loop instead of
  being rejected as unused model kwargs (the same options set on the `GenerationConfig` are read by the decode
  loop when the call does not give them). An `assistant_model` given as a path (str or os.PathLike) raises a
  TypeError naming `LongSpecDraft.from_pretrained(path, target_model=model)` (stock `generate` fails later with an
  AttributeError); real models pass through unchanged.
* `transformers.pipelines.base.load_assistant_model` (module function, wrapped): `pipeline(...,
  assistant_model=PATH)` with PATH a LongSpec draft (a folder saved with `save_pretrained`, or a compact file) loads
  it with `LongSpecDraft.from_pretrained(PATH, target_model=model)`, as the pipeline loads any other assistant by
  name (stock: "cannot infer suitable model classes"); a local path that does not exist raises FileNotFoundError
  naming it (stock: "Repo id must be in the form ..."); every other assistant goes to the original.
* `GenerationConfig.get_generation_mode` (public method, wrapped): beam search, contrastive search or constraints with
  a LongSpec assistant raise instead of silently ignoring the assistant (stock behaviour is a warning).
* `GenerationMixin._prepare_model_inputs` (private, wrapped): a prompt that is a list or a 1-D tensor raises a
  ValueError giving the expected shape, for any decoder-only model (stock `generate` fails on them a few lines later
  with an IndexError or AttributeError).
* `AttentionInterface` / `AttentionMaskInterface` (public registries): the "longspec" attention, and
  "longspec_packed_sdpa" (masked SDPA without kv-head copies, for `trainers.batch_greedy`).
* `AutoConfig` / `AutoModel` (public registries): `model_type="longspec_draft"`.
* `_previous_max_cache_length` (private attribute `generate` leaves on a model after a static-cache call):
  `forget_static_cache_length` clears it so that benchmarks size each static cache to its own prompt.
* `torch._dynamo.config` (private) and instance-level `forward` / `step` attributes, only inside
  `compiled_methods` (the static-shape step's `torch.compile` regions): `allow_unspec_int_on_nn_module` lets one
  compiled graph serve all decoder layers (their `layer_idx` differs) instead of one recompilation per layer.
* A forward hook on the target's LM head for the first forward of a LongSpec `generate` (public torch API, removed
  on exit): NaN/inf prefill logits raise instead of decoding garbage. A forward pre-hook on it
  (`final_hidden_states`) keeps the target's final hidden states for drafts that read them, and forward hooks on the
  decoder layers they name (`layer_outputs`) the outputs of those layers.

Tested against transformers 5.17 (the GPU image) and the newest release `pyproject.toml` admits.
`uninstall()` restores the originals.

Reference: reference/transformers-integration.md §1, §2, §5.
"""

from __future__ import annotations

import functools
import json
import os
import threading
from contextlib import contextmanager
from pathlib import Path

import torch
from packaging import version
from transformers import AttentionInterface, AutoConfig, AutoModel, DynamicCache, GenerationConfig
from transformers import __version__ as transformers_version
from transformers.generation.configuration_utils import GenerationMode
from transformers.generation.logits_process import (
    SynthIDTextWatermarkLogitsProcessor,
    UnbatchedClassifierFreeGuidanceLogitsProcessor,
)
from transformers.generation.utils import GenerationMixin
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.pipelines import base as pipelines_base

from .call_lock import clear_stats_unless_running

ATTENTION_NAME = "longspec"
PACKED_SDPA_NAME = "longspec_packed_sdpa"
# per-call `generate(longspec_<name>=...)` options, passed to `longspec_tree_decode(<name>=...)`
LONGSPEC_OPTIONS = ("beam_widths", "static_shapes", "compile", "retrieval", "draft_vocab", "tree_nodes")
MODEL_TYPE = "longspec_draft"
MIN_TRANSFORMERS = version.parse("5.17.0")
_ORIGINALS: dict[str, object] = {}
_MISSING = object()
_TUNES_HF_ASSISTED = "it tunes transformers' own assisted decoding; LongSpec's tree shape is longspec_beam_widths"
_OTHER_SPECULATION = "it selects another speculative decoding method"
# generate options the tree decoding cannot honour: name -> (value that means "off", why)
UNHONOURED_OPTIONS = {
    "guidance_scale": (1, "classifier-free guidance runs a second, unconditional forward per emitted token, which "
                          "tree verification cannot run per tree node"),
    "num_assistant_tokens": (20, _TUNES_HF_ASSISTED),
    "num_assistant_tokens_schedule": ("constant", _TUNES_HF_ASSISTED),
    "assistant_confidence_threshold": (0.4, _TUNES_HF_ASSISTED),
    "assistant_lookbehind": (10, _TUNES_HF_ASSISTED),
    "target_lookbehind": (10, _TUNES_HF_ASSISTED),
    "assistant_early_exit": (None, _OTHER_SPECULATION),
    "assistant_ensemble_weight": (None, "ensemble verification is not lossless; LongSpec returns the target's tokens"),
    "speculation_type": (None, _OTHER_SPECULATION),
    "use_mtp": (False, _OTHER_SPECULATION),
    "max_matching_ngram_size": (None, "it tunes prompt-lookup decoding"),
    "low_memory": (None, "it belongs to contrastive search, which an assistant replaces"),
    "dola_layers": (None, "DoLa decoding cannot be combined with an assistant"),
    "prefill_chunk_size": (None, "LongSpec prefills the prompt in one forward"),
}
# logits processors with state across calls: per-node calls on the tree's prefixes would corrupt it
_STATEFUL_PROCESSORS = {
    UnbatchedClassifierFreeGuidanceLogitsProcessor: "guidance_scale (classifier-free guidance)",
    SynthIDTextWatermarkLogitsProcessor: "SynthID watermarking (watermarking_config)",
}
# model kwargs `generate` itself prepares; any other one would reach plain decoding's forwards but not LongSpec's
_GENERATE_MODEL_KWARGS = {"attention_mask", "use_cache", "past_key_values", "position_ids", "cache_position",
                          "logits_to_keep", "num_logits_to_keep", "inputs_embeds", "output_attentions",
                          "output_hidden_states"}


_DECODE: list = []  # [the decode loop], set by `install`


def _is_longspec(assistant_model) -> bool:
    """A LongSpecDraft of this package, or the same class loaded as Hub remote code (`trust_remote_code=True`)."""
    from .modeling import LongSpecDraft

    if isinstance(assistant_model, LongSpecDraft):
        return True
    config = getattr(type(assistant_model), "config_class", None)
    return type(assistant_model).__name__ == "LongSpecDraft" and getattr(config, "model_type", None) == MODEL_TYPE


def _refuse_longspec_options(assistant_model, options: list[str]) -> None:
    """Raise ValueError for LongSpec options or a wrapped draft given to a generate call LongSpec does not run."""
    base = getattr(assistant_model, "get_base_model", None)
    if callable(base) and _is_longspec(base()):
        raise ValueError(
            f"assistant_model is a LongSpec draft wrapped by {type(assistant_model).__name__} (LoRA adapters?); pass "
            "the plain draft: draft = transformers_longspec.trainers.merge_lora_draft(model)"
        )
    if options:
        got = type(assistant_model).__name__ if assistant_model is not None else "no assistant_model"
        raise ValueError(
            f"{sorted(options)} apply only with a LongSpecDraft as assistant_model, got {got}; pass "
            "assistant_model=LongSpecDraft.from_pretrained(path, target_model=model), or drop those options"
        )


def _calling_thread_only(hook):
    """`hook` (a module hook) made to run only in the thread that wraps it: a plain forward that another thread runs
    on the same shared target meanwhile is not seen by the LongSpec call's hooks."""
    caller = threading.get_ident()

    @functools.wraps(hook)
    def filtered(*args):
        if threading.get_ident() == caller:
            return hook(*args)
        return None

    return filtered


@contextmanager
def _finite_prefill_logits(target):
    """Within the block, raise ValueError as soon as the target's first LM-head output (the prefill) holds NaN/inf.

    A forward hook on the target's output embedding, removed after its first call (one host sync per `generate`)
    and on exit. Plain decoding would silently emit token 0 after every NaN; LongSpec says so instead.
    """
    @_calling_thread_only
    def check(module, args, output):
        handle.remove()
        if not bool(torch.isfinite(output).all()):
            raise ValueError(
                "the target returned NaN or inf logits for the prompt (NaN/inf in its weights, or an fp16 overflow); "
                "check the checkpoint, or load the target in bfloat16 or float32"
            )

    handle = target.get_output_embeddings().register_forward_hook(check)
    try:
        yield
    finally:
        handle.remove()


@contextmanager
def layer_outputs(target, layers=()):
    """Within the block, `seen[i]` is the output hidden states (batch, seq, hidden) of target decoder layer
    `layers[i]` in the latest forward that ran it (before the final norm; nothing is copied). No layers: no hooks.

    Forward hooks on `target.get_decoder().layers[i]` (public torch API), removed on exit; only the thread that
    entered the block is seen. A layer returning a tuple (older transformers) gives its first element.
    Reference: `torch.nn.Module.register_forward_hook`; transformers `get_decoder`; EAGLE-3 (Li et al., 2025) §3.
    """
    seen: list[torch.Tensor | None] = [None] * len(layers)
    decoder_layers = target.get_decoder().layers if layers else ()
    handles = []

    def keeper(slot: int):
        @_calling_thread_only
        def keep(module, args, output):
            seen[slot] = output[0] if isinstance(output, tuple) else output

        return keep

    try:
        for slot, index in enumerate(layers):
            handles.append(decoder_layers[index].register_forward_hook(keeper(slot)))
        yield seen
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def final_hidden_states(target, enabled: bool = True, layers=()):
    """Within the block, `seen[0]` is what a draft reading the target's state gets from the target's latest LM-head
    call: its final normed hidden states (batch, positions whose logits were computed, hidden), e.g. (1, 1, hidden)
    after a prefill with `logits_to_keep=1`, (1, tree_size, hidden) after a verification; with `layers` (the draft's
    `config.target_feature_layers`) the outputs of those decoder layers at the same (last) positions follow on the
    last axis: (batch, positions, hidden x (1 + len(layers))), and an LM-head call with no target forward since the
    last one kept (the draft shares the head) is not kept. `enabled=False` yields an empty list.

    A forward pre-hook on the target's output embedding (public torch API) and `layer_outputs`' hooks, removed on
    exit; they keep only calls made by the thread that entered the block (a plain `generate` of another thread on the
    same target is not seen). Inside a captured CUDA graph the hook runs once, at capture: `seen[0]` is then that
    graph's own buffer, rewritten by each replay.
    Reference: `torch.nn.Module.register_forward_pre_hook`; transformers `get_output_embeddings`.
    """
    seen: list[torch.Tensor] = []
    if not enabled:
        yield seen
        return
    with layer_outputs(target, layers) as outputs:

        @_calling_thread_only
        def keep(module, args):
            final = args[0]
            if outputs:  # the LM head reads the last positions of the decoder's output (`logits_to_keep`)
                if any(h is None for h in outputs):  # no target forward since the last one kept (the draft's head)
                    return
                final = torch.cat([final, *(h[:, h.shape[1] - final.shape[1] :] for h in outputs)], dim=-1)
                outputs[:] = [None] * len(outputs)
            seen[:] = [final]

        handle = target.get_output_embeddings().register_forward_pre_hook(keep)
        try:
            yield seen
        finally:
            handle.remove()


def _assisted_decoding(self, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus=False,
                       streamer=None, inputs_tensor=None, assistant_model=None, **model_kwargs):
    if not _is_longspec(assistant_model):
        return _ORIGINALS["_assisted_decoding"](
            self, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus=synced_gpus,
            streamer=streamer, inputs_tensor=inputs_tensor, assistant_model=assistant_model, **model_kwargs
        )
    if synced_gpus:
        raise ValueError("LongSpec decoding does not support synced_gpus (FSDP / ZeRO-3 generation); use one device")
    for name in ("tokenizer", "assistant_tokenizer"):
        if model_kwargs.pop(name, None) is not None and name == "assistant_tokenizer":
            raise ValueError("a LongSpec draft shares the target's tokenizer; do not pass assistant_tokenizer")
    options = {name: model_kwargs.pop(f"longspec_{name}") for name in LONGSPEC_OPTIONS
               if f"longspec_{name}" in model_kwargs}
    unknown = sorted(k for k in model_kwargs if k.startswith("longspec_"))
    if unknown:
        raise ValueError(f"unknown LongSpec option(s) {unknown}; the per-call options are {_known_options()}")
    with _finite_prefill_logits(self):
        return _DECODE[0](self, assistant_model, input_ids, logits_processor, stopping_criteria, generation_config,
                          streamer=streamer, **options, **model_kwargs)


def _extract_generation_mode_kwargs(self, custom_generate, kwargs, synced_gpus, assistant_model, streamer):
    if isinstance(assistant_model, (str, os.PathLike)):  # stock generate fails later with an AttributeError
        raise TypeError(
            f"assistant_model is a path ({os.fspath(assistant_model)!r}), not a loaded draft; load it first: "
            "assistant_model=LongSpecDraft.from_pretrained(path, target_model=model)"
        )
    options = [k for k in kwargs if k.startswith("longspec_")]
    if _is_longspec(assistant_model):
        clear_stats_unless_running(assistant_model)  # a call refused from here on leaves no stale statistics
        # before transformers compares vocabularies and suggests assistant_tokenizer, which LongSpec cannot use
        assistant_model.check_target_sizes(self)
        if kwargs.get("past_key_values") is not None:
            raise ValueError(f"LongSpec manages its own target cache; do not pass past_key_values (got "
                             f"{type(kwargs['past_key_values']).__name__}), or drop assistant_model")
        # named on the call: refused unless it is None, or guidance_scale=1 (transformers' "no guidance" value)
        _refuse_unhonoured({k: kwargs[k] for k in UNHONOURED_OPTIONS if kwargs.get(k) is not None
                            and not (k == "guidance_scale" and kwargs[k] == 1)})
        extra = {k: kwargs.pop(k) for k in options}
    else:
        _refuse_longspec_options(assistant_model, options)
        extra = {}
    result = _ORIGINALS["_extract_generation_mode_kwargs"](
        self, custom_generate, kwargs, synced_gpus, assistant_model, streamer
    )
    result.update(extra)
    return result


def _get_generation_mode(self, assistant_model=None):
    if _is_longspec(assistant_model) and self.num_beams is not None and self.num_beams > 1:
        raise ValueError(
            f"num_beams={self.num_beams} cannot be combined with a LongSpec assistant (tree speculation replaces "
            "beam search); use num_beams=1, or drop assistant_model for beam search"
        )
    mode = _ORIGINALS["get_generation_mode"](self, assistant_model)
    if _is_longspec(assistant_model) and mode != GenerationMode.ASSISTED_GENERATION:
        raise ValueError(
            f"these generate options select {mode.value} (constraints / force_words_ids, or penalty_alpha with top_k "
            "for contrastive search), which would ignore the LongSpec assistant; drop them, or drop assistant_model"
        )
    return mode


def _prepare_model_inputs(self, inputs=None, bos_token_id=None, model_kwargs=None):
    result = _ORIGINALS["_prepare_model_inputs"](self, inputs, bos_token_id, model_kwargs)
    prompt, name = result[0], result[1]
    if name == "input_ids" and not self.config.is_encoder_decoder and not (
        isinstance(prompt, torch.Tensor) and prompt.dim() == 2
    ):
        got = f"a {prompt.dim()}-D tensor of shape {tuple(prompt.shape)}" if isinstance(prompt, torch.Tensor) else (
            f"a {type(prompt).__name__}")
        raise ValueError(
            f"input_ids must be a (batch, prompt_len) LongTensor, e.g. (1, prompt_len) for one prompt; got {got}. "
            "Pass tokenizer(text, return_tensors='pt').input_ids, ids[None] for a 1-D tensor, or torch.tensor([ids]) "
            "for a list"
        )
    return result


def _is_draft_path(path) -> bool:
    """True for a local LongSpec draft: a folder whose config.json has our model_type, or a safetensors file (a
    compact draft; `from_pretrained` says what is wrong with one that is not)."""
    from .configuration import LongSpecConfig

    path = Path(os.fspath(path))
    if path.is_file():
        return path.suffix == ".safetensors"
    try:
        return json.loads((path / "config.json").read_text()).get("model_type") == LongSpecConfig.model_type
    except (OSError, ValueError):
        return False


def _load_assistant_model(model, assistant_model, assistant_tokenizer):
    if isinstance(assistant_model, (str, os.PathLike)):
        path = os.fspath(assistant_model)
        local = os.path.isabs(path) or path.startswith((".", "~")) or path.count("/") > 1  # not a Hub id
        if local and not os.path.exists(path):
            raise FileNotFoundError(f"pipeline(assistant_model={path!r}): no such folder or file; pass the folder a "
                                    "LongSpec draft was saved to (save_pretrained) or a compact draft file")
        if model.can_generate() and _is_draft_path(path):
            from .modeling import LongSpecDraft

            return LongSpecDraft.from_pretrained(path, target_model=model), None
    return _ORIGINALS["load_assistant_model"](model, assistant_model, assistant_tokenizer)


def install(decode) -> None:
    """Register LongSpec with transformers (idempotent). Called on `import transformers_longspec`.

    Args:
        decode: the decode loop a LongSpec assistant runs, `generation.longspec_tree_decode` (passed in, so this
            module, which the loop imports, does not import the loop).
    Raises: ImportError if the installed transformers is older than 5.17.
    """
    if version.parse(transformers_version) < MIN_TRANSFORMERS:
        raise ImportError(
            f"transformers-longspec needs transformers>={MIN_TRANSFORMERS}, found {transformers_version}"
        )
    from .attention import longspec_attention_forward, packed_gqa_sdpa_forward
    from .configuration import LongSpecConfig
    from .modeling import LongSpecDraft

    AttentionInterface.register(ATTENTION_NAME, longspec_attention_forward)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
    AttentionInterface.register(PACKED_SDPA_NAME, packed_gqa_sdpa_forward)
    AttentionMaskInterface.register(PACKED_SDPA_NAME, sdpa_mask)
    AutoConfig.register(LongSpecConfig.model_type, LongSpecConfig, exist_ok=True)
    AutoModel.register(LongSpecConfig, LongSpecDraft, exist_ok=True)
    _DECODE[:] = [decode]
    if _ORIGINALS:
        return
    _ORIGINALS["_assisted_decoding"] = GenerationMixin._assisted_decoding
    _ORIGINALS["_extract_generation_mode_kwargs"] = GenerationMixin._extract_generation_mode_kwargs
    _ORIGINALS["get_generation_mode"] = GenerationConfig.get_generation_mode
    _ORIGINALS["_prepare_model_inputs"] = GenerationMixin._prepare_model_inputs
    _ORIGINALS["load_assistant_model"] = pipelines_base.load_assistant_model
    GenerationMixin._assisted_decoding = functools.wraps(GenerationMixin._assisted_decoding)(_assisted_decoding)
    GenerationMixin._extract_generation_mode_kwargs = _extract_generation_mode_kwargs
    GenerationConfig.get_generation_mode = _get_generation_mode
    GenerationMixin._prepare_model_inputs = _prepare_model_inputs
    pipelines_base.load_assistant_model = functools.wraps(pipelines_base.load_assistant_model)(_load_assistant_model)


def uninstall() -> None:
    """Restore the patched transformers methods (registries keep the "longspec" entries, which are inert)."""
    if not _ORIGINALS:
        return
    GenerationMixin._assisted_decoding = _ORIGINALS.pop("_assisted_decoding")
    GenerationMixin._extract_generation_mode_kwargs = _ORIGINALS.pop("_extract_generation_mode_kwargs")
    GenerationConfig.get_generation_mode = _ORIGINALS.pop("get_generation_mode")
    GenerationMixin._prepare_model_inputs = _ORIGINALS.pop("_prepare_model_inputs")
    pipelines_base.load_assistant_model = _ORIGINALS.pop("load_assistant_model")


@contextmanager
def attention_implementation(model, name: str):
    """Within the block, `model`'s attention layers dispatch to `name` ("eager", "sdpa", "longspec", ...); the
    previous implementation is restored afterwards, also on error.

    Raises: ValueError from transformers if `name` is not a registered attention implementation.
    Reference: transformers `PreTrainedModel.set_attn_implementation`.
    """
    original = model.config._attn_implementation
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(original)


def packed_sdpa_attention(target):
    """Within the block, `target`'s attention layers dispatch to "longspec_packed_sdpa" (restored afterwards).

    Reference: transformers `PreTrainedModel.set_attn_implementation`.
    """
    return attention_implementation(target, PACKED_SDPA_NAME)


def tree_attention(target):
    """Within the block, `target`'s attention layers dispatch to "longspec" (restored afterwards, also on error).

    Reference: transformers `PreTrainedModel.set_attn_implementation`.
    """
    return attention_implementation(target, ATTENTION_NAME)


_RECOMPILE_LIMIT = 64


@contextmanager
def compiled_methods(replacements):
    """Within the block, `obj.<name>` is `compiled` bound to `obj`, for each (obj, name, compiled) of `replacements`
    (`compiled` = `torch.compile` of the class's function); the instances are restored afterwards, also on error.

    Used around the capture of the static-shape step only, so the user's models stay uncompiled everywhere else.
    Within the block dynamo keeps up to `_RECOMPILE_LIMIT` compiled versions of a function (its default, 8, is
    reached by the draft phase: one version per tree shape, retrieval length and vocabulary setting in a process).
    Reference: `torch.compile`, `torch._dynamo.config.allow_unspec_int_on_nn_module` / `recompile_limit`.
    """
    import torch._dynamo

    config = torch._dynamo.config
    limit = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"  # renamed in torch 2.7
    replaced = []
    with config.patch(allow_unspec_int_on_nn_module=True, **{limit: max(getattr(config, limit), _RECOMPILE_LIMIT)}):
        try:
            for obj, name, compiled in replacements:
                replaced.append((obj, name, vars(obj).get(name, _MISSING)))
                setattr(obj, name, compiled.__get__(obj))
            yield
        finally:
            for obj, name, previous in replaced:
                if previous is _MISSING:
                    delattr(obj, name)  # the class's own method shows through again
                else:
                    setattr(obj, name, previous)


def forget_static_cache_length(model) -> None:
    """Let the next `generate(cache_implementation="static")` size its cache to its own `max_length`.

    transformers (5.17–5.23) sizes every new static cache to the longest of all earlier static-cache calls on the
    model (private attribute `_previous_max_cache_length`), so a short prompt measured after a long one would attend
    over a padded cache. Benchmarks call this before each static-cache call.

    Reference: transformers `GenerationMixin._prepare_static_cache`.
    """
    model.__dict__.pop("_previous_max_cache_length", None)


def check_generate_call(target, draft, input_ids, generation_config, model_kwargs, logits_processor=None) -> None:
    """Raise ValueError, before any work, for a `generate` call LongSpec cannot honour exactly.

    Checks: input_ids, not inputs_embeds; batch size 1; a non-empty integer prompt without padding whose ids fit the
    target's embedding, at positions 0... (one host sync); no model kwargs that only plain decoding would pass on;
    use_cache; no user cache; no attention/hidden-state outputs; no unknown `longspec_*` option on the generation
    config; no prompt-lookup decoding nor any option of `UNHONOURED_OPTIONS`; no logits processor that keeps state
    across calls (classifier-free guidance, SynthID); the draft attached to THIS target with the same device and dtype
    as the target and the prompt. A prompt + max_new_tokens beyond the target's context is decoded, as plain decoding
    does (with transformers' warning once the output passes it).
    Raises: ValueError naming the problem and the fix.
    Reference: transformers `GenerationMixin._assisted_decoding` (same limits) and LongSpec §3.
    """
    if model_kwargs.get("inputs_embeds") is not None:
        raise ValueError("inputs_embeds is not supported by LongSpec decoding (the draft embeds token ids with the "
                         "target's embedding); pass input_ids instead")
    extra = sorted(k for k, v in model_kwargs.items() if k not in _GENERATE_MODEL_KWARGS and v is not None)
    if extra:
        raise ValueError(f"LongSpec decoding does not pass {extra} to the target's forwards (plain decoding would); "
                         "drop them, or drop assistant_model")
    _check_prompt(target, input_ids, model_kwargs)
    if not model_kwargs.get("use_cache", True):
        raise ValueError("LongSpec decoding needs the KV cache; remove use_cache=False")
    cache = model_kwargs.get("past_key_values")
    if cache is not None and (type(cache) is not DynamicCache or cache.get_seq_length() > 0):
        raise ValueError(
            f"LongSpec manages its own target cache; do not pass past_key_values (got {type(cache).__name__}) "
            "or cache_implementation"
        )
    if generation_config.output_attentions or generation_config.output_hidden_states:
        raise ValueError("output_attentions / output_hidden_states are not available with LongSpec decoding")
    unknown = sorted(k for k in vars(generation_config) if k.startswith("longspec_")
                     and k.removeprefix("longspec_") not in LONGSPEC_OPTIONS)
    if unknown:
        raise ValueError(f"unknown LongSpec option(s) {unknown} in generation_config; the options are "
                         f"{_known_options()}")
    if generation_config.prompt_lookup_num_tokens is not None:
        raise ValueError(
            "prompt_lookup_num_tokens selects prompt-lookup decoding, which a LongSpec assistant replaces; drop one"
        )
    _refuse_unhonoured({name: getattr(generation_config, name, None) for name, (off, _) in UNHONOURED_OPTIONS.items()
                        if getattr(generation_config, name, None) not in (None, off)})
    for processor in logits_processor or []:
        if type(processor) in _STATEFUL_PROCESSORS:
            raise ValueError(f"{_STATEFUL_PROCESSORS[type(processor)]} keeps state from one emitted token to the "
                             "next, which LongSpec's per-tree-node logits processing would corrupt; drop it, or drop "
                             "assistant_model")
    draft.check_target_sizes(target)
    shared = draft._shared
    if shared is None or shared.embed_tokens is not target.get_input_embeddings():
        raise ValueError(
            "the LongSpec draft is not attached to this target; load it with "
            "LongSpecDraft.from_pretrained(path, target_model=target) or call draft.attach_target(target)"
        )
    t, d = next(target.parameters()), next(draft.parameters())
    if (t.device, t.dtype) != (d.device, d.dtype):
        raise ValueError(
            f"draft is on {d.device}/{d.dtype} but the target is on {t.device}/{t.dtype}; "
            f"call draft.to(device={str(t.device)!r}, dtype={t.dtype})"
        )
    if input_ids.device != t.device:
        raise ValueError(f"input_ids are on {input_ids.device} but the target is on {t.device}; pass "
                         f"input_ids.to({str(t.device)!r})")


def _refuse_unhonoured(values: dict) -> None:
    """Raise ValueError naming the first of `values` ({option: value}, options of `UNHONOURED_OPTIONS`), if any."""
    for name, value in sorted(values.items()):
        raise ValueError(f"{name}={value!r} cannot be honoured by LongSpec decoding ({UNHONOURED_OPTIONS[name][1]}); "
                         f"drop {name}, or drop assistant_model")


def _known_options() -> str:
    return ", ".join(f"longspec_{name}" for name in LONGSPEC_OPTIONS)


def _check_prompt(target, input_ids, model_kwargs) -> None:
    """Batch size 1, at least one token, integer ids inside the target's vocabulary, no padding."""
    if input_ids.shape[0] != 1:
        raise ValueError(
            f"LongSpec decoding supports batch size 1, got {input_ids.shape[0]} prompts; call generate per prompt"
        )
    if input_ids.shape[1] == 0:
        raise ValueError(
            "the prompt is empty; LongSpec needs input_ids with at least one token (inputs_embeds is not supported)"
        )
    if input_ids.is_floating_point() or input_ids.dtype in (torch.bool, torch.complex64, torch.complex128):
        raise ValueError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}; pass ids.long()")
    rows = target.get_input_embeddings().num_embeddings
    low, high = torch.stack([input_ids.min(), input_ids.max()]).tolist()  # one host sync, before any work
    if low < 0 or high >= rows:
        raise ValueError(
            f"the prompt holds token id {high if high >= rows else low}, outside the target's vocabulary of {rows} "
            "ids; encode the prompt with the target's own tokenizer"
        )
    mask = model_kwargs.get("attention_mask")
    if mask is not None and not bool(mask.all()):
        raise ValueError(
            "the prompt contains padding (attention_mask has zeros; without a mask, transformers infers zeros where "
            "the prompt holds the pad token id); pass the unpadded prompt, or attention_mask=torch.ones_like(ids) "
            "if those tokens are content"
        )
    positions = model_kwargs.get("position_ids")
    if positions is not None and not torch.equal(positions.view(-1).cpu(), torch.arange(input_ids.shape[1])):
        raise ValueError("LongSpec places the prompt at positions 0 ... prompt_len - 1; drop position_ids, or drop "
                         "assistant_model")


__all__ = [
    "install",
    "uninstall",
    "attention_implementation",
    "tree_attention",
    "forget_static_cache_length",
    "check_generate_call",
    "ATTENTION_NAME",
]
