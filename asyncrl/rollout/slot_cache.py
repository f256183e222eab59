"""The continuous decoder's KV cache: rows enter and leave slots while one write column serves them all.

Every full-attention layer holds ``[slots, kv_heads, columns, head_dim]`` keys and values and one write column ``p``
(the layer's ``length``) shared by all slots. A live slot's keys are right-aligned ending at ``p`` (a left-padded
batch's layout), so a slot of ``n`` keys attends to columns ``[p - n, p]`` in a decode step, which writes every slot's
new key at ``p``; an entering row's prefilled keys are copied into its slot ending at ``p`` (``write_prefill``).
Columns left of a slot's window are always masked out but must be finite (a NaN of uninitialised memory would survive
the masked softmax as 0 * NaN): the buffers are zero-filled.

Why one shared write column rather than a write pointer per slot: transformers' attention writes a step's keys
through ``Cache.update`` at one sequence position for the whole batch and derives the mask size and query offset
from ``get_seq_length``; a shared column keeps that contract (``length == p``) with the stock attention kernels.
The price is dead columns left of the longest live row, which the attention reads every step; ``relayout`` moves
the live window ``[p - w, p)`` to end elsewhere.

A sliding-window layer keeps the same columns: right alignment makes a column's distance from ``p`` its token
distance, so transformers' sliding mask (the layer's ``is_sliding`` and the shared column) is every slot's window; its
prefill holds the last ``sliding_window - 1`` keys, copied right-aligned like the others. A linear-attention (or
other) layer keeps per-row state that a slot copy would have to move: ``unsupported_layer_kinds`` names such layers
so the engine refuses them up front.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PretrainedConfig
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

SUPPORTED = (DynamicLayer, DynamicSlidingWindowLayer)  # exact types: a subclass may keep more per row


def unsupported_layer_kinds(config: PretrainedConfig) -> list[str]:
    """The cache layer kinds of ``config`` other than full attention and sliding window (empty: supported)."""
    cache = DynamicCache(config=config)
    return sorted({type(layer).__name__ for layer in cache.layers if type(layer) not in SUPPORTED})


class SlotLayer(DynamicLayer):
    """One attention layer's slot buffers; ``length`` is the shared write column ``p`` (tokens); ``sliding``: a
    sliding-window layer (its mask is the window up to ``p``)."""

    def __init__(self, sliding: bool = False) -> None:
        super().__init__()
        self.is_sliding = sliding
        self.length = 0
        self.keys_buf: torch.Tensor | None = None  # [slots, kv_heads, columns, head_dim]
        self.values_buf: torch.Tensor | None = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the first ``key_states.shape[0]`` slots' new keys at columns ``[p, p + q)``; return their keys."""
        if self.keys_buf is None or self.values_buf is None:
            raise RuntimeError("SlotLayer: no buffers (the decoder allocates them when the first rows enter)")
        n, end = key_states.shape[0], self.length + key_states.shape[-2]
        if end > self.keys_buf.shape[-2] or n > self.keys_buf.shape[0]:
            raise RuntimeError(
                f"SlotLayer: {n} slots x {end} columns exceed the buffers' {tuple(self.keys_buf.shape[::2])}"
            )
        self.keys_buf[:n, :, self.length : end] = key_states
        self.values_buf[:n, :, self.length : end] = value_states
        self.length = end
        self.keys = self.keys_buf[:n, :, :end]
        self.values = self.values_buf[:n, :, :end]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("SlotLayer does not support crop (not used by the continuous decoder)")


