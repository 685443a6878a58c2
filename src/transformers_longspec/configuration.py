"""Configuration of the LongSpec draft model (`LongSpecConfig`).

Reference: LongSpec (arXiv 2502.17421) §3.1 — one decoder block whose cross-attention reads the target's
last-layer KV cache; the draft shares the target's token embedding and LM head, so every size that touches
them (hidden size, vocabulary) and every size of the cross-attention (query heads, KV heads, head_dim) is the
target's.
"""

from __future__ import annotations

import os
import re

from huggingface_hub.dataclasses import strict
from transformers import GenerationConfig, PreTrainedConfig

# Target families whose decoder we know how to read (gated SiLU MLP, RoPE on q/k, KV cache in
# (batch, n_kv_heads, kv_len, head_dim)); adding one is a row here plus a test (CONTRIBUTING.md).
SUPPORTED_TARGET_TYPES = ("llama", "qwen2", "mistral")

DEFAULT_BEAM_WIDTHS = (4, 16, 16, 16, 16)
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def hub_repo_id(name) -> str | None:
    """`name` if it reads as a Hub repository id ("owner/model") and is not a local path, else None.

    Args:
        name: a model's `name_or_path` (a Hub id, a local folder, or None).
    Returns: the id, or None (local paths are never written into a draft's config or model card).
    Reference: huggingface_hub repository ids.
    """
    if not name or not _REPO_ID.match(str(name)) or os.path.exists(str(name)):
        return None
    return str(name)


def validate_beam_widths(beam_widths, vocab_size: int | None = None) -> tuple[int, ...]:
    """Check a tree shape (beam width per depth) and return it as a tuple.

    Args:
        beam_widths: sequence of ints, one per depth, e.g. `[4, 16, 16, 16, 16]`. Depth d keeps the
            `beam_widths[d-1]` (parent, token) pairs of highest cumulative draft log-probability.
            An empty sequence means "no draft": every step verifies the root alone (plain decoding).
        vocab_size: if given, depth 1 cannot be wider than the vocabulary.
    Returns: tuple of ints.
    Raises: ValueError naming the bad entry if `beam_widths` is not a sequence (a string included), if a width is
        not a positive int, if the tree is deeper than 32, or if depth d+1 is wider than (width at depth d) x
        vocab_size.
    Reference: LongSpec §3.3 (dynamic beam-search tree).
    """
    if isinstance(beam_widths, (str, bytes)):
        raise ValueError(f"beam_widths must be a list of positive ints such as [4, 16, 16], not {beam_widths!r}")
    try:
        widths = tuple(beam_widths)
    except TypeError:
        raise ValueError(f"beam_widths must be a list of positive ints such as [4, 16, 16], got {beam_widths!r}")
    for depth, w in enumerate(widths, start=1):
        if isinstance(w, bool) or not isinstance(w, int) or w < 1:
            raise ValueError(
                f"beam_widths[{depth - 1}] = {w!r}: every depth needs a positive int width (e.g. [4, 16, 16, 16, 16])"
            )
    if len(widths) > 32:
        raise ValueError(f"beam_widths has {len(widths)} depths; at most 32 are supported (5 is the default)")
    if vocab_size is not None:
        parents = 1
        for depth, w in enumerate(widths, start=1):
            if w > parents * vocab_size:
                raise ValueError(
                    f"beam_widths[{depth - 1}] = {w} exceeds the {parents * vocab_size} candidates available at depth "
                    f"{depth} (parents x vocab_size); use a width <= {parents * vocab_size}"
                )
            parents = w
    return widths


