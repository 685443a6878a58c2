"""The draft's building blocks: sliding-window self-attention, cross-attention on the target's K/V, the decoder block.

    x = x + self_attn(norm1(x))        sliding-window causal self-attention (ring-buffer cache at inference)
    x = x + hidden_proj(norm_h(h))     the target's final hidden state (only with config.target_hidden_input)
          + feature_proj([norm_i(h_i)])  the outputs of target layers i (only with config.target_feature_layers)
    x = x + cross_attn(norm2(x))       queries from the draft, keys/values = the TARGET's last-layer K/V
    x = x + mlp(norm3(x))              gated MLP (transformers' LlamaMLP)

`modeling.py` puts the block between the target's shared embedding and LM head. Like it, this module is copied beside
saved weights as remote code, so it imports only torch and transformers (the hybrid tree attention of the package is
optional).

Reference: LongSpec (arXiv 2502.17421) §3.1; EAGLE (Li et al., 2024) for the hidden-state input and EAGLE-3 (Li et al.,
2025) for the fused low / middle / high layer features; transformers
`modeling_llama.py` for the blocks we reuse.
"""

from __future__ import annotations

import importlib

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, rotate_half

from .configuration import LongSpecConfig


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
        if mask is not None and _HYBRID_TREE_ATTENTION is not None and q.is_cuda and q.dtype != torch.float32:
            out = _HYBRID_TREE_ATTENTION(q, keys, values, mask, self.scaling)  # one Triton kernel, a mask over all
        else:
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
    """The draft's one decoder block: self-attention → [target hidden state] → cross-attention → gated MLP,
    pre-RMSNorm residuals. The target's hidden state (`config.target_hidden_input`) enters after the self-attention,
    so the self-attention K/V still depend only on (token, position) and the ring cache needs no features. With
    `config.target_feature_layers` the state is (..., hidden x (1 + k)): the final state, then the k layers' outputs."""

    def __init__(self, config: LongSpecConfig):
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn = LongSpecSelfAttention(config)
        if config.target_hidden_input:
            self.hidden_norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
            self.hidden_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        if config.target_feature_layers:
            self.add_feature_layers(config)
        self.post_self_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.cross_attn = LongSpecCrossAttention(config)
        self.post_cross_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def add_feature_layers(self, config: LongSpecConfig) -> None:
        """Build one RMSNorm per `config.target_feature_layers` entry and their joint projection (zeroed by the
        model's weight init, or by `LongSpecDraft.add_target_features` for a trained draft)."""
        size, count = config.hidden_size, len(config.target_feature_layers)
        self.feature_norms = nn.ModuleList(LlamaRMSNorm(size, eps=config.rms_norm_eps) for _ in range(count))
        self.feature_proj = nn.Linear(size * count, size, bias=False)

    def feature_term(self, target_hidden: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """What the target's state adds to the residual stream: (batch, q, hidden x (1 + k)) in any dtype, cast to
        `dtype` (the stream's) → (batch, q, hidden). The same for every level of one tree, so a tree computes it once."""
        final, *layers = target_hidden.to(dtype).split(self.hidden_proj.weight.shape[0], dim=-1)
        term = self.hidden_proj(self.hidden_norm(final))
        if layers:
            term = term + self.feature_proj(torch.cat([n(h) for n, h in zip(self.feature_norms, layers)], -1))
        return term

    def forward(self, hidden, cos, sin, target_keys, target_values, self_mask=None, past_keys=None,
                past_values=None, cross_offset=None, cross_tail_mask=None, target_hidden=None, feature=None):
        attn, k, v = self.self_attn(self.input_layernorm(hidden), cos, sin, past_keys, past_values, self_mask)
        hidden = hidden + attn
        if target_hidden is not None:  # (batch, q or 1, hidden x (1 + k)): broadcast over one tree level's queries
            feature = self.feature_term(target_hidden, hidden.dtype)
        if feature is not None:  # (batch, q or 1, hidden): the term itself, computed once per tree
            hidden = hidden + feature
        hidden = hidden + self.cross_attn(
            self.post_self_attention_layernorm(hidden), cos, sin, target_keys, target_values, cross_offset,
            cross_tail_mask,
        )
        hidden = hidden + self.mlp(self.post_cross_attention_layernorm(hidden))
        return hidden, k, v


__all__ = ["LongSpecBlock", "LongSpecCrossAttention", "LongSpecSelfAttention", "sliding_window_attention",
           "sliding_window_causal_mask"]
