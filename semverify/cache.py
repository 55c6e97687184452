"""KV-cache creation and rollback through the transformers Cache API (no modeling forks)."""

from __future__ import annotations

from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import Cache


class UnsupportedCacheError(ValueError):
    """The model's cache cannot be rolled back (sliding-window, recurrent or linear layers)."""


def new_cache(model: PreTrainedModel, role: str = "model") -> DynamicCache:
    """An empty DynamicCache for ``model``, refused early when it cannot be cropped."""
    cache = DynamicCache(config=model.config)
    cache.activate_past_recording()  # sliding-window layers keep what a rollback needs
    if not cache.is_croppable:
        raise UnsupportedCacheError(
            f"the {role}'s cache ({type(model).__name__}) cannot be cropped (sliding-window or recurrent "
            "layers), so rejected draft tokens could not be rolled back; speculative decoding needs a "
            "model with full attention caches"
        )
    return cache


def keep_first(cache: Cache, length: int) -> None:
    """Roll ``cache`` back so it holds exactly its first ``length`` tokens.

    transformers 5 takes ``crop(-n)`` to drop n tokens (``crop(0)`` keeps all), so the count is
    computed here once instead of at every call site.
    """
    current = cache.get_seq_length()
    if not 0 <= length <= current:
        raise ValueError(f"cannot keep {length} tokens of a cache holding {current}")
    if length < current:
        cache.crop(length - current)