@strict
class LongSpecConfig(PreTrainedConfig):
    r"""Configuration of a [`LongSpecDraft`].

    Sizes that touch the shared embedding / LM head or the target KV cache must equal the target's; build the
    config with [`LongSpecConfig.from_target_config`] (or `LongSpecDraft.from_target`) rather than by hand.

    Args:
        vocab_size (`int`): the target's vocabulary size (tokens).
        hidden_size (`int`): the target's hidden size.
        intermediate_size (`int`): width of the draft's gated MLP.
        num_attention_heads (`int`): query heads of both attentions (= the target's).
        num_key_value_heads (`int`): KV heads (= the target's; the cross-attention reads its cache directly).
        head_dim (`int`): per-head dimension (= the target's).
        hidden_act (`str`): MLP activation (the target's, "silu").
        rms_norm_eps (`float`): RMSNorm epsilon.
        attention_bias (`bool`): bias on q/k/v projections (True for Qwen2 targets).
        mlp_bias (`bool`): bias in the MLP.
        max_position_embeddings (`int`): the target's context length (tokens); anchor-offset training samples
            positions up to this.
        sliding_window (`int`): tokens visible to the draft's self-attention, the query itself included.
            Its KV cache is a ring buffer of this many entries whatever the context length (LongSpec §3.1).
        beam_widths (`list[int]`): default tree shape, beam width per depth (LongSpec §3.3).
        target_hidden_input (`bool`): also feed the draft the target's final (normed) hidden state at the last
            committed token, the state that chose the tree's root: RMSNorm + a hidden x hidden projection added to
            the residual stream after the self-attention (zero-initialised: a new draft starts as one without it).
            Constant memory: one vector per step. The feature-level input of EAGLE (Li et al., 2024); False = the
            LongSpec draft as published.
        target_feature_layers (`list[int]`, optional): with `target_hidden_input`, also feed the outputs of these
            target decoder layers at the same token (0-based; negative counts from the last layer), e.g. a low, a
            middle and a high layer `[2, L // 2, L - 3]` as EAGLE-3 fuses them (Li et al., 2025): one RMSNorm per
            layer, concatenated, one (k x hidden) x hidden projection added with the final state's (zero-initialised,
            so a draft without them continues unchanged, `LongSpecDraft.add_target_features`). Constant memory:
            k + 1 vectors per step. None (default) = the final state only.
        draft_vocab_size (`int`): tokens of the draft's own vocabulary, the most frequent in its training data (the
            `draft_vocab` buffer saved with the weights); each call adds the prompt's own tokens to them
            (`vocabulary.py`). The draft proposes only these, so its LM head reads a fraction of the target's rows
            at every tree level; the target still verifies every token, so the output is unchanged. 0 (default) =
            the whole vocabulary.
        initializer_range (`float`): std of the normal init for weights not copied from the target.
        target_model_type (`str`): model_type of the target this draft was built for.
        target_num_hidden_layers (`int`): the target's layer count (a consistency check at attach time).
        target_name_or_path (`str`): the target's Hub id (e.g. "HuggingFaceTB/SmolLM2-135M-Instruct"), when known;
            the model card's `base_model`. Local paths are not recorded.
        bos_token_id, eos_token_id, pad_token_id: copied from the target so that `pipeline` and `generate`
            accept the draft as an assistant without a second tokenizer.

    Raises: ValueError when built if heads do not divide, the window is not positive, or the tree shape
        is invalid.
    Reference: LongSpec §3.1; transformers `PreTrainedConfig`.
    """

    model_type = "longspec_draft"

    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    hidden_act: str = "silu"
    rms_norm_eps: float = 1e-6
    attention_bias: bool = False
    mlp_bias: bool = False
    max_position_embeddings: int = 4096
    sliding_window: int = 512
    beam_widths: list[int] | None = None
    target_hidden_input: bool = False
    target_feature_layers: list[int] | None = None
    draft_vocab_size: int = 0
    initializer_range: float = 0.02
    target_model_type: str | None = None
    target_num_hidden_layers: int | None = None
    target_name_or_path: str | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    tie_word_embeddings: bool = False

    def __post_init__(self, **kwargs):
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.beam_widths is None:
            self.beam_widths = list(DEFAULT_BEAM_WIDTHS)
        self.beam_widths = list(validate_beam_widths(self.beam_widths, self.vocab_size))
        # checked here rather than in a @strict validator, which would wrap the ValueError in its own exception type
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of num_key_value_heads "
                f"({self.num_key_value_heads}); copy both from the target with LongSpecConfig.from_target_config"
            )
        size = self.draft_vocab_size
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size < self.vocab_size:
            raise ValueError(f"draft_vocab_size must be an int in [0, vocab_size={self.vocab_size}) (0 = the whole "
                             f"vocabulary), got {size!r}")
        self.target_feature_layers = self._checked_feature_layers(self.target_feature_layers)
        window = self.sliding_window
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(
                f"sliding_window must be a positive number of tokens (default 512), got {self.sliding_window!r}"
            )
        super().__post_init__(**kwargs)

    def _checked_feature_layers(self, layers) -> list[int] | None:
        """`target_feature_layers` as distinct non-negative layer indices (negative ones count from the target's last
        layer), or None; ValueError naming the fix otherwise."""
        if layers is None or (isinstance(layers, (list, tuple)) and not layers):
            return None
        if not isinstance(layers, (list, tuple)) or any(isinstance(i, bool) or not isinstance(i, int) for i in layers):
            raise ValueError(f"target_feature_layers must be a list of target layer indices (ints), e.g. [2, 14, 25], "
                             f"got {layers!r}")
        if not self.target_hidden_input:
            raise ValueError("target_feature_layers needs target_hidden_input=True (the layers' outputs join the "
                             "target's final hidden state); set both")
        count = self.target_num_hidden_layers
        if count is None and any(i < 0 for i in layers):
            raise ValueError(f"negative target_feature_layers {list(layers)} need target_num_hidden_layers; build the "
                             "config with LongSpecConfig.from_target_config or give non-negative indices")
        resolved = [i + count if i < 0 else i for i in layers]
        if len(set(resolved)) != len(resolved) or min(resolved) < 0 or (count is not None and max(resolved) >= count):
            raise ValueError(f"target_feature_layers must be distinct layers of the target's {count} "
                             f"(0 .. {count - 1 if count else 'L - 1'}, or negative from the end), got {list(layers)}")
        return resolved

    @property
    def target_feature_size(self) -> int:
        """Width of the target state the draft reads per token: hidden_size x (1 + len(target_feature_layers))."""
        return self.hidden_size * (1 + len(self.target_feature_layers or ()))

    @classmethod
    def from_target_config(cls, target_config, **overrides) -> LongSpecConfig:
        """Build a draft config matched to a target's config.

        Args:
            target_config: the target's `PreTrainedConfig` (its text config is used for multimodal configs).
            **overrides: any `LongSpecConfig` field except those fixed by the target (vocab_size, hidden_size,
                num_attention_heads, num_key_value_heads, head_dim), e.g. `sliding_window=256`,
                `beam_widths=[4, 8, 8]`, `intermediate_size=2048`.
        Returns: a `LongSpecConfig`.
        Raises: ValueError if the target family is unsupported (see `SUPPORTED_TARGET_TYPES`), if its last layer
            is not full attention, or if an override tries to change a size fixed by the target.
        Reference: LongSpec §3.1.
        """
        text = target_config.get_text_config()
        check_target_config(text)
        fixed = target_fixed_sizes(text)
        clash = sorted(k for k in overrides if k in fixed and overrides[k] != fixed[k])
        if clash:
            raise ValueError(
                f"{clash} are fixed by the target (the draft shares its embedding, LM head and KV cache); "
                "remove them from the overrides"
            )
        values = {
            **fixed,
            "intermediate_size": text.intermediate_size,
            "hidden_act": text.hidden_act,
            "rms_norm_eps": text.rms_norm_eps,
            "attention_bias": bool(getattr(text, "attention_bias", text.model_type == "qwen2")),
            "mlp_bias": bool(getattr(text, "mlp_bias", False)),
            "max_position_embeddings": text.max_position_embeddings,
            "initializer_range": getattr(text, "initializer_range", 0.02),
            "target_model_type": text.model_type,
            "target_num_hidden_layers": text.num_hidden_layers,
            "target_name_or_path": hub_repo_id(getattr(target_config, "name_or_path", None)),
            "bos_token_id": text.bos_token_id,
            "eos_token_id": text.eos_token_id,
            "pad_token_id": text.pad_token_id,
        }
        values.update(overrides)
        return cls(**values)


