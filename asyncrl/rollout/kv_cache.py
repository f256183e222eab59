"""A DynamicCache whose full-attention layers write into preallocated buffers instead of concatenating.

transformers' ``DynamicLayer.update`` does ``torch.cat([keys, new])`` every decode step, which reallocates and copies
the whole cache per layer per token. On a CPU with a tiny model that copy (plus the page faults of the fresh
allocation) was ~70% of decode time at batch 128. The decode loop knows the final length up front (longest prefix +
largest budget), so each layer allocates ``[batch, kv_heads, capacity, head_dim]`` once and returns views of the
filled part. Layers of other kinds (sliding window, linear attention, ...) keep transformers' own implementation.

``batch_expand(index_B)`` turns a cache of U rows into one of B rows (row b a copy of row ``index_B[b]``): the decode
loop prefills each distinct prefix once and then expands the cache to every row that shares it.
"""

from __future__ import annotations

import functools

import torch
from transformers import DynamicCache, PretrainedConfig
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer


class PreallocatedLayer(DynamicLayer):
    """A full-attention cache layer with room for ``capacity`` positions (tokens); exceeding it is an error."""

    def __init__(self, capacity: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.capacity = capacity
        self.length = 0  # filled positions, tokens
        self._keys_buf: torch.Tensor | None = None
        self._values_buf: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        B, H, _, Dk = key_states.shape
        Dv = value_states.shape[-1]
        self._keys_buf = key_states.new_empty((B, H, self.capacity, Dk))
        self._values_buf = value_states.new_empty((B, H, self.capacity, Dv))
        self.length = 0

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        new_length = self.length + key_states.shape[-2]
        if new_length > self.capacity:
            raise RuntimeError(
                f"PreallocatedLayer: cache capacity {self.capacity} tokens exceeded (would hold {new_length})"
            )
        assert self._keys_buf is not None and self._values_buf is not None
        self._keys_buf[:, :, self.length : new_length] = key_states
        self._values_buf[:, :, self.length : new_length] = value_states
        self.length = new_length
        self.keys = self._keys_buf[:, :, :new_length]
        self.values = self._values_buf[:, :, :new_length]
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep only batch rows ``indices`` (one copy of the buffers, not repeated per step)."""
        if self._keys_buf is None or self._values_buf is None:
            return
        self._keys_buf = self._keys_buf[indices]
        self._values_buf = self._values_buf[indices]
        self.keys = self._keys_buf[:, :, : self.length]
        self.values = self._values_buf[:, :, : self.length]

    def batch_expand(self, index_B: torch.Tensor) -> None:
        """Make row b a copy of current row ``index_B[b]`` (repeats allowed); only the filled positions are copied."""
        if self._keys_buf is None or self._values_buf is None:
            return
        index_B = index_B.to(self._keys_buf.device)
        n = self.length
        keys_buf = self._keys_buf.new_empty((len(index_B),) + tuple(self._keys_buf.shape[1:]))
        values_buf = self._values_buf.new_empty((len(index_B),) + tuple(self._values_buf.shape[1:]))
        keys_buf[:, :, :n] = self._keys_buf[:, :, :n].index_select(0, index_B)
        values_buf[:, :, :n] = self._values_buf[:, :, :n].index_select(0, index_B)
        self._keys_buf, self._values_buf = keys_buf, values_buf
        self.keys = self._keys_buf[:, :, :n]
        self.values = self._values_buf[:, :, :n]

    def reset(self) -> None:
        self._keys_buf = self._values_buf = None
        self.length = 0
        super().reset()

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("PreallocatedLayer does not support crop (not used by the rollout decode loop)")

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeat every row ``repeats`` times, in place (rows r0, r0, ..., r1, r1, ...)."""
        if self._keys_buf is not None:
            rows = torch.arange(self._keys_buf.shape[0], device=self._keys_buf.device)
            self.batch_expand(rows.repeat_interleave(repeats))


# Layer kinds whose only per-row state is keys/values on dim 0 (exact types: subclasses may add per-row state).
_EXPANDABLE = (PreallocatedLayer, DynamicLayer, DynamicSlidingWindowLayer)


class PreallocatedCache(DynamicCache):
    """``DynamicCache(config=config)`` with every plain full-attention layer a PreallocatedLayer of ``capacity``."""

    def __init__(self, config: PretrainedConfig, capacity: int) -> None:
        super().__init__(config=config)
        self.layers = [PreallocatedLayer(capacity) if type(layer) is DynamicLayer else layer for layer in self.layers]
        if self.layer_class_to_replicate is DynamicLayer:  # configs without layer_types: layers are created lazily
            self.layer_class_to_replicate = functools.partial(PreallocatedLayer, capacity)

    @property
    def can_batch_expand(self) -> bool:
        """Whether ``batch_expand`` is supported: every layer (present, or created lazily) is of a kind that holds
        nothing per row but its keys/values (PreallocatedLayer, plain DynamicLayer or DynamicSlidingWindowLayer)."""
        lazy = self.layer_class_to_replicate
        if isinstance(lazy, functools.partial):
            lazy = lazy.func
        return (lazy is None or lazy in _EXPANDABLE) and all(type(layer) in _EXPANDABLE for layer in self.layers)

    def batch_expand(self, index_B: torch.Tensor) -> None:
        """Row b of every layer becomes a copy of current row ``index_B[b]`` (a batch of len(index_B) rows).

        Raises NotImplementedError unless ``can_batch_expand`` (a layer kind with other per-row state, e.g. linear
        attention, would silently keep the old batch there).
        """
        if not self.can_batch_expand:
            kinds = sorted({type(layer).__name__ for layer in self.layers if type(layer) not in _EXPANDABLE})
            raise NotImplementedError(f"PreallocatedCache.batch_expand: unsupported cache layer kinds {kinds}")
        for layer in self.layers:
            if isinstance(layer, PreallocatedLayer):
                layer.batch_expand(index_B)
            else:  # plain dynamic layers: keys/values [batch, heads, seq, dim], indexing copies (repeats allowed)
                layer.batch_select_indices(index_B)
