"""Which models the loop can serve, and how each one's attention layers see the past.

The loop rolls caches back token by token, leaves a row's rejected tokens as masked holes and verifies token
trees, so every attention layer keeps a full (never dropping) cache and, where transformers' own masks would be
wrong, gets a 4-D mask built here from each row's real columns and token positions. A sliding-window layer
sees a key iff ``0 <= q_pos - k_pos < window`` (transformers' ``sliding_window_overlay``: ``kv > q - window``),
a chunked layer iff both sit in the same chunk of positions, a full layer every earlier real key. Positions,
not cache columns, decide: a hole or a pad column never takes a window slot.

Refused before decoding, with the reason: models whose forward takes no transformers ``cache=`` (recurrent or
state-space models such as Mamba, RWKV, xLSTM, RecurrentGemma), and caches with layers that cannot be rolled
back or reordered token by token (linear attention and conv states, hybrid linear layers, sparse indexed or
compressed attention caches, layers sharing another layer's cache).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from functools import lru_cache

import torch
from transformers import PreTrainedModel
from transformers.cache_utils import get_layer_types_and_kwargs


class UnsupportedCacheError(ValueError):
    """The model's cache cannot be rolled back (recurrent, linear or compressed layers)."""


class UnsupportedArchitectureError(UnsupportedCacheError):
    """The loop cannot serve this architecture; the message names it and says why."""


# layer types whose keys and values are kept per token, so a full cache rolls back and reorders them
ATTENTION_TYPES = ("full_attention", "sliding_attention", "chunked_attention")
WHY_NOT = {
    "linear_attention": "linear-attention / state-space layers keep a recurrent state, which cannot be rolled back "
                        "to an earlier token",
    "conv": "convolution layers keep a rolling state, which cannot be rolled back to an earlier token",
    "hybrid": "hybrid linear-attention layers keep a recurrent state, which cannot be rolled back to an earlier token",
    "hybrid_sliding": "hybrid linear-attention layers keep a recurrent state, which cannot be rolled back to an "
                      "earlier token",
    "indexed_attention": "sparse attention keeps an indexer cache beside its keys, which the loop does not roll back",
    "dummy": "some layers share another layer's cache or keep none, which the loop does not roll back",
}
FULL_ONLY_IMPLEMENTATIONS = ("flash", "flex", "paged", "kernels")  # attention kernels that take no 4-D mask