def target_fixed_sizes(text_config) -> dict[str, int]:
    """The sizes a draft must share with its target: vocab_size, hidden_size, query/KV heads, head_dim.

    Args:
        text_config: the target's text `PreTrainedConfig`.
    Returns: dict of those five ints (KV heads and head_dim derived as transformers does when unset).
    Reference: LongSpec §3.1 (shared embedding and LM head; the cross-attention reads the target's KV cache).
    """
    heads = text_config.num_attention_heads
    return {
        "vocab_size": text_config.vocab_size,
        "hidden_size": text_config.hidden_size,
        "num_attention_heads": text_config.num_attention_heads,
        "num_key_value_heads": text_config.num_key_value_heads or text_config.num_attention_heads,
        "head_dim": getattr(text_config, "head_dim", None) or text_config.hidden_size // heads,
    }


def size_mismatches(draft_config: LongSpecConfig, text_config) -> dict[str, tuple[int, int]]:
    """{size name: (draft value, target value)} for every size in `target_fixed_sizes` that differs."""
    return {k: (getattr(draft_config, k), v) for k, v in target_fixed_sizes(text_config).items()
            if getattr(draft_config, k) != v}


def check_target_config(text_config) -> None:
    """Raise if a target cannot host a LongSpec draft.

    Args:
        text_config: the target's text `PreTrainedConfig`.
    Raises: ValueError naming the problem: unsupported `model_type`, a last layer that is not full attention
        (sliding-window or linear-attention last layers keep no full KV cache for the cross-attention), or
        sliding-window attention anywhere (the hybrid tree attention assumes full-attention layers).
    Reference: LongSpec §3.1 (the cross-attention reads the target's last-layer KV cache).
    """
    model_type = text_config.model_type
    if model_type not in SUPPORTED_TARGET_TYPES:
        raise ValueError(
            f"LongSpec drafts support targets of type {list(SUPPORTED_TARGET_TYPES)}, got '{model_type}'. "
            "Use a Llama-, Qwen2- or Mistral-architecture target"
        )
    layer_types = getattr(text_config, "layer_types", None)
    if layer_types and any(t != "full_attention" for t in layer_types):
        raise ValueError(
            f"the target's layers are {sorted(set(layer_types))}; LongSpec needs full attention in every layer "
            "(the draft reads the last layer's whole KV cache). Disable sliding-window attention on the target"
        )
    if model_type == "mistral" and getattr(text_config, "sliding_window", None) is not None:
        raise ValueError(
            f"this Mistral target uses sliding_window={text_config.sliding_window}; LongSpec needs full attention. "
            "Set config.sliding_window = None if the checkpoint supports full attention"
        )


# save_pretrained writes `auto_map` and copies this file beside the weights: Hub users load the draft with
# AutoConfig/AutoModel(..., trust_remote_code=True) without this package (this module imports transformers only).
LongSpecConfig.register_for_auto_class()

class AssistantOnlyGenerationConfig(GenerationConfig):
    """What `draft.generation_config` returns. transformers' own assisted decoding (run when `transformers_longspec` is
    not imported, e.g. a draft loaded as Hub remote code) first copies its assistant's generation config: this copy
    raises ValueError naming the fix (`MESSAGE`) instead of a bare AttributeError."""

    MESSAGE = (
        "a LongSpec draft does not generate by itself: pass it to its target, target.generate(input_ids, "
        "assistant_model=draft), after `import transformers_longspec` (pip install transformers-longspec), which runs "
        "the tree decoding"
    )

    def __deepcopy__(self, memo):
        raise ValueError(self.MESSAGE)


__all__ = [
    "LongSpecConfig", "validate_beam_widths", "check_target_config", "target_fixed_sizes", "size_mismatches",
    "hub_repo_id", "SUPPORTED_TARGET_TYPES",
    "AssistantOnlyGenerationConfig",
]
