"""Caches of the LongSpec decode loop.

* `LongSpecCache` — the TARGET's KV cache: one preallocated buffer per layer and a committed-length pointer.
  A verification forward writes the whole tree's K/V after the committed prefix; `commit_path` then moves the
  accepted path's rows down in place (≤ depth + 1 rows per layer) and advances the pointer. Nothing is ever
  concatenated, so a step costs O(tree) memory traffic instead of O(context) (`DynamicCache` copies the layer).
* `DraftRingCache` — the DRAFT's self-attention cache: a ring buffer of `sliding_window` entries. Its size does
  not depend on the context length (LongSpec §3.1; the authors' code keeps a full-length buffer).

Reference: transformers `Cache` / `CacheLayerMixin` (cache_utils.py); LongSpec §3.1 and §3.3.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

_GROWTH_ROUND = 256  # buffers are allocated in multiples of this many tokens


def _round_up(n: int, multiple: int = _GROWTH_ROUND) -> int:
    return -(-n // multiple) * multiple


class LongSpecCacheLayer(CacheLayerMixin):
    """One target layer's K/V in a preallocated buffer with a length pointer.

    `keys` / `values` are views `(batch, n_kv_heads, length, head_dim)` of the buffer, so code that reads
    `layer.keys` (transformers, the draft's cross-attention) sees exactly the committed + pending rows.
    """

    is_sliding = False
    is_croppable = True

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = _round_up(max(int(capacity), 1))
        self.length = 0
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        batch, heads, _, dim = key_states.shape
        self.dtype, self.device = key_states.dtype, key_states.device
        self._key_buffer = key_states.new_zeros(batch, heads, self.capacity, dim)
        self._value_buffer = value_states.new_zeros(batch, heads, self.capacity, value_states.shape[-1])
        self.is_initialized = True
        self._refresh_views()

    def _refresh_views(self) -> None:
        self.keys = self._key_buffer[:, :, : self.length]
        self.values = self._value_buffer[:, :, : self.length]

    def _grow(self, needed: int) -> None:
        # Rare: only when a caller under-estimated the capacity. Doubling keeps the amortised cost O(1) per token.
        new_capacity = _round_up(max(needed, 2 * self.capacity))
        for name in ("_key_buffer", "_value_buffer"):
            old = getattr(self, name)
            new = old.new_zeros(*old.shape[:2], new_capacity, old.shape[-1])
            new[:, :, : self.length] = old[:, :, : self.length]
            setattr(self, name, new)
        self.capacity = new_capacity

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Append `(batch, n_kv_heads, q_len, head_dim)` K/V after the current length; return the full views."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, n = self.length, key_states.shape[-2]
        if start + n > self.capacity:
            self._grow(start + n)
        self._key_buffer[:, :, start : start + n] = key_states
        self._value_buffer[:, :, start : start + n] = value_states
        self.length = start + n
        self._refresh_views()
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1  # grows on demand

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last `-tokens_to_remove` rows (transformers 5.x negative-count semantics).

        Raises: ValueError for a positive count (the deprecated absolute-length form).
        """
        if tokens_to_remove > 0:
            raise ValueError("LongSpecCacheLayer.crop takes a negative count of tokens to remove, e.g. crop(-3)")
        self.length = max(0, self.length + tokens_to_remove)
        if self.is_initialized:
            self._refresh_views()

    def commit_path(self, committed: int, path: torch.Tensor) -> None:
        """Keep rows `committed + path` (in that order) at `committed ...`; drop every row after them.

        Args:
            committed: rows before the tree (tokens).
            path: (n_accepted,) int64, tree-local indices of the accepted nodes, root first, increasing.
        """
        n = path.numel()
        rows = self._key_buffer.index_select(2, path + committed)  # gather first: sources and targets overlap
        self._key_buffer[:, :, committed : committed + n] = rows
        rows = self._value_buffer.index_select(2, path + committed)
        self._value_buffer[:, :, committed : committed + n] = rows
        self.length = committed + n
        self._refresh_views()

    def reset(self) -> None:
        self.length = 0
        if self.is_initialized:
            self._refresh_views()


class LongSpecCache(Cache):
    """The target's KV cache during LongSpec decoding: preallocated layers, in-place tree compaction.

    Args:
        num_layers: the target's decoder layer count.
        capacity: tokens to preallocate per layer (prompt + max_new_tokens + tree size is enough to never grow).

    Every layer holds `(batch, n_kv_heads, capacity, head_dim)` K and V in the target's dtype/device, allocated
    on the first `update`. Works as `past_key_values` for any transformers decoder (it is a `Cache`).

    Reference: transformers `Cache` (cache_utils.py); LongSpec §3.4 (KV of the accepted path is kept).
    """

    def __init__(self, num_layers: int, capacity: int):
        super().__init__(layers=[LongSpecCacheLayer(capacity) for _ in range(num_layers)])

    @property
    def committed_length(self) -> int:
        """Tokens whose K/V are committed in every layer."""
        return self.layers[0].length

    def commit_path(self, committed: int, path: torch.Tensor) -> None:
        """Compact the accepted tree path in every layer; see `LongSpecCacheLayer.commit_path`."""
        for layer in self.layers:
            layer.commit_path(committed, path)

    def crop(self, max_length: int) -> None:
        """Drop the last `-max_length` tokens of every layer (negative count, transformers 5.x semantics)."""
        for layer in self.layers:
            layer.crop(max_length)


class DraftRingCache:
    """Self-attention K/V of the draft in a ring buffer of `window` slots, plus the current tree's K/V.

    Args:
        window: ring slots (the draft's `sliding_window`, tokens).
        tree_size: nodes in one draft tree.
        n_kv_heads, head_dim: the draft's KV layout.
        dtype, device: of the buffers.

    Tensors: `ring_keys`/`ring_values` (1, n_kv_heads, window, head_dim); `ring_positions` (window,) int64,
    -1 for an empty slot; `tree_keys`/`tree_values` (1, n_kv_heads, tree_size, head_dim). Memory is
    `2 * (window + tree_size) * n_kv_heads * head_dim * itemsize` bytes whatever the context length.

    Reference: LongSpec §3.1 (sliding-window self-attention; a one-layer draft needs only the last window).
    """

    def __init__(self, window: int, tree_size: int, n_kv_heads: int, head_dim: int, dtype, device):
        self.window = window
        self.ring_keys = torch.zeros(1, n_kv_heads, window, head_dim, dtype=dtype, device=device)
        self.ring_values = torch.zeros_like(self.ring_keys)
        self.ring_positions = torch.full((window,), -1, dtype=torch.long, device=device)
        self.tree_keys = torch.zeros(1, n_kv_heads, tree_size, head_dim, dtype=dtype, device=device)
        self.tree_values = torch.zeros_like(self.tree_keys)

    def write_ring(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor) -> None:
        """Store K/V `(1, n_kv_heads, n, head_dim)` of committed tokens at absolute `positions` (n,) int64.

        Only the last `window` of them are kept (older ones would be overwritten anyway).
        """
        keys, values, positions = keys[:, :, -self.window :], values[:, :, -self.window :], positions[-self.window :]
        slots = positions % self.window
        self.ring_keys[:, :, slots] = keys
        self.ring_values[:, :, slots] = values
        self.ring_positions[slots] = positions

    def nbytes(self) -> int:
        """Bytes held by all buffers."""
        tensors = (self.ring_keys, self.ring_values, self.ring_positions, self.tree_keys, self.tree_values)
        return sum(t.numel() * t.element_size() for t in tensors)


__all__ = ["LongSpecCache", "LongSpecCacheLayer", "DraftRingCache"]
