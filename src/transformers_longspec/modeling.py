"""The LongSpec draft model (`LongSpecDraft`): one decoder block that reads the target's own KV cache.

    x = target.embed_tokens(ids)                                   # shared, not owned
    x = x + self_attn(norm1(x))        sliding-window causal self-attention (ring-buffer cache at inference)
    x = x + cross_attn(norm2(x))       queries from the draft, keys/values = the TARGET's last-layer K/V
    x = x + mlp(norm3(x))              gated MLP (transformers' LlamaMLP)
    logits = target.lm_head(norm(x))                               # shared, not owned

The embedding, LM head and rotary embedding are the target's: they are held outside the module tree (`attach_target`),
so `state_dict`, `save_pretrained`, optimizers and `.to()` only ever see draft weights. Departure from the authors'
code: a final RMSNorm before the shared LM head (initialised from the target's final norm), which the LM head was
trained to expect; the cross-attention has no dead k/v projections.

Reference: LongSpec (arXiv 2502.17421) §3.1; transformers `modeling_llama.py` for the blocks we reuse.
"""

from __future__ import annotations

import importlib
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
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, rotate_half
from transformers.utils import ModelOutput

from .checkpoint import (
    check_loading_info,
    check_saved_draft,
    create_hub_repo,
    local_draft_folder,
    non_finite_parameters,
    upload_draft_folder,
)
from .configuration import AssistantOnlyGenerationConfig, LongSpecConfig, check_target_config, size_mismatches


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x` (batch, heads, seq, head_dim) by `cos`/`sin` (batch, seq, head_dim) — the target's RoPE."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return (x * cos) + (rotate_half(x) * sin)


def _attend(q, k, v, mask=None, is_causal=False, scale=None) -> torch.Tensor:
    """SDPA with GQA: q (b, H, q, D), k/v (b, Hkv, k, D), optional bool mask (q, k) → (b, H, q, D)."""
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=q.shape[1] != k.shape[1]
    )


def sliding_window_causal_mask(length: int, window: int, device=None) -> torch.Tensor:
    """Bool (length, length) mask: query i sees keys j with i - window < j <= i (True = attend).

    Reference: transformers' sliding-window convention (the query itself counts towards the window).
    """
    i = torch.arange(length, device=device)
    delta = i[:, None] - i[None, :]
    return (delta >= 0) & (delta < window)


def sliding_window_attention(q, k, v, window: int, scale: float | None = None) -> torch.Tensor:
    """Causal sliding-window attention over whole sequences without a (seq, seq) mask.

    Query i sees keys j with i - window < j <= i (`sliding_window_causal_mask`). Queries are cut into blocks of
    `window`; block t attends to key blocks t-1 and t under one (window, 2 x window) mask, so memory and compute grow
    linearly with the sequence (a dense mask at 32k tokens is 1 GB of booleans and forces SDPA's quadratic path).

    Args:
        q: (batch, n_heads, seq, head_dim); k, v: (batch, n_kv_heads, seq, head_dim), already rotated.
        window: keys per query, the query included (tokens).
        scale: softmax scale; None = head_dim ** -0.5.
    Returns: (batch, n_heads, seq, head_dim), dtype of `q`; equal to SDPA with `sliding_window_causal_mask`.
    Reference: LongSpec §3.1 (sliding-window self-attention of the draft); PyTorch `scaled_dot_product_attention`.
    """
    batch, heads, seq, dim = q.shape
    if seq <= window:
        return _attend(q, k, v, is_causal=True, scale=scale)
    blocks = -(-seq // window)
    pad = blocks * window - seq

    def split(x):  # (b, h, seq, d) -> (b, h, blocks, window, d), zero-padded at the end
        return F.pad(x, (0, 0, 0, pad)).unflatten(2, (blocks, window))

    def with_previous(x):  # (b, h, blocks, window, d) -> (b * blocks, h, 2 * window, d): [block t-1; block t]
        previous = F.pad(x[:, :, :-1], (0, 0, 0, 0, 1, 0))
        return torch.cat([previous, x], dim=3).transpose(1, 2).flatten(0, 1)

    queries = split(q).transpose(1, 2).flatten(0, 1)  # (b * blocks, h, window, d)
    keys, values = with_previous(split(k)), with_previous(split(v))
    row = torch.arange(window, device=q.device)[:, None]
    col = torch.arange(2 * window, device=q.device)[None, :]
    mask = ((col > row) & (col <= row + window)).expand(blocks, window, 2 * window).clone()
    mask[0, :, :window] = False  # block 0 has no previous block (those keys are padding)
    mask = mask.unsqueeze(1).repeat(batch, 1, 1, 1)  # (b * blocks, 1, window, 2 * window)
    out = _attend(queries, keys, values, mask=mask, scale=scale)
    return out.unflatten(0, (batch, blocks)).transpose(1, 2).flatten(2, 3)[:, :, :seq]


def _optional_hybrid_attention():
    """The package's `hybrid_tree_attention`, or None where this file is loaded alone as Hub remote code (the
    static-shape decoding that needs it only runs with the package installed). Imported by name so that
    transformers' remote-code loader does not look for an `attention.py` beside this file."""
    try:
        return importlib.import_module(".attention", __package__).hybrid_tree_attention
    except ImportError:
        return None


_HYBRID_TREE_ATTENTION = _optional_hybrid_attention()


class LongSpecSelfAttention(nn.Module):
    """Sliding-window causal self-attention of the draft (GQA layout of the target)."""

    def __init__(self, config: LongSpecConfig):
        super().__init__()
        h, kv, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.head_dim, self.scaling, self.window = d, d**-0.5, config.sliding_window
        self.q_proj = nn.Linear(config.hidden_size, h * d, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv * d, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv * d, bias=config.attention_bias)
        self.o_proj = nn.Linear(h * d, config.hidden_size, bias=False)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(*x.shape[:-1], -1, self.head_dim).transpose(1, 2)

    def project_kv(self, hidden, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """K (rotated) and V, each (batch, n_kv_heads, seq, head_dim), of normed `hidden` (batch, seq, hidden)."""
        return _rope(self._heads(self.k_proj(hidden)), cos, sin), self._heads(self.v_proj(hidden))

    def forward(self, hidden, cos, sin, past_keys=None, past_values=None, mask=None):
        """Attend from `hidden` (batch, q, hidden) over [past; own] keys.

        `mask` is bool (q, past + q); without past and mask, the causal sliding window is applied blockwise
        (`sliding_window_attention`, linear in the sequence length).
        Returns (output (batch, q, hidden), own keys, own values) — the latter for the caller's cache.
        """
        q = _rope(self._heads(self.q_proj(hidden)), cos, sin)
        k, v = self.project_kv(hidden, cos, sin)
        if past_keys is None and mask is None:
            out = sliding_window_attention(q, k, v, self.window, scale=self.scaling)
            return self.o_proj(out.transpose(1, 2).flatten(2)), k, v
        keys = k if past_keys is None else torch.cat([past_keys, k], dim=2)
        values = v if past_values is None else torch.cat([past_values, v], dim=2)
        out = _attend(q, keys, values, mask=mask, scale=self.scaling)
        return self.o_proj(out.transpose(1, 2).flatten(2)), k, v


class LongSpecCrossAttention(nn.Module):
    """Cross-attention from draft queries onto the target's last-layer K/V (already rotated by the target)."""

    def __init__(self, config: LongSpecConfig):
        super().__init__()
        h, d = config.num_attention_heads, config.head_dim
        self.head_dim, self.scaling = d, d**-0.5
        self.q_proj = nn.Linear(config.hidden_size, h * d, bias=config.attention_bias)
        self.o_proj = nn.Linear(h * d, config.hidden_size, bias=False)

    def forward(self, hidden, cos, sin, target_keys, target_values, offset: int | None = None, tail_mask=None):
        """Attend from `hidden` (batch, q, hidden) over target K/V (batch, n_kv_heads, kv, head_dim).

        offset=None: every query sees every target key (inference: all queries sit after the committed cache).
        tail_mask (m,) bool (inference, static shapes): only the last m keys are masked — key kv - m + j is seen
        iff tail_mask[j] (the committed cache ends inside that block).
        offset=j (training, q == kv): query i sees target keys <= i - j, as at inference where the target has
        not yet verified the last j tokens; queries i < j see none and output zeros (flash noisy training:
        drop the last j keys and the first j queries, LongSpec §3.2 Alg. 2).
        """
        q = _rope(self.q_proj(hidden).view(*hidden.shape[:-1], -1, self.head_dim).transpose(1, 2), cos, sin)
        if tail_mask is not None:
            out = _HYBRID_TREE_ATTENTION(q, target_keys, target_values, tail_mask.expand(q.shape[2], -1), self.scaling)
        elif offset is None:
            out = _attend(q, target_keys, target_values, scale=self.scaling)
        else:
            length = q.shape[2]
            out = q.new_zeros(q.shape)
            if offset < length:
                out[:, :, offset:] = _attend(
                    q[:, :, offset:], target_keys[:, :, : length - offset], target_values[:, :, : length - offset],
                    is_causal=True, scale=self.scaling,
                )
        return self.o_proj(out.transpose(1, 2).flatten(2))


class LongSpecBlock(GradientCheckpointingLayer):
    """The draft's one decoder block: self-attention → cross-attention → gated MLP, pre-RMSNorm residuals."""

    def __init__(self, config: LongSpecConfig):
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn = LongSpecSelfAttention(config)
        self.post_self_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.cross_attn = LongSpecCrossAttention(config)
        self.post_cross_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(self, hidden, cos, sin, target_keys, target_values, self_mask=None, past_keys=None,
                past_values=None, cross_offset=None, cross_tail_mask=None):
        attn, k, v = self.self_attn(self.input_layernorm(hidden), cos, sin, past_keys, past_values, self_mask)
        hidden = hidden + attn
        hidden = hidden + self.cross_attn(
            self.post_self_attention_layernorm(hidden), cos, sin, target_keys, target_values, cross_offset,
            cross_tail_mask,
        )
        hidden = hidden + self.mlp(self.post_cross_attention_layernorm(hidden))
        return hidden, k, v


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
        Raises: ValueError for an unsupported target (see `LongSpecConfig.from_target_config`).
        Reference: LongSpec §3.1.
        """
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
        device and dtype unless `dtype`/`device_map` are passed.
        Raises: ValueError, naming the problem and the fix, for a local path that is missing or a file, a folder
            without a LongSpec config.json (e.g. the target's folder), missing / truncated safetensors, tensors
            missing, unexpected or mis-shaped for the config, weights holding NaN or inf, or a draft that does not
            fit `target_model` (see `attach_target`).
        Reference: transformers `PreTrainedModel.from_pretrained`.
        """
        folder = local_draft_folder(pretrained_model_name_or_path, kwargs.get("subfolder", ""), kwargs)
        if folder is not None and kwargs.get("variant") is None:
            check_saved_draft(folder, cls)
        want_info = kwargs.pop("output_loading_info", False)
        draft, info = super().from_pretrained(
            pretrained_model_name_or_path, *model_args, output_loading_info=True, **kwargs
        )
        check_loading_info(info, pretrained_model_name_or_path)
        broken = non_finite_parameters(draft)
        if broken:
            raise ValueError(
                f"the draft weights in {os.fspath(pretrained_model_name_or_path)!r} hold NaN or inf ({broken[:4]}): a "
                "corrupted file or a diverged training run; download the draft again or retrain it"
            )
        if target_model is not None:
            if "dtype" not in kwargs and "torch_dtype" not in kwargs and "device_map" not in kwargs:
                param = next(target_model.parameters())
                draft.to(device=param.device, dtype=param.dtype)
            draft.attach_target(target_model)
        return (draft, info) if want_info else draft

    def attach_target(self, target_model) -> LongSpecDraft:
        """Use `target_model`'s embedding, LM head and rotary embedding (shared, never copied or saved).

        Raises: ValueError naming the mismatch if the target is unsupported or its vocabulary, hidden size, heads
            or head_dim differ from this draft's config (a draft trained for another target). Warns (UserWarning)
            when only the target family or layer count differs: output stays exact, acceptance will be low.
        Reference: LongSpec §3.1 (shared embedding and LM head).
        """
        self.check_target_sizes(target_model)
        text = target_model.config.get_text_config()
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
        pairs += [(getattr(block.mlp, n), getattr(last.mlp, n)) for n in ("gate_proj", "up_proj", "down_proj")]
        pairs += [(block.input_layernorm, last.input_layernorm),
                  (block.post_self_attention_layernorm, last.input_layernorm),
                  (block.post_cross_attention_layernorm, last.post_attention_layernorm),
                  (self.norm, target_model.get_decoder().norm)]
        for mine, theirs in pairs:
            for name, p in mine.named_parameters(recurse=False):
                src = getattr(theirs, name, None)
                if src is not None and src.shape == p.shape:
                    p.copy_(src.to(p.dtype))

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

    def step(self, input_ids, position_ids, past_keys, past_values, self_mask, target_keys, target_values,
             target_tail_mask=None):
        """One inference step of the draft over query tokens (used to grow the tree).

        Args:
            input_ids, position_ids: (1, q) int64 — tokens and their absolute positions.
            past_keys, past_values: (1, n_kv_heads, p, head_dim) — ring buffer + earlier tree nodes.
            self_mask: (q, p + q) bool — which of [past; own] keys each query sees.
            target_keys, target_values: (1, n_kv_heads, committed, head_dim) — the target's last-layer cache.
            target_tail_mask: optional (m,) bool — the target K/V end with an m-row block of which only these rows
                are committed (static-shape decoding, `static_step.py`); None means all rows are committed.
        Returns: (log-probs (1, q, vocab) fp32, own keys, own values (1, n_kv_heads, q, head_dim)).
        """
        hidden = self.embed(input_ids)
        cos, sin = self.rotary(hidden, position_ids)
        hidden, k, v = self.block(hidden, cos, sin, target_keys, target_values, self_mask, past_keys, past_values,
                                  cross_tail_mask=target_tail_mask)
        return torch.log_softmax(self.lm_logits(self.norm(hidden)), dim=-1), k, v

    def forward(
        self,
        input_ids: torch.LongTensor,
        target_keys: torch.Tensor | None = None,
        target_values: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        labels: torch.LongTensor | None = None,
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
        if position_ids is None:
            position_ids = torch.arange(seq, device=input_ids.device).expand(batch, seq)
        hidden = self.embed(input_ids)
        if self.block.gradient_checkpointing and self.training and torch.is_grad_enabled():
            hidden.requires_grad_()  # the frozen shared embedding gives no grad; reentrant checkpointing needs one
        cos, sin = self.rotary(hidden, position_ids)
        hidden, _, _ = self.block(hidden, cos, sin, target_keys, target_values, cross_offset=noise_offset)
        hidden = self.norm(hidden)
        loss = None
        if labels is not None:
            targets = labels[:, 1:].clone()  # position t predicts labels[t + 1]
            targets[:, :noise_offset] = -100  # positions < j see no target K/V (dropped queries)
            loss = self._chunked_loss(hidden[:, :-1], targets, loss_chunk_size)
        logits = self.lm_logits(hidden) if return_logits else None
        return LongSpecDraftOutput(loss=loss, logits=logits, hidden_states=hidden)

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
        embedding and LM head are never saved), the remote-code modules `configuration.py`, `modeling.py` and
        `checkpoint.py` (so `AutoModel.from_pretrained(folder, trust_remote_code=True)` loads the draft without this
        package), and `README.md`, the model card made from `model_cards/longspec_draft.md` by
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


# save_pretrained writes `auto_map` and copies this file (with configuration.py and checkpoint.py, its only relative
# imports) beside the weights: `AutoModel.from_pretrained(folder, trust_remote_code=True)` then needs no package.
LongSpecDraft.register_for_auto_class("AutoModel")

__all__ = ["LongSpecDraft", "LongSpecPreTrainedModel", "LongSpecDraftOutput", "sliding_window_attention",
           "sliding_window_causal_mask"]
