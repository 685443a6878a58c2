"""Hybrid tree attention, registered in transformers' `AttentionInterface` as "longspec".

During verification the queries are the T tree tokens and the keys/values are the committed cache (C rows,
visible to every tree token: no mask) followed by the tree itself (ancestor mask). The two parts are computed
separately and merged exactly by their log-sum-exps:

      keys:     [ committed cache (C) ........................ | tree (T) ]
      query i:  [ all visible, prefix kernel, returns LSE l1   | ancestors of i, masked kernel, LSE l2 ]
      out_i = o1 * exp(l1 - l) + o2 * exp(l2 - l),   l = logaddexp(l1, l2)

so the O(T x C) part never materialises a mask. On a GPU both parts are one Triton kernel (`fused_mask_attn` with
a mask over the tree only: its key blocks in the committed cache read no mask), split over the keys and merged by
the LSEs inside the kernel's combine step: two launches per layer instead of five. On a CPU in fp32, where a
(T, C + T) boolean mask costs little, the same attention is one SDPA call with the full mask; elsewhere (CPU bf16 /
fp16) the two parts run as their torch references and merge as above.
Calls without the `longspec_tree_mask` kwarg (prefill, anything else) are plain SDPA.

Reference: LongSpec (arXiv 2502.17421) §3.4 (hybrid tree attention); transformers `AttentionInterface`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from .kernels import fused_mask_attn, fused_mask_attn_ref, merge_attention_states, prefix_attn, triton_available

# Whether the GPU kernel packs the query heads that share a kv head into one program (`fused_mask_attn(pack_gqa=)`),
# so each key block is read once per kv head: on an H200 at 16k (Qwen2.5-1.5B's shape, `benchmarks/kernel_profile.py`)
# it took the verification from 4.29 to 4.10 ms and the draft from 0.99 to 0.94 ms per step.
PACK_GQA = True


def _use_triton(query: torch.Tensor) -> bool:
    return query.is_cuda and query.dtype in (torch.float16, torch.bfloat16) and triton_available()


def hybrid_tree_attention(query, key, value, tree_mask: torch.Tensor, scale: float) -> torch.Tensor:
    """Attention of tree queries over [committed prefix; masked block] with a boolean mask on the last block only.

    The keys split into an unmasked prefix (every query sees it) and the last `tree_mask.shape[1]` keys under
    `tree_mask`. On CUDA one `fused_mask_attn` call covers both (prefix key blocks read no mask); elsewhere the
    prefix runs as `prefix_attn`, the masked block as `fused_mask_attn_ref`, merged by their LSEs. In the plain
    case the masked block is the tree itself (ancestor mask); the static-shape decode step (`static_step.py`) also
    puts the tail of the committed cache there (visible rows set).
    It runs as the custom op `torch.ops.longspec.hybrid_tree_attention`, so `torch.compile` keeps it whole (an
    opaque call inside the compiled graph) instead of tracing into the kernels.

    Args:
        query: (batch, n_heads, tree_size, head_dim).
        key, value: (batch, n_kv_heads, prefix + masked, head_dim), the masked block last.
        tree_mask: (tree_size, masked) bool, True where query i may see key `prefix + j`.
        scale: softmax scale (1/sqrt(head_dim) for the supported targets).
    Returns: (batch, n_heads, tree_size, head_dim), contiguous, dtype of `query`.
    Raises: ValueError if the key length is shorter than the masked block.
    Reference: LongSpec §3.4; `torch.library.custom_op`.
    """
    if key.shape[2] < tree_mask.shape[-1]:
        raise ValueError(f"key length {key.shape[2]} is shorter than the masked block ({tree_mask.shape[-1]} keys)")
    return _hybrid_op(query, key, value, tree_mask, float(scale))


@torch.library.custom_op("longspec::hybrid_tree_attention", mutates_args=())
def _hybrid_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, tree_mask: torch.Tensor,
               scale: float) -> torch.Tensor:
    masked = tree_mask.shape[-1]
    prefix = key.shape[2] - masked
    if query.device.type == "cpu" and query.dtype == torch.float32:  # one CPU kernel over [prefix; masked]
        full = torch.cat([tree_mask.new_ones(tree_mask.shape[0], prefix), tree_mask], dim=1)
        return F.scaled_dot_product_attention(query, key, value, attn_mask=full, scale=scale,
                                              enable_gqa=query.shape[1] != key.shape[1]).contiguous()
    if _use_triton(query):  # one kernel over [prefix; masked]: the prefix key blocks read no mask (split-KV)
        return fused_mask_attn(query, key, value, tree_mask, scale, visible_prefix=True, pack_gqa=PACK_GQA)[0]
    out, lse_tree = fused_mask_attn_ref(query, key[:, :, prefix:], value[:, :, prefix:], tree_mask, scale)
    if prefix > 0:
        out_prefix, lse_prefix = prefix_attn(query, key[:, :, :prefix], value[:, :, :prefix], scale)
        out, _ = merge_attention_states(out_prefix, lse_prefix, out, lse_tree)
    return out.contiguous()


@_hybrid_op.register_fake
def _(query, key, value, tree_mask, scale):
    return query.new_empty(query.shape)


def longspec_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    longspec_tree_mask: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """The "longspec" attention function: hybrid tree attention for tree calls, SDPA otherwise.

    Args: as transformers attention functions — query (batch, n_heads, q_len, head_dim), key/value
        (batch, n_kv_heads, kv_len, head_dim); `longspec_tree_mask` (q_len, masked) bool marks a tree call and
        masks the last `masked` keys (see `hybrid_tree_attention`).
    Returns: (attn_output (batch, q_len, n_heads, head_dim), None).
    Reference: transformers `AttentionInterface` / `sdpa_attention_forward`.
    """
    if longspec_tree_mask is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out = hybrid_tree_attention(query, key, value, longspec_tree_mask, scale)
    return out.transpose(1, 2).contiguous(), None


def packed_gqa_sdpa_forward(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                            **kwargs) -> tuple[torch.Tensor, None]:
    """The "longspec_packed_sdpa" attention function: SDPA under an explicit mask without copying the kv heads.

    transformers' SDPA path repeats every kv head for its query heads (`repeat_kv`) whenever a mask is given, which
    copies the whole cache n_heads / n_kv_heads times per layer and call: for a batch of 192 left-padded prompts
    of a GQA target that copy, not the attention, is the step. Here the query heads that share a kv head are packed
    into the query axis instead, (batch, n_kv_heads, group x q_len, head_dim), and the mask is repeated along that
    axis to match: the keys and values are read as they are. Used by `trainers.batch_greedy`.

    Args: as transformers attention functions — query (batch, n_heads, q_len, head_dim), key / value
        (batch, n_kv_heads, kv_len, head_dim), attention_mask (batch, 1, q_len, >= kv_len) additive or bool; None
        (no padding: transformers' mask function skips the mask) runs transformers' SDPA, causal as it decides;
        dropout must be 0.
    Returns: (attn_output (batch, q_len, n_heads, head_dim), None), dtype of `query`.
    Raises: ValueError for dropout > 0 or n_heads not a multiple of n_kv_heads (with a mask).
    Reference: transformers `sdpa_attention_forward` (`repeat_kv`, `use_gqa_in_sdpa`); the GQA packing of
        FlashAttention-2 / FlashDecoding (query heads of one kv head in one program).
    """
    if attention_mask is None:  # no mask to repeat: transformers' SDPA reads the kv heads as they are (enable_gqa)
        return sdpa_attention_forward(module, query, key, value, None, dropout=dropout, scaling=scaling, **kwargs)
    batch, heads, length, dim = query.shape
    kv_heads = key.shape[1]
    if dropout:
        raise ValueError(f"packed_gqa_sdpa_forward needs dropout 0, got {dropout}")
    if heads % kv_heads:
        raise ValueError(f"packed_gqa_sdpa_forward needs n_heads ({heads}) a multiple of n_kv_heads ({kv_heads})")
    group = heads // kv_heads
    packed = query.reshape(batch, kv_heads, group * length, dim)  # head kv * group + j, query t -> row j * length + t
    mask = attention_mask[..., : key.shape[2]].expand(batch, 1, length, key.shape[2]).repeat(1, 1, group, 1)
    out = F.scaled_dot_product_attention(packed, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(batch, heads, length, dim).transpose(1, 2).contiguous(), None


__all__ = ["hybrid_tree_attention", "longspec_attention_forward", "packed_gqa_sdpa_forward"]
