"""The LongSpec draft model (`LongSpecDraft`): one decoder block that reads the target's own KV cache.

    x = target.embed_tokens(ids)                                   # shared, not owned
    x = block(x, target K/V [, target hidden state])               # `blocks.LongSpecBlock`
    logits = target.lm_head(norm(x))                               # shared, not owned

The embedding, LM head and rotary embedding are the target's: they are held outside the module tree (`attach_target`),
so `state_dict`, `save_pretrained`, optimizers and `.to()` only ever see draft weights. Departure from the authors'
code: a final RMSNorm before the shared LM head (initialised from the target's final norm), which the LM head was
trained to expect; the cross-attention has no dead k/v projections.

Reference: LongSpec (arXiv 2502.17421) §3.1; transformers `modeling_llama.py` for the blocks we reuse.
"""

from __future__ import annotations

import os
import tempfile
import warnings
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import GenerationConfig, PreTrainedModel
from transformers import initialization as init
from transformers.models.llama.modeling_llama import LlamaRMSNorm
from transformers.utils import ModelOutput

from .blocks import _HYBRID_TREE_ATTENTION, LongSpecBlock, sliding_window_attention, sliding_window_causal_mask
from .checkpoint import (
    COMPACT_FIX,
    check_finite_weights,
    check_loading_info,
    check_saved_draft,
    compact_file_config,
    compare_state_shapes,
    create_hub_repo,
    local_draft_folder,
    read_compact_state,
    upload_draft_folder,
    write_compact_file,
)
from .configuration import AssistantOnlyGenerationConfig, LongSpecConfig, check_target_config, size_mismatches


@dataclass
class LongSpecDraftOutput(ModelOutput):
    """Output of `LongSpecDraft.forward`.

    Attributes:
        loss: () fp32, mean next-token cross-entropy over supervised positions (when `labels` are given).
        logits: (batch, seq, vocab) fp32, only when `return_logits=True` (a 150k vocabulary at 16k tokens would
            not fit otherwise).
        hidden_states: (batch, seq, hidden), the normed draft states fed to the shared LM head.
    """

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    hidden_states: torch.Tensor | None = None


@dataclass
class _SharedTarget:
    """The target modules the draft uses without owning them (held weakly: the target owns itself)."""

    model: weakref.ref
    embed_tokens: nn.Module
    lm_head: nn.Module
    rotary_emb: nn.Module


class LongSpecPreTrainedModel(PreTrainedModel):
    """Base class: config class, capability flags and weight init of LongSpec drafts."""

    config_class = LongSpecConfig
    config: LongSpecConfig
    base_model_prefix = "longspec"
    supports_gradient_checkpointing = True
    _no_split_modules = ["LongSpecBlock"]
    _supports_sdpa = True
    accepts_loss_kwargs = False  # the Trainer must not pass num_items_in_batch into forward

    def _init_weights(self, module):
        super()._init_weights(module)
        block = getattr(self, "block", None)
        if module is getattr(block, "hidden_proj", None) or module is getattr(block, "feature_proj", None):
            init.zeros_(module.weight)  # the target's hidden states start with no say: a plain LongSpec draft


def _neuron_strength(target_mlp) -> torch.Tensor:
    """(intermediate,) fp32 strength of each neuron of a gated MLP: ||up row|| x ||down column||. A narrow draft
    starts from the strongest (`from_target`), `widen_mlp` adds the next ones."""
    return target_mlp.up_proj.weight.float().norm(dim=1) * target_mlp.down_proj.weight.float().norm(dim=0)


