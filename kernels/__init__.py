"""Kernels for LongSpec's hybrid tree attention and draft tree, each with an exact torch `*_ref` twin.

The target's attention over [committed prefix; draft tree] is computed in two passes and merged exactly:

    out_p, lse_p = prefix_attn(q, k_prefix, v_prefix)                 # no mask, long cache
    out_t, lse_t = fused_mask_attn(q, k_tree, v_tree, tree_mask)      # Triton, arbitrary bool mask
    out, lse = merge_attention_states(out_p, lse_p, out_t, lse_t)

The draft's tree levels choose their children with `beam_select` (log-softmax + the best `width` (node, token)
pairs by cumulative log-probability, in three small Triton programs; `beam_select_ref` is its twin).

Each module's docstring is its kernel card (dtypes, head dims, limits, what it was tested on). Triton is optional:
this package imports without it, `triton_available()` says whether `fused_mask_attn` can run, and the `*_ref`
functions run on any device. To run the Triton kernel on CPU (tests), set TRITON_INTERPRET=1 before import.
"""

from ._triton_utils import triton_available
from .beam_select import beam_select, beam_select_ref
from .lse_merge import merge_attention_states, merge_attention_states_ref
from .prefix_attention import prefix_attn, prefix_attn_ref
from .tree_attention import fused_mask_attn, fused_mask_attn_ref

__all__ = [
    "beam_select",
    "beam_select_ref",
    "fused_mask_attn",
    "fused_mask_attn_ref",
    "merge_attention_states",
    "merge_attention_states_ref",
    "prefix_attn",
    "prefix_attn_ref",
    "triton_available",
]