class SlotCache(DynamicCache):
    """A cache of ``SlotLayer``s for a model of full-attention and sliding-window layers (else NotImplementedError)."""

    def __init__(self, config: PretrainedConfig) -> None:
        kinds = unsupported_layer_kinds(config)
        if kinds:
            raise NotImplementedError(f"SlotCache: full-attention and sliding-window layers only, not {kinds}")
        super().__init__(config=config)
        if self.layers:
            self.layers = [SlotLayer(type(layer) is DynamicSlidingWindowLayer) for layer in self.layers]
        else:  # a config without layer_types: every layer full attention, created lazily by transformers
            self.layers = [SlotLayer() for _ in range(config.get_text_config(decoder=True).num_hidden_layers)]
        self.layer_class_to_replicate = None
        self.slot_layers: list[SlotLayer] = list(self.layers)

    @property
    def p(self) -> int:
        """The shared write column (tokens): every live slot's keys end just left of it."""
        return self.slot_layers[0].length

    @property
    def rows(self) -> int:
        """Slots allocated (0 before the first rows enter)."""
        buf = self.slot_layers[0].keys_buf
        return 0 if buf is None else buf.shape[0]

    @property
    def columns(self) -> int:
        """Columns allocated (tokens)."""
        buf = self.slot_layers[0].keys_buf
        return 0 if buf is None else buf.shape[2]

    def relayout(
        self, used: int, width: int, new_p: int, rows: int, columns: int, like: DynamicCache | None = None
    ) -> None:
        """Move the live window ``[p - width, p)`` of slots ``[0, used)`` to ``[new_p - width, new_p)``, in buffers of
        at least ``rows`` slots x ``columns`` columns (reallocated zero-filled when smaller, shaped after ``like``'s
        layers the first time); then ``p = new_p``."""
        p = self.p
        if not (width <= p and width <= new_p <= columns):
            raise ValueError(f"SlotCache.relayout: window {width} from p={p} to p={new_p} in {columns} columns")
        for i, layer in enumerate(self.slot_layers):
            old_k, old_v = layer.keys_buf, layer.values_buf
            if old_k is None or old_v is None or old_k.shape[0] < rows or old_k.shape[2] < columns:
                if old_k is None or old_v is None:
                    if like is None:
                        raise RuntimeError("SlotCache.relayout: first allocation needs a filled cache to shape after")
                    old_k, old_v = like.layers[i].keys, like.layers[i].values
                    used = width = 0
                H, Dk, Dv = old_k.shape[1], old_k.shape[3], old_v.shape[3]
                layer.keys_buf = old_k.new_zeros((rows, H, columns, Dk))
                layer.values_buf = old_v.new_zeros((rows, H, columns, Dv))
                if used and width:
                    layer.keys_buf[:used, :, new_p - width : new_p] = old_k[:used, :, p - width : p]
                    layer.values_buf[:used, :, new_p - width : new_p] = old_v[:used, :, p - width : p]
            elif new_p != p and used and width:  # overlapping ranges: copy through a temporary
                old_k[:used, :, new_p - width : new_p] = old_k[:used, :, p - width : p].clone()
                old_v[:used, :, new_p - width : new_p] = old_v[:used, :, p - width : p].clone()
            layer.length = new_p
            layer.is_initialized = True

    def gather_slots(self, index_k: torch.Tensor, width: int) -> None:
        """Slot ``j`` becomes a copy of slot ``index_k[j]`` for ``j < len(index_k)`` (the live window only)."""
        p = self.p
        for layer in self.slot_layers:
            assert layer.keys_buf is not None and layer.values_buf is not None
            idx = index_k.to(layer.keys_buf.device)
            k = len(idx)
            layer.keys_buf[:k, :, p - width : p] = layer.keys_buf[idx, :, p - width : p]
            layer.values_buf[:k, :, p - width : p] = layer.values_buf[idx, :, p - width : p]

    def write_prefill(self, slots_R: torch.Tensor, prefilled: DynamicCache, index_R: torch.Tensor) -> None:
        """Copy row ``index_R[r]`` of a left-padded prefill cache (all its W columns of a layer: the last
        ``sliding_window - 1`` of a sliding one) into slot ``slots_R[r]``'s columns ``[p - W, p)``: right-aligned at
        ``p`` like every live slot (its pad columns masked out)."""
        p = self.p
        for layer, src in zip(self.slot_layers, prefilled.layers):
            assert layer.keys_buf is not None and layer.values_buf is not None
            W = src.keys.shape[-2]
            slots = slots_R.to(layer.keys_buf.device)
            index = index_R.to(src.keys.device)
            layer.keys_buf[slots, :, p - W : p] = src.keys.index_select(0, index)
            layer.values_buf[slots, :, p - W : p] = src.values.index_select(0, index)

    def reset_window(self) -> None:
        """No live slot: ``p`` back to 0 (the buffers stay)."""
        for layer in self.slot_layers:
            layer.length = 0