@dataclass(frozen=True)
class Window:
    """How far back one kind of attention layer sees: ``kind`` "full", "sliding" (the last ``size`` positions,
    the query's own included) or "chunked" (positions in the query's chunk of ``size``)."""

    kind: str = "full"
    size: int | None = None

    def allows(self, query_positions: torch.LongTensor, key_positions: torch.LongTensor) -> torch.BoolTensor | None:
        """[B, Q, K] which keys the window leaves to each query (None: all of them)."""
        if self.kind == "sliding":
            return (query_positions[:, :, None] - key_positions[:, None, :]) < self.size
        if self.kind == "chunked":
            return (query_positions[:, :, None] // self.size) == (key_positions[:, None, :] // self.size)
        return None


@dataclass(frozen=True)
class Layout:
    """A model's attention layers: each layer type's `Window`, whether its forward takes one mask per layer type
    (``{"full_attention": ..., "sliding_attention": ...}``) and which attention kernel formats the mask."""

    model_type: str
    windows: dict[str, Window]
    takes_mapping: bool
    implementation: str
    dtype: torch.dtype
    positions: str = "ids"  # how the forward places tokens: "ids" (position_ids), "mask" (from the 2-D mask's
    # cumsum: BLOOM's ALiBi) or "columns" (from cache columns: MPT's ALiBi; a batch's holes would shift them)

    @property
    def windowed(self) -> bool:
        """Whether some layer sees less than every earlier token (transformers' masks, built from cache columns,
        are then wrong once a row has holes or padding)."""
        return any(w.kind != "full" for w in self.windows.values())

    def masks(self, allowed: torch.BoolTensor, query_positions: torch.LongTensor,
              key_positions: torch.LongTensor) -> torch.Tensor | dict[str, torch.Tensor]:
        """The ``attention_mask`` of a forward whose queries [B, Q] may see the keys [B, K] that ``allowed``
        [B, Q, K] marks (real, causal, a tree's ancestors), further limited by each layer type's window over
        ``query_positions`` and ``key_positions``: one 4-D mask when every layer sees alike, else one per type."""
        if self.positions != "ids":
            raise UnsupportedArchitectureError(
                f"{self.model_type}: its forward takes no position_ids (it places tokens from the 2-D attention mask "
                "or by cache column), so token trees and windows over a batch with holes cannot be placed; use chain "
                "drafts")
        if any(self.implementation.startswith(k) for k in FULL_ONLY_IMPLEMENTATIONS):
            raise UnsupportedArchitectureError(
                f"{self.model_type}: attn_implementation {self.implementation!r} takes no custom 4-D mask, which "
                "batches with holes and token trees need here; load the model with attn_implementation='sdpa' "
                "or 'eager'")
        by_window: dict[Window, torch.Tensor] = {}
        for window in set(self.windows.values()):
            limit = window.allows(query_positions, key_positions)
            by_window[window] = self._format(allowed if limit is None else allowed & limit)
        if len(by_window) == 1:
            return next(iter(by_window.values()))
        if not self.takes_mapping:
            raise UnsupportedArchitectureError(
                f"{self.model_type}: its layers see different windows, but its forward takes one attention mask for "
                "all of them, so a batch with holes or a token tree cannot be masked per layer; decode one row "
                "with chain drafts")
        return {kind: by_window[window] for kind, window in self.windows.items()}

    def _format(self, allowed: torch.BoolTensor) -> torch.Tensor:
        """[B, 1, Q, K] as the kernel takes it: booleans for SDPA, else additive (0 sees, dtype min blocks)."""
        allowed = allowed[:, None]
        if self.implementation == "sdpa":
            return allowed
        return torch.zeros(allowed.shape, dtype=self.dtype, device=allowed.device).masked_fill(
            ~allowed, torch.finfo(self.dtype).min)


def layer_types(config) -> tuple[list[str], list[dict]]:
    """Each decoder layer's cache type and its arguments, as ``DynamicCache(config=...)`` would build them."""
    return get_layer_types_and_kwargs(config.get_text_config(decoder=True))


def unsupported_reason(model: PreTrainedModel) -> str | None:
    """Why the loop cannot serve ``model`` (None when it can)."""
    params = inspect.signature(_unwrapped(model).forward).parameters
    if "cache" not in params:
        recurrent = [p for p in ("cache_params", "state", "mems") if p in params]
        return ("its forward takes no transformers cache (`cache=`)"
                + (f" but a recurrent state (`{recurrent[0]}=`)" if recurrent else "")
                + ", so rejected draft tokens could not be rolled back")
    try:
        types, kwargs = layer_types(model.config)
    except Exception as error:  # noqa: BLE001  (a config transformers cannot lay out as cache layers)
        return f"transformers cannot lay out its cache layers ({type(error).__name__}: {error})"
    odd = sorted({t for t in types if t not in ATTENTION_TYPES})
    if odd:
        where = ", ".join(f"{t} (layers {', '.join(str(i) for i, x in enumerate(types) if x == t)})" for t in odd)
        why = "; ".join(WHY_NOT.get(t, f"{t} layers have a cache the loop does not roll back") for t in odd)
        return f"it has {where}: {why}"
    if any(t != "full_attention" for t in types) and not masks_windows(type(_unwrapped(model))):
        return ("its sliding window is not in its attention masks (only transformers' dropping cache applies it), "
                "so with the full caches the loop needs it would see past the window")
    if "local" in str(getattr(model.config, "attention_layers", "")):
        return ("its local attention layers apply their window inside the model by cache column, which a batch's "
                "holes and token trees would shift")
    for kind in ("sliding_attention", "chunked_attention"):
        sizes = {kw.get("sliding_window") for t, kw in zip(types, kwargs) if t == kind}
        if len(sizes) > 1:
            return f"its {kind} layers have different windows ({sorted(sizes)}), which one mask per type cannot hold"
        if None in sizes:
            return f"its {kind} layers have no window size"
    return None


def check_supported(model: PreTrainedModel, role: str = "model") -> None:
    """Refuse, before decoding, a model the loop cannot serve, naming its architecture and why."""
    reason = unsupported_reason(model)
    if reason is not None:
        raise UnsupportedArchitectureError(
            f"the {role} ({getattr(model.config, 'model_type', '?')}, {type(model).__name__}) cannot be used for "
            f"speculative decoding: {reason}")


def layout(model: PreTrainedModel) -> Layout:
    """``model``'s `Layout` (call `check_supported` first)."""
    types, kwargs = layer_types(model.config)
    windows = {}
    for t, kw in zip(types, kwargs):
        kind = t.removesuffix("_attention")
        windows[t] = Window() if kind == "full" else Window(kind, int(kw["sliding_window"]))
    inner = _unwrapped(model)
    positions = ("ids" if "position_ids" in inspect.signature(inner.forward).parameters
                 else "mask" if "build_alibi_tensor(attention_mask" in _module_source(type(inner)) else "columns")
    return Layout(str(getattr(model.config, "model_type", "?")), windows, takes_mask_mapping(type(inner)),
                  str(model.config._attn_implementation), model.dtype, positions)


def check_batch(layout_: Layout, batch_size: int, role: str = "model") -> None:
    """Refuse a batch of several rows for a model that places tokens by cache column: the holes a batch's rows
    leave (rejected tokens, uneven drafts) would shift every later token's position."""
    if batch_size > 1 and layout_.positions == "columns":
        raise UnsupportedArchitectureError(
            f"the {role} ({layout_.model_type}) takes no position_ids and places tokens by cache column (ALiBi), so "
            "the holes of a batch's rejected tokens would shift its positions; decode one row at a time")


def takes_mask_mapping(model_class: type) -> bool:
    """Whether the model's forward takes ``attention_mask`` as one mask per layer type (transformers 5 models
    with hybrid layers: ``if not isinstance(causal_mask_mapping := attention_mask, dict)``)."""
    return "causal_mask_mapping := attention_mask, dict" in _module_source(model_class)


def masks_windows(model_class: type) -> bool:
    """Whether the model builds sliding-window or chunked masks (transformers' mask functions for them)."""
    source = _module_source(model_class)
    return any(name in source for name in ("create_sliding_window_causal_mask", "create_chunked_causal_mask",
                                           "sliding_window_overlay", "create_masks_for_generate"))


def _unwrapped(model: PreTrainedModel) -> PreTrainedModel:
    """The transformers model inside a wrapper that forwards ``**kwargs`` (PEFT's ``get_base_model``)."""
    base = getattr(model, "get_base_model", None)
    return base() if callable(base) else model


@lru_cache(maxsize=None)
def _module_source(model_class: type) -> str:
    try:
        return inspect.getsource(inspect.getmodule(model_class))
    except (OSError, TypeError):
        return ""
