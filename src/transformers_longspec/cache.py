"""Caches of the LongSpec decode loop.

* `LongSpecCache` — the TARGET's KV cache: one buffer for all layers (grown in steps of `GROWTH_STEP` tokens as the
  output grows) and a committed-length pointer.
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
GROWTH_STEP = 1024  # the target cache starts with room for this many new tokens and grows in steps of it


def initial_capacity(prompt_len: int, max_length: int) -> int:
    """Tokens a call's target cache is first sized for: the prompt and up to `GROWTH_STEP` new tokens, at most
    `max_length` (prompt + max_new_tokens). Decoding further grows it (`LongSpecCacheLayer.update`), so memory follows
    what is generated, not max_new_tokens."""
    return min(int(max_length), int(prompt_len) + GROWTH_STEP)


def _round_up(n: int, multiple: int = _GROWTH_ROUND) -> int:
    return -(-n // multiple) * multiple


class _Storage:
    """One tensor holding every layer's K and V: (num_layers, 2, batch, n_kv_heads, capacity, head_dim).

    A single allocation lets `commit_path` move the accepted rows of all layers with two kernels instead of four per
    layer. Allocated when the first layer sees its K/V (dtype, device and head layout are known only then).
    """

    def __init__(self, num_layers: int, capacity: int):
        self.num_layers, self.capacity = num_layers, _round_up(max(int(capacity), 1))
        self.tensor: torch.Tensor | None = None
        self.dynamic_length = False  # mark the length of the layers' views dynamic for torch.compile

    def allocate(self, key_states: torch.Tensor) -> None:
        batch, heads, _, dim = key_states.shape
        self.tensor = key_states.new_zeros(self.num_layers, 2, batch, heads, self.capacity, dim)

    def grow(self, needed: int, keep: int) -> None:
        """Room for `needed` tokens, in steps of `GROWTH_STEP`; the first `keep` rows are copied over."""
        self.resize(_round_up(needed, GROWTH_STEP), keep)

    def resize(self, capacity: int, keep: int) -> None:
        """A new buffer of `capacity` tokens holding the first `keep` rows of the old one (just the size before the
        first allocation). Views of the old buffer are stale afterwards: callers refresh them (`set_length`)."""
        if self.tensor is not None:
            new = self.tensor.new_zeros(*self.tensor.shape[:4], capacity, self.tensor.shape[-1])
            new[..., :keep, :] = self.tensor[..., :keep, :]
            self.tensor = new
        self.capacity = capacity


class LongSpecCacheLayer(CacheLayerMixin):
    """One target layer's K/V: a slice of the cache's single preallocated buffer, with a length pointer.

    `keys` / `values` are views `(batch, n_kv_heads, length, head_dim)` of the buffer, so code that reads
    `layer.keys` (transformers, the draft's cross-attention) sees exactly the committed + pending rows.
    """

    is_sliding = False
    is_croppable = True

    def __init__(self, storage: _Storage, index: int):
        super().__init__()
        self.storage, self.index = storage, index
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.storage.capacity

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        if self.storage.tensor is None:
            self.storage.allocate(key_states)
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True
        self._refresh_views()

    @property
    def key_buffer(self) -> torch.Tensor:
        """(batch, n_kv_heads, capacity, head_dim): the whole preallocated K buffer of this layer."""
        return self.storage.tensor[self.index, 0]

    @property
    def value_buffer(self) -> torch.Tensor:
        """(batch, n_kv_heads, capacity, head_dim): the whole preallocated V buffer of this layer."""
        return self.storage.tensor[self.index, 1]

    def rows(self, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V views `(batch, n_kv_heads, end, head_dim)` of the buffer's first `end` rows (tokens); with
        `dynamic_length` set on the storage their length is marked dynamic, so code compiled over them serves every
        length without recompiling."""
        keys, values = self.key_buffer[:, :, :end], self.value_buffer[:, :, :end]
        if self.storage.dynamic_length:
            torch._dynamo.maybe_mark_dynamic(keys, 2)
            torch._dynamo.maybe_mark_dynamic(values, 2)
        return keys, values

    def _refresh_views(self) -> None:
        self.keys, self.values = self.rows(self.length)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Append `(batch, n_kv_heads, q_len, head_dim)` K/V after the current length; return the full views."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, n = self.length, key_states.shape[-2]
        if start + n > self.capacity:
            self.storage.grow(start + n, keep=start)
        self.key_buffer[:, :, start : start + n] = key_states
        self.value_buffer[:, :, start : start + n] = value_states
        self.length = start + n
        self._refresh_views()
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1  # grows on demand

    def set_length(self, length: int) -> None:
        """Move the length pointer to `length` tokens (rows after it are free; rows before it are kept as they are)."""
        self.length = length
        if self.is_initialized:
            self._refresh_views()

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last `-tokens_to_remove` rows (transformers 5.x negative-count semantics).

        Raises: ValueError for a positive count (the deprecated absolute-length form).
        """
        if tokens_to_remove > 0:
            raise ValueError("LongSpecCacheLayer.crop takes a negative count of tokens to remove, e.g. crop(-3)")
        self.set_length(max(0, self.length + tokens_to_remove))

    def reset(self) -> None:
        self.set_length(0)


class LongSpecCache(Cache):
    """The target's KV cache during LongSpec decoding: one preallocated buffer, in-place tree compaction.

    Args:
        num_layers: the target's decoder layer count.
        capacity: tokens to allocate per layer at first; `update` grows the buffer in steps of `GROWTH_STEP` tokens
            when a forward writes beyond it (`initial_capacity` gives what a `generate` call starts with).

    All layers live in one tensor `(num_layers, 2, batch, n_kv_heads, capacity, head_dim)` in the target's
    dtype/device, allocated on the first `update` (every supported target has the same K/V shape in all layers).
    Works as `past_key_values` for any transformers decoder (it is a `Cache`).

    Reference: transformers `Cache` (cache_utils.py); LongSpec §3.4 (KV of the accepted path is kept).
    """

    def __init__(self, num_layers: int, capacity: int):
        self.storage = _Storage(num_layers, capacity)
        super().__init__(layers=[LongSpecCacheLayer(self.storage, i) for i in range(num_layers)])

    @torch.compiler.disable
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """`Cache.update`, kept out of `torch.compile` graphs: it moves a Python length pointer, so leaving it out
        lets one compiled decoder layer serve every committed length (`static_step.py` compiles the layers)."""
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    @property
    def committed_length(self) -> int:
        """Tokens whose K/V are committed in every layer."""
        return self.layers[0].length

    def set_length(self, length: int) -> None:
        """Set every layer's length pointer (the next `update` writes at row `length`)."""
        for layer in self.layers:
            layer.set_length(length)

    def commit_path(self, committed: int, path: torch.Tensor, tree_start: int | None = None) -> None:
        """Keep the accepted tree rows at `committed ...` (in path order) in every layer; drop every row after them.

        Args:
            committed: rows before the tree's root (tokens).
            path: (n_accepted,) int64, tree-local indices of the accepted nodes, root first, increasing.
            tree_start: row of tree node 0 (default `committed`: the tree was appended right after the prefix).
        """
        start = committed if tree_start is None else tree_start
        n = path.numel()
        buffer = self.storage.tensor
        rows = buffer.index_select(4, path + start)  # gather first: sources and targets may overlap
        buffer[..., committed : committed + n, :] = rows
        self.set_length(committed + n)

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

    def store_tokens(self, draft, tokens: torch.Tensor, positions: torch.Tensor) -> None:
        """Compute the draft's self-attention K/V of committed `tokens` (n,) int64 at absolute `positions` (n,) int64
        and store them (`write_ring`). A one-layer draft's K/V depend only on (token, position): no attention runs,
        and storing a position again writes the same values."""
        keys, values = draft.self_kv(tokens[None], positions[None])
        self.write_ring(keys, values, positions)

    def nbytes(self) -> int:
        """Bytes held by all buffers."""
        tensors = (self.ring_keys, self.ring_values, self.ring_positions, self.tree_keys, self.tree_values)
        return sum(t.numel() * t.element_size() for t in tensors)


__all__ = ["LongSpecCache", "LongSpecCacheLayer", "DraftRingCache", "initial_capacity", "GROWTH_STEP"]