class LongSpecDraft(LongSpecPreTrainedModel):
    """One-layer LongSpec draft whose memory does not grow with the context.

    Build a new one for a target with `LongSpecDraft.from_target(target)`, load a trained one with
    `LongSpecDraft.from_pretrained(path, target_model=target)`, then pass it as `assistant_model=` to the
    target's `generate` (after `import transformers_longspec`).

    Reference: LongSpec (arXiv 2502.17421) §3.1; transformers `PreTrainedModel`.
    """

    def __init__(self, config: LongSpecConfig):
        super().__init__(config)
        self.last_generation_stats = None  # `LongSpecStats` of the latest generate call (None before the first)
        self.block = LongSpecBlock(config)
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        if config.draft_vocab_size:  # the tokens this draft proposes from (`vocabulary.py`), saved with the weights
            self.register_buffer("draft_vocab", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.__dict__["_shared"] = None
        self.post_init()

    @property
    def generation_config(self) -> GenerationConfig:  # a draft does not generate by itself: copying it raises
        return AssistantOnlyGenerationConfig()

    if _HYBRID_TREE_ATTENTION is not None:  # not in the Hub copy, which transformers would make a GenerationMixin
        def generate(self, *args, **kwargs):  # a draft is used as target.generate(input_ids, assistant_model=draft)
            raise ValueError(AssistantOnlyGenerationConfig.MESSAGE)

    # ------------------------------------------------------------------ target attachment
    @classmethod
    def from_target(cls, target_model, init_from_target: bool = True, **overrides) -> LongSpecDraft:
        """Build a new (untrained) draft matched to `target_model` and attach it.

        Args:
            target_model: a Llama-, Qwen2- or Mistral-architecture `*ForCausalLM` (full attention).
            init_from_target: copy the target's last decoder layer into the draft's attention/MLP weights and the
                target's final norm into the draft's (a warm start for training); False = random init.
            **overrides: `LongSpecConfig` fields, e.g. `sliding_window=256`, `beam_widths=[4, 8, 8]`.
        Returns: the draft, on the target's device and dtype.
        Raises: ValueError for an unsupported target (see `LongSpecConfig.from_target_config`), or for
            `draft_vocab_size` (a vocabulary is a set of tokens: `set_draft_vocabulary`).
        Reference: LongSpec §3.1.
        """
        if overrides.get("draft_vocab_size"):
            raise ValueError("a draft vocabulary is a set of token ids, not a size: build the draft without "
                             "draft_vocab_size, then call draft.set_draft_vocabulary(ids) (e.g. "
                             "transformers_longspec.vocabulary.frequent_tokens of the training rows)")
        config = LongSpecConfig.from_target_config(target_model.config, **overrides)
        draft = cls(config)
        if init_from_target:
            draft._copy_from_target(target_model)
        param = next(target_model.parameters())
        draft.to(device=param.device, dtype=param.dtype)
        return draft.attach_target(target_model)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, target_model=None, **kwargs):
        """`PreTrainedModel.from_pretrained`, then `attach_target(target_model)` when one is given.

        A local folder is checked before any weight is read (`checkpoint.py`). The draft is moved to the target's
        device and dtype unless `dtype`/`device_map` are passed. A compact draft file (`save_compact`: one
        safetensors file, matrices in int8) loads too, dequantized; it takes `target_model` and `dtype` only.
        Raises: ValueError, naming the problem and the fix, for a local path that is missing or a file that is not
            a compact draft, a folder without a LongSpec config.json (e.g. the target's folder), missing / truncated
            safetensors, tensors missing, unexpected or mis-shaped for the config, weights holding NaN or inf, or a
            draft that does not fit `target_model` (see `attach_target`).
        Reference: transformers `PreTrainedModel.from_pretrained`.
        """
        compact = compact_file_config(pretrained_model_name_or_path)
        if compact is not None:
            return cls._from_compact(pretrained_model_name_or_path, compact, target_model, kwargs, model_args)
        folder = local_draft_folder(pretrained_model_name_or_path, kwargs.get("subfolder", ""), kwargs)
        if folder is not None and kwargs.get("variant") is None:
            check_saved_draft(folder, cls)
        want_info = kwargs.pop("output_loading_info", False)
        draft, info = super().from_pretrained(
            pretrained_model_name_or_path, *model_args, output_loading_info=True, **kwargs
        )
        check_loading_info(info, pretrained_model_name_or_path)
        check_finite_weights(draft, pretrained_model_name_or_path, "download the draft again or retrain it")
        if target_model is not None:
            if "dtype" not in kwargs and "torch_dtype" not in kwargs and "device_map" not in kwargs:
                param = next(target_model.parameters())
                draft.to(device=param.device, dtype=param.dtype)
            draft.attach_target(target_model)
        return (draft, info) if want_info else draft

    @classmethod
    def _from_compact(cls, path, config: dict, target_model, kwargs: dict, model_args=()) -> LongSpecDraft:
        """A draft from a compact file (`checkpoint.write_compact_file`), in eval mode, on the target's device and
        dtype (or `dtype`: a torch.dtype, its name, or "auto" = the target's), attached to `target_model` when one is
        given."""
        dtype = kwargs.pop("dtype", None)
        dtype = kwargs.pop("torch_dtype", None) if dtype is None else dtype
        if kwargs or model_args:
            raise ValueError(f"a compact draft file loads with target_model and dtype only; got "
                             f"{sorted(kwargs) + [repr(a) for a in model_args]}")
        if dtype == "auto":
            dtype = None
        elif isinstance(dtype, str):
            if not isinstance(getattr(torch, dtype, None), torch.dtype):
                raise ValueError(f"dtype={dtype!r} is not a torch dtype; pass e.g. torch.bfloat16 or 'bfloat16'")
            dtype = getattr(torch, dtype)
        draft = cls(cls.config_class.from_dict(config))
        state = read_compact_state(path)
        compare_state_shapes({k: tuple(v.shape) for k, v in state.items()},
                             {k: tuple(v.shape) for k, v in draft.state_dict().items()}, path, compact=True)
        draft.load_state_dict(state)
        check_finite_weights(draft, path, COMPACT_FIX)
        if target_model is not None:
            param = next(target_model.parameters())
            draft.to(device=param.device, dtype=dtype or param.dtype)
            draft.attach_target(target_model)
        elif dtype is not None:
            draft.to(dtype=dtype)
        return draft.eval()

    def save_compact(self, path, bits: int = 8) -> str:
        """Write the draft as ONE safetensors file with its matrices in int8 (one scale per row) or int4 (one fp16
        scale per 32 columns of a row; a matrix whose width is not a multiple of 64 stays int8) and its config in the
        metadata: about a quarter (int8) or a seventh (int4) of the fp32 folder's size, for a draft kept in a
        repository or shipped with a package. Load it with
        `LongSpecDraft.from_pretrained(path, target_model=target)`. Only the draft's proposals change with the
        rounding; generation stays exact.

        Args: path: the file to write, e.g. "draft.int8.safetensors" ("~" expanded, missing folders created).
            bits: 8 or 4 (weights per byte: 1 or 2).
        Returns: the path written (str).
        Raises: ValueError for a draft wrapped with a LoRA adapter (merge it first) or bits other than 8 or 4.
        Reference: `checkpoint.write_compact_file`.
        """
        state = self.state_dict()
        if any("lora_" in name or ".base_layer." in name for name in state):
            raise ValueError("this draft carries a LoRA adapter; merge it first: "
                             "transformers_longspec.trainers.merge_lora_draft(model).save_compact(path)")
        return os.fspath(write_compact_file(path, state, self.config.to_dict(), bits))

    def attach_target(self, target_model) -> LongSpecDraft:
        """Use `target_model`'s embedding, LM head and rotary embedding (shared, never copied or saved).

        Raises: ValueError naming the mismatch if the target is unsupported or its vocabulary, hidden size, heads
            or head_dim differ from this draft's config (a draft trained for another target), or if it has fewer
            layers than the draft's `target_feature_layers` read. Warns (UserWarning)
            when only the target family or layer count differs: output stays exact, acceptance will be low.
        Reference: LongSpec §3.1 (shared embedding and LM head).
        """
        self.check_target_sizes(target_model)
        text = target_model.config.get_text_config()
        layers = self.config.target_feature_layers or ()
        if layers and max(layers) >= text.num_hidden_layers:
            raise ValueError(f"this draft reads target layers {list(layers)} (config.target_feature_layers) but the "
                             f"target has {text.num_hidden_layers} layers; use the target the draft was trained for, "
                             "or train a draft for this one")
        built_for = (self.config.target_model_type, self.config.target_num_hidden_layers)
        if None not in built_for and built_for != (text.model_type, text.num_hidden_layers):
            warnings.warn(
                f"this draft was built for a {built_for[0]} target with {built_for[1]} layers, not for this "
                f"{text.model_type} target with {text.num_hidden_layers}; generation stays exact, but expect few "
                "accepted tokens unless the draft was trained for this target",
                UserWarning,
                stacklevel=2,
            )
        decoder = target_model.get_decoder()
        self.__dict__["_shared"] = _SharedTarget(
            model=weakref.ref(target_model),
            embed_tokens=target_model.get_input_embeddings(),
            lm_head=target_model.get_output_embeddings(),
            rotary_emb=decoder.rotary_emb,
        )
        return self

    def get_input_embeddings(self):
        """The target's (shared) token embedding, or None before `attach_target`."""
        return None if self._shared is None else self._shared.embed_tokens

    def check_target_sizes(self, target_model) -> None:
        """Raise ValueError unless `target_model` is a supported target with this draft's vocabulary and sizes.

        Raises: ValueError naming the unsupported architecture, or every size that differs (vocab_size,
            hidden_size, num_attention_heads, num_key_value_heads, head_dim), with the fix.
        Reference: LongSpec §3.1 (the draft shares the target's embedding, LM head and KV layout).
        """
        text = target_model.config.get_text_config()
        check_target_config(text)
        bad = size_mismatches(self.config, text)
        if bad:
            detail = ", ".join(f"{k}: draft {d} vs target {t}" for k, (d, t) in bad.items())
            raise ValueError(
                f"this draft was built for another target ({detail}); build one for this target with "
                "LongSpecDraft.from_target(target) or load the draft trained for it"
            )

    @property
    def shared_lm_head(self) -> nn.Module:
        """The target's LM head the draft uses (shared, not owned). Raises: ValueError before `attach_target`."""
        return self._require_target().lm_head

    @torch.no_grad()
    def add_target_features(self, layers) -> None:
        """Let a draft that reads the target's final hidden state also read the outputs of target decoder `layers`
        (`LongSpecConfig.target_feature_layers`), e.g. to continue training a trained draft with them. The new
        projection starts at zero, so the draft's proposals are unchanged until it is trained.

        Args:
            layers: list of int, target layer indices (negative: from the last layer).
        Raises: ValueError if the draft does not read the target's hidden state (`target_hidden_input`), already
            reads feature layers, or `layers` are not distinct layers of the target.
        Reference: EAGLE-3 (Li et al., 2025) §3, the fused low / middle / high features.
        """
        config = self.config
        if not config.target_hidden_input:
            raise ValueError("add_target_features needs a draft with target_hidden_input=True (the layers join the "
                             "target's final hidden state); build one with LongSpecDraft.from_target(target, "
                             "target_hidden_input=True, target_feature_layers=...)")
        if config.target_feature_layers:
            raise ValueError(f"this draft already reads target layers {config.target_feature_layers}; build a new "
                             "draft to read others")
        if any("lora_" in name for name, _ in self.named_parameters()):
            raise ValueError("add_target_features on a LoRA-wrapped draft: the adapter would neither train nor save "
                             "the new projection; add the layers first, then wrap it (add_lora_to_draft)")
        config.target_feature_layers = config._checked_feature_layers(layers)
        if config.target_feature_layers is None:
            return
        weight = self.block.hidden_proj.weight
        self.block.add_feature_layers(config)
        self.block.feature_norms.to(device=weight.device, dtype=weight.dtype)
        self.block.feature_proj.to(device=weight.device, dtype=weight.dtype)
        self.block.feature_proj.weight.zero_()
        self.__dict__.pop("_static_step", None)  # an engine with buffers for the old feature width

    @torch.no_grad()
    def widen_mlp(self, intermediate_size: int) -> None:
        """Give a trained draft a wider gated MLP (`config.intermediate_size` grows), e.g. to continue training a
        compact draft with more capacity. The new neurons' down-projection columns start at zero, so the draft's
        proposals are unchanged until it is trained. Their gate and up rows are the attached target's last-layer
        neurons ranked old width .. new width - 1 by strength (`from_target` starts a narrow draft from the strongest
        ones), or random (the config's `initializer_range`) without an attached target at least that wide.

        Args:
            intermediate_size: the new width (an int, numpy's included, larger than the current one).
        Raises: ValueError for a width that is not an int, not larger than the current one, or a LoRA-wrapped draft.
        Reference: Net2Net (Chen et al., 2016): function-preserving widening.
        """
        mlp = self.block.mlp
        old = mlp.up_proj.weight.shape[0]
        if isinstance(intermediate_size, bool) or not hasattr(intermediate_size, "__index__"):  # ints, numpy's too
            raise ValueError(f"widen_mlp takes the new width as an int, got {intermediate_size!r} "
                             f"({type(intermediate_size).__name__}); e.g. widen_mlp({2 * old})")
        intermediate_size = intermediate_size.__index__()
        if intermediate_size <= old:
            raise ValueError(f"widen_mlp needs an intermediate_size larger than the draft's {old}, got "
                             f"{intermediate_size}; a narrower draft is a new draft (LongSpecDraft.from_target)")
        if any("lora_" in name for name, _ in self.named_parameters()):
            raise ValueError("widen_mlp on a LoRA-wrapped draft: the adapter would neither train nor save the new "
                             "neurons; widen first, then wrap it (add_lora_to_draft)")
        extra, rows, target = intermediate_size - old, {}, self.target_model
        theirs = None if target is None else target.get_decoder().layers[-1].mlp
        if theirs is not None and theirs.up_proj.weight.shape[0] >= intermediate_size and (
                theirs.up_proj.weight.shape[1] == mlp.up_proj.weight.shape[1]):
            order = _neuron_strength(theirs).argsort(descending=True)[old:intermediate_size]
            rows = {name: getattr(theirs, name).weight[order] for name in ("gate_proj", "up_proj")}
        std = self.config.initializer_range
        for name, dim in (("gate_proj", 0), ("up_proj", 0), ("down_proj", 1)):
            linear = getattr(mlp, name)
            shape = list(linear.weight.shape)
            shape[dim] = extra
            if name == "down_proj":
                new = torch.zeros(shape)
            else:
                new = rows[name] if rows else torch.randn(shape) * std
            grown = torch.cat([linear.weight, new.to(linear.weight)], dim=dim)
            linear.weight = nn.Parameter(grown, requires_grad=linear.weight.requires_grad)
            if name != "down_proj" and linear.bias is not None:
                linear.bias = nn.Parameter(torch.cat([linear.bias, linear.bias.new_zeros(extra)]))
            linear.in_features, linear.out_features = linear.weight.shape[1], linear.weight.shape[0]
        mlp.intermediate_size = intermediate_size
        self.config.intermediate_size = intermediate_size
        self.__dict__.pop("_static_step", None)  # an engine built for the old width

    @torch.no_grad()
    def set_draft_vocabulary(self, token_ids: torch.Tensor) -> None:
        """Give the draft its own vocabulary: it proposes only `token_ids` (n,) int64 (e.g.
        `vocabulary.frequent_tokens` of its training rows) plus each call's prompt tokens; `config.draft_vocab_size`
        becomes n and the ids are saved with the weights (`draft_vocab`). Order them most frequent first:
        `generate(longspec_draft_vocab=m)` keeps the first m. Only proposals change: the output stays the target's
        own.

        Raises: ValueError for ids that repeat or fall outside [0, vocab_size), or n outside [1, vocab_size).
        Reference: `vocabulary.py` (FR-Spec, Zhao et al. 2025).
        """
        ids = torch.as_tensor(token_ids, dtype=torch.long).flatten()
        vocab = self.config.vocab_size
        if not 0 < ids.numel() < vocab or int(ids.min()) < 0 or int(ids.max()) >= vocab:
            span = f" in [{int(ids.min())}, {int(ids.max())}]" if ids.numel() else ""
            raise ValueError(f"a draft vocabulary is 1 to {vocab - 1} token ids in [0, {vocab}), got "
                             f"{ids.numel()} ids{span}")
        if torch.unique(ids).numel() != ids.numel():
            raise ValueError("the draft vocabulary repeats token ids: pass each token once")
        self.config.draft_vocab_size = ids.numel()
        device = next(self.parameters()).device
        self.register_buffer("draft_vocab", ids.to(device))
        self.__dict__.pop("_static_step", None)  # an engine built for the old vocabulary

    @property
    def target_model(self):
        """The attached target model, or None."""
        return None if self._shared is None else self._shared.model()

    def _require_target(self) -> _SharedTarget:
        if self._shared is None or self._shared.model() is None:
            raise ValueError(
                "this draft is not attached to a target; load it with "
                "LongSpecDraft.from_pretrained(path, target_model=target) or call draft.attach_target(target)"
            )
        return self._shared

    @torch.no_grad()
    def _copy_from_target(self, target_model) -> None:
        last = target_model.get_decoder().layers[-1]
        block, attn = self.block, last.self_attn
        pairs = [(getattr(block.self_attn, n), getattr(attn, n)) for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
        pairs += [(getattr(block.cross_attn, n), getattr(attn, n)) for n in ("q_proj", "o_proj")]
        if block.mlp.up_proj.weight.shape == last.mlp.up_proj.weight.shape:
            pairs += [(getattr(block.mlp, n), getattr(last.mlp, n)) for n in ("gate_proj", "up_proj", "down_proj")]
        else:
            self._copy_strongest_neurons(last.mlp)
        pairs += [(block.input_layernorm, last.input_layernorm),
                  (block.post_self_attention_layernorm, last.input_layernorm),
                  (block.post_cross_attention_layernorm, last.post_attention_layernorm),
                  (self.norm, target_model.get_decoder().norm)]
        for mine, theirs in pairs:
            for name, p in mine.named_parameters(recurse=False):
                src = getattr(theirs, name, None)
                if src is not None and src.shape == p.shape:
                    p.copy_(src.to(p.dtype))

    def _copy_strongest_neurons(self, target_mlp) -> None:
        """A draft MLP narrower than the target's (`intermediate_size` override) starts from the target's last-layer
        neurons of largest ||up row|| x ||down column|| (their gate and up rows and biases, their down columns; the
        down bias whole), in their order; a wider one keeps its random init."""
        mlp, width = self.block.mlp, self.block.mlp.up_proj.weight.shape[0]
        up, down = target_mlp.up_proj.weight, target_mlp.down_proj.weight
        if width > up.shape[0] or mlp.up_proj.weight.shape[1] != up.shape[1]:
            return
        keep = _neuron_strength(target_mlp).topk(width).indices.sort().values
        for name in ("gate_proj", "up_proj"):
            mine, theirs = getattr(mlp, name), getattr(target_mlp, name)
            mine.weight.copy_(theirs.weight[keep].to(mine.weight.dtype))
            if mine.bias is not None and theirs.bias is not None:
                mine.bias.copy_(theirs.bias[keep].to(mine.bias.dtype))
        mlp.down_proj.weight.copy_(down[:, keep].to(mlp.down_proj.weight.dtype))
        if mlp.down_proj.bias is not None and target_mlp.down_proj.bias is not None:
            mlp.down_proj.bias.copy_(target_mlp.down_proj.bias.to(mlp.down_proj.bias.dtype))

    # ------------------------------------------------------------------ compute
    def rotary(self, hidden: torch.Tensor, position_ids: torch.Tensor):
        """The target's RoPE (cos, sin), each (batch, seq, head_dim), at absolute `position_ids` (batch, seq)."""
        return self._require_target().rotary_emb(hidden, position_ids)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The target's token embedding of `input_ids` (batch, seq) int64 → (batch, seq, hidden)."""
        return self._require_target().embed_tokens(input_ids)

    def lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Shared LM head on normed draft states (batch, seq, hidden), cast to the head's dtype → fp32 logits."""
        head = self._require_target().lm_head
        return head(hidden.to(head.weight.dtype)).float()

    def self_kv(self, input_ids: torch.Tensor, position_ids: torch.Tensor):
        """Self-attention K/V of tokens at positions, each (1, n_kv_heads, seq, head_dim).

        A one-layer draft's K/V depend only on (token, position), so committed tokens need no attention at all.
        """
        hidden = self.embed(input_ids)
        cos, sin = self.rotary(hidden, position_ids)
        return self.block.self_attn.project_kv(self.block.input_layernorm(hidden), cos, sin)

    def target_feature(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """The draft's additive term for the target's state, to pass as `step_logits(target_feature=...)`: every level
        of one tree reads the same state, so `grow_tree` computes it once per tree instead of once per level.

        Args: target_hidden: (1, 1, config.target_feature_size), as `step_logits` takes it.
        Returns: (1, 1, hidden) in the target embedding's dtype.
        Raises: ValueError if the draft does not read the target's state (`config.target_hidden_input`).
        """
        self._check_target_hidden(target_hidden)
        return self.block.feature_term(target_hidden, self._require_target().embed_tokens.weight.dtype)

    def step_logits(self, input_ids, position_ids, past_keys, past_values, self_mask, target_keys, target_values,
                    target_tail_mask=None, target_hidden=None, vocab=None, target_feature=None):
        """One inference step of the draft over query tokens, up to the LM head (used to grow the tree; the
        log-probs are `log_softmax(logits.float() + bias)`, which `kernels.beam_select` computes with the choice).

        Args:
            input_ids, position_ids: (1, q) int64 — tokens and their absolute positions.
            past_keys, past_values: (1, n_kv_heads, p, head_dim) — ring buffer + earlier tree nodes.
            self_mask: (q, p + q) bool — which of [past; own] keys each query sees.
            target_keys, target_values: (1, n_kv_heads, committed, head_dim) — the target's last-layer cache.
            target_tail_mask: optional (m,) bool — the target K/V end with an m-row block of which only these rows
                are committed (static-shape decoding, `static_step.py`); None means all rows are committed.
            target_hidden: (1, 1, config.target_feature_size) — the target's final hidden state at the last
                committed token (then its `config.target_feature_layers` outputs there); required iff
                `config.target_hidden_input`.
            vocab: a `vocabulary.DraftVocabulary`: logits over its slots only (None: the whole vocabulary).
            target_feature: (1, 1, hidden), `target_feature(target_hidden)` computed once per tree, given instead of
                `target_hidden` (the same logits).
        Returns: (logits (1, q, vocab or vocab slots) in the LM head's dtype; bias (vocab slots,) fp32 to add before
            the softmax (`vocab.bias`: -inf on padding slots) or None; own keys, own values (1, n_kv_heads, q,
            head_dim)).
        Raises: ValueError if `target_hidden` (or `target_feature`) is missing although the config asks for it, or
            both are given.
        """
        if target_feature is None:
            self._check_target_hidden(target_hidden)
        elif target_hidden is not None or not self.config.target_hidden_input:
            raise ValueError("target_feature is draft.target_feature(target_hidden) of a draft with target_hidden_input;"
                             " pass it instead of target_hidden, not beside it")
        hidden = self.embed(input_ids)
        cos, sin = self.rotary(hidden, position_ids)
        hidden, k, v = self.block(hidden, cos, sin, target_keys, target_values, self_mask, past_keys, past_values,
                                  cross_tail_mask=target_tail_mask, target_hidden=target_hidden,
                                  feature=target_feature)
        hidden = self.norm(hidden)
        if vocab is None:
            head = self._require_target().lm_head
            return head(hidden.to(head.weight.dtype)), None, k, v
        return F.linear(hidden.to(vocab.weight.dtype), vocab.weight), vocab.bias, k, v

    def forward(
        self,
        input_ids: torch.LongTensor,
        target_keys: torch.Tensor | None = None,
        target_values: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        labels: torch.LongTensor | None = None,
        target_hidden: torch.Tensor | None = None,
        noise_offset: int = 1,
        return_logits: bool = False,
        loss_chunk_size: int = 2048,
    ) -> LongSpecDraftOutput:
        """Training forward over whole sequences (teacher forcing on the target's KV cache).

        Args:
            input_ids: (batch, seq) int64.
            target_keys, target_values: (batch, n_kv_heads, seq, head_dim) — the frozen target's last-layer K/V for
                the same tokens at the same `position_ids` (post-RoPE).
            position_ids: (batch, seq) int64, default `arange(seq)`; anchor-offset indices go here.
            labels: (batch, seq) int64 aligned with `input_ids` (shifted inside, -100 = ignored), optional.
            target_hidden: (batch, seq, config.target_feature_size) — the target's final (normed) hidden states for
                the same tokens, then its `config.target_feature_layers` outputs (`trainers.target_last_layer_kv`);
                required iff `config.target_hidden_input`. Position i reads the state at i - j, the last one the
                target has verified at inference.
            noise_offset: j >= 1: position i sees target K/V <= i - j (flash noisy training, LongSpec Alg. 2);
                the first j positions get no loss.
            return_logits: also return the full fp32 logits (memory: batch * seq * vocab * 4 bytes).
            loss_chunk_size: positions per LM-head chunk in the loss (bounds the logits memory).
        Returns: `LongSpecDraftOutput`.
        Raises: ValueError if the target K/V are missing (to generate, see `generate`), shapes disagree or offset < 1.
        Reference: LongSpec §3.2 (training with the target's KV cache, Alg. 1–2).
        """
        if target_keys is None or target_values is None:
            raise ValueError("LongSpecDraft.forward is the training forward over the target's last-layer K/V "
                             f"(target_keys, target_values); {AssistantOnlyGenerationConfig.MESSAGE}")
        batch, seq = input_ids.shape
        if target_keys.shape[0] != batch or target_keys.shape[2] != seq or target_values.shape != target_keys.shape:
            raise ValueError(
                f"target_keys/values must be (batch={batch}, n_kv_heads, seq={seq}, head_dim), got "
                f"{tuple(target_keys.shape)} / {tuple(target_values.shape)}"
            )
        if noise_offset < 1:
            raise ValueError(f"noise_offset must be >= 1 (1 = no noise), got {noise_offset}")
        self._check_target_hidden(target_hidden, (batch, seq, self.config.target_feature_size))
        if target_hidden is not None:  # position i gets the state at i - j (zeros before: those get no loss)
            target_hidden = F.pad(target_hidden[:, : max(seq - noise_offset, 0)], (0, 0, min(noise_offset, seq), 0))
        if position_ids is None:
            position_ids = torch.arange(seq, device=input_ids.device).expand(batch, seq)
        hidden = self.embed(input_ids)
        if self.block.gradient_checkpointing and self.training and torch.is_grad_enabled():
            hidden.requires_grad_()  # the frozen shared embedding gives no grad; reentrant checkpointing needs one
        cos, sin = self.rotary(hidden, position_ids)
        hidden, _, _ = self.block(hidden, cos, sin, target_keys, target_values, cross_offset=noise_offset,
                                  target_hidden=target_hidden)
        hidden = self.norm(hidden)
        loss = None
        if labels is not None:
            targets = labels[:, 1:].clone()  # position t predicts labels[t + 1]
            targets[:, :noise_offset] = -100  # positions < j see no target K/V (dropped queries)
            loss = self._chunked_loss(hidden[:, :-1], targets, loss_chunk_size)
        logits = self.lm_logits(hidden) if return_logits else None
        return LongSpecDraftOutput(loss=loss, logits=logits, hidden_states=hidden)

    def _check_target_hidden(self, target_hidden, shape=None) -> None:
        """Raise ValueError unless `target_hidden` is given exactly when the config reads it (and has `shape`)."""
        wanted = self.config.target_hidden_input
        if wanted and target_hidden is None:
            raise ValueError("this draft reads the target's hidden states (config.target_hidden_input=True): pass "
                             "target_hidden, the target decoder's final hidden states")
        if not wanted and target_hidden is not None:
            raise ValueError("target_hidden given to a draft built without target_hidden_input; build it with "
                             "LongSpecDraft.from_target(target, target_hidden_input=True) or drop target_hidden")
        width = self.config.target_feature_size
        if wanted and ((shape is not None and tuple(target_hidden.shape) != shape) or target_hidden.shape[-1] != width):
            shape = shape or (*target_hidden.shape[:-1], width)
            layers = self.config.target_feature_layers
            what = f"hidden x (1 + {len(layers)} feature layers)" if layers else "hidden"
            raise ValueError(f"target_hidden must be (batch, seq, {what}) = {shape}, got {tuple(target_hidden.shape)}"
                             + ("; the trainer's target_last_layer_kv(..., feature_layers=draft.config."
                                "target_feature_layers) gives it" if layers else ""))

    def _chunked_loss(self, hidden, labels, chunk: int) -> torch.Tensor:
        """Mean CE over labels != -100, computing the LM head `chunk` positions at a time.

        With gradients on, each chunk is checkpointed: its logits are freed after the forward and recomputed in
        the backward, so at most one chunk of (batch, chunk, vocab) logits is alive at any time (a 150k vocabulary
        at 32k tokens would otherwise keep ~50 GB of logits and log-probs for the backward pass).
        """
        total = hidden.float().sum() * 0.0  # stays in the graph when a batch has no supervised token
        count = (labels != -100).sum()
        recompute = torch.is_grad_enabled() and hidden.requires_grad
        for start in range(0, hidden.shape[1], chunk):
            part = labels[:, start : start + chunk]
            if (part != -100).any():
                states = hidden[:, start : start + chunk]
                if recompute:
                    total = total + checkpoint(self._chunk_loss_sum, states, part, use_reentrant=False)
                else:
                    total = total + self._chunk_loss_sum(states, part)
        return total / count.clamp(min=1)

    def _chunk_loss_sum(self, hidden, labels) -> torch.Tensor:
        """Summed CE of one chunk: normed states (batch, chunk, hidden), labels (batch, chunk) → () fp32."""
        return F.cross_entropy(self.lm_logits(hidden).flatten(0, 1), labels.flatten(), reduction="sum")

    def free_static_buffers(self) -> None:
        """Release the target cache and graphs kept between calls with static shapes (the default on CUDA)."""
        self.__dict__.pop("_static_step", None)
    # ------------------------------------------------------------------ saving: a folder ready for the Hub
    def save_pretrained(self, save_directory, *args, model_card: bool = True, **kwargs):
        """`PreTrainedModel.save_pretrained`, writing a folder ready to push to the Hub.

        The folder holds `config.json` (with `auto_map`), `model.safetensors` (draft weights only: the target's
        embedding and LM head are never saved), the remote-code modules `configuration.py`, `modeling.py`, `blocks.py`
        and `checkpoint.py` (so `AutoModel.from_pretrained(folder, trust_remote_code=True)` loads the draft without
        this package), and `README.md`, the model card made from `model_cards/longspec_draft.md` by
        `transformers_longspec.hub.write_model_card`.

        Args:
            save_directory: the folder (created if needed).
            model_card: write README.md (needs the transformers-longspec package; skipped with a warning without it).
            **kwargs: as transformers' `save_pretrained`. `repo_id`: the Hub repository named in the card's code
                (default: the folder's name) and, with `push_to_hub=True`, where the folder is uploaded, card included
                (`commit_message`, `private`, `token`, `revision`, `create_pr` as in `push_to_hub`).
        Reference: transformers `PreTrainedModel.save_pretrained`, `custom_object_save`; huggingface_hub `ModelCard`.
        """
        push = kwargs.pop("push_to_hub", False)
        upload = {k: kwargs.pop(k) for k in ("commit_message", "token", "revision", "create_pr") if k in kwargs}
        repo_id, private = kwargs.pop("repo_id", None), kwargs.pop("private", None)
        if push:  # resolved first, so that the card names the repository the folder lands in
            repo_id = create_hub_repo(repo_id or os.path.basename(os.path.abspath(save_directory)), private,
                                      upload.get("token"))
        super().save_pretrained(save_directory, *args, **kwargs)
        if model_card and kwargs.get("is_main_process", True):
            try:  # absolute import: the Hub copy of this file (remote code) runs without the package
                from transformers_longspec.hub import write_model_card
            except ImportError:
                warnings.warn("README.md not written: the LongSpec model card needs the transformers-longspec package")
            else:
                write_model_card(self, save_directory, repo_id=repo_id)
        return upload_draft_folder(save_directory, repo_id, **upload) if push else None

    def push_to_hub(self, repo_id: str, *, commit_message: str | None = None, private: bool | None = None,
                    token=None, revision: str | None = None, create_pr: bool = False, **save_kwargs) -> str:
        """Upload the folder `save_pretrained` writes (weights, config with `auto_map`, remote code, model card).

        transformers' own `push_to_hub` would replace the LongSpec model card with a generic one.
        Args: as transformers' `push_to_hub`; `**save_kwargs` go to `save_pretrained` (e.g. `max_shard_size`).
        Returns: the URL of the commit.
        Reference: huggingface_hub `HfApi.create_repo`, `HfApi.upload_folder`.
        """
        with tempfile.TemporaryDirectory() as folder:
            return self.save_pretrained(folder, push_to_hub=True, repo_id=repo_id, commit_message=commit_message,
                                        private=private, token=token, revision=revision, create_pr=create_pr,
                                        **save_kwargs)

    # ------------------------------------------------------------------ copies must not drag the target along
    def __getstate__(self):
        state = self.__dict__.copy()
        state["_shared"] = None
        state.pop("_static_step", None)
        return state


# save_pretrained writes `auto_map` and copies this file (with blocks.py, configuration.py and checkpoint.py, its only
# relative imports) beside the weights: `AutoModel.from_pretrained(folder, trust_remote_code=True)` then needs no
# package.
LongSpecDraft.register_for_auto_class("AutoModel")

__all__ = ["LongSpecDraft", "LongSpecPreTrainedModel", "LongSpecDraftOutput", "sliding_window_attention",
           "sliding_window_causal_mask"]
