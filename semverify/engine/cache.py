"""KV-cache creation and rollback through the transformers Cache API (no modeling forks)."""

from __future__ import annotations

from typing import NamedTuple

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import Cache

from .architectures import (
    Layout,
    UnsupportedArchitectureError,
    UnsupportedCacheError,
    check_batch,
    check_supported,
    layout,
)
from .tree import rows_tree_allowed, rows_tree_positions

__all__ = ["RowCache", "RowSubset", "UnsupportedArchitectureError", "UnsupportedCacheError", "keep_first",
           "new_cache"]


PACK_SLACK = 0.1  # a batched cache packs once it is this much wider than its longest row's tokens


def new_cache(model: PreTrainedModel, role: str = "model") -> DynamicCache:
    """An empty DynamicCache for ``model`` with a full cache layer (`DynamicLayer`) for every attention layer,
    sliding-window and chunked ones included; a model the loop cannot serve (recurrent, linear or compressed
    layers, see `semverify.engine.architectures`) is refused here, before decoding, with the reason.

    transformers' ``DynamicCache(config=...)`` gives a sliding layer a `DynamicSlidingWindowLayer`, which drops
    keys by column count: with holes (a batch's rejected tokens) it would drop keys still inside a row's window,
    and its width differs from the full layers', so rows could not be packed nor tree paths moved. A full layer
    keeps them all and the window is applied by the mask instead (see `RowCache.inputs`). Memory: a sliding
    layer then holds the whole context, as a full layer does, not just its window (bounding it is later work).
    """
    check_supported(model, role)
    cache = DynamicCache()  # full layers, created as the forward reaches them
    if not cache.is_croppable:
        raise UnsupportedCacheError(
            f"the {role}'s cache ({type(model).__name__}) cannot be cropped, so rejected draft tokens could not "
            "be rolled back; speculative decoding needs a model with croppable attention caches"
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


class RowParts(NamedTuple):
    """Everything a `RowCache` holds: the model's cache and the bookkeeping beside it."""

    cache: DynamicCache
    device: torch.device
    layout: Layout
    valid: torch.BoolTensor  # [B, length] which cached columns are each row's real tokens
    next_position: torch.LongTensor  # [B] the position of each row's next token


class RowCache:
    """A model's KV cache over a batch of rows that keep different numbers of their tokens.

    Every column has a per-row validity: a token one row rejects stays in the cache as a masked hole
    (another row may have kept its token there). Columns no row keeps are cropped from the end, and
    when the cache grows wider than its longest row's tokens by more than `PACK_SLACK` (10%), each row's tokens
    are packed to the right, so the cache holds at most 1.1x the live tokens plus the step's new columns. A pack
    gathers every layer once; it comes about every slack x width / holes-per-step steps, so its cost per step
    stays about constant as the context grows.
    Positions are per row (a row's real tokens are at 0, 1, 2, ... in column order), so packing never
    changes what a token attends to. With one row the rejected tokens are always the last ones: rollback
    is plain cropping, and no mask is ever passed to a chain's forward.

    Every layer keeps a full cache (`new_cache`), sliding-window ones too. Where a row has holes or padding
    and some layer sees only a window, or for a token tree, the forward gets masks built here, on the device,
    from each row's real columns and positions, one per layer type (`semverify.engine.architectures.Layout`);
    otherwise transformers builds them, from the 2-D mask where a column is masked.
    """

    def __init__(self, model: PreTrainedModel | None, batch_size: int, role: str = "model", *,
                 parts: RowParts | None = None) -> None:
        """An empty cache of ``batch_size`` rows for ``model``, or one made of ``parts`` (see `copy_rows`): every
        field is set here from one `RowParts`, so a field added there cannot be missing from copies."""
        if parts is None:
            cache, model_layout = new_cache(model, role), layout(model)
            check_batch(model_layout, batch_size, role)
            parts = RowParts(cache, model.device, model_layout,
                             torch.zeros(batch_size, 0, dtype=torch.bool, device=model.device),
                             torch.zeros(batch_size, dtype=torch.long, device=model.device))
        self.cache, self.device, self.layout, self.valid, self.next_position = parts  # bookkeeping beside the cache

    @property
    def length(self) -> int:
        return self.valid.shape[1]

    def positions(self) -> torch.LongTensor:
        """[B, length] each cached column's position in its row (holes: that of the real token before them)."""
        return (self.valid.long().cumsum(-1) - 1).clamp_min(0)

    def inputs(self, tokens: torch.LongTensor, token_valid: torch.BoolTensor | None = None,
               parents: torch.LongTensor | None = None) -> dict:
        """Forward arguments for new columns ``tokens`` [B, W] (``token_valid``: which of them are real): the ids,
        the cache, and, when any column is masked, the mask and per-row positions. ``parents`` [B, n]: the last n
        columns are each row's token tree (`semverify.engine.tree`), the columns before them uncached context whose
        last real one is the root; every node is then masked and placed as if its branch were alone."""
        tokens = tokens.to(self.device)
        token_valid = torch.ones_like(tokens, dtype=torch.bool) if token_valid is None else token_valid.to(self.device)
        inputs = {"input_ids": tokens, "cache": self.cache, "use_cache": True}
        if parents is not None:
            width = tokens.shape[1] - parents.shape[1]
            positions = rows_tree_positions(parents, self.next_position, token_valid[:, :width]).to(self.device)
            allowed = rows_tree_allowed(parents, self.valid, token_valid[:, :width], self.device)
        elif bool(self.valid.all()) and bool(token_valid.all()):
            return inputs  # nothing masked: transformers' own causal and window masks are right
        else:
            positions = self.next_position[:, None] + (token_valid.long().cumsum(-1) - 1).clamp_min(0)
            if not self.layout.windowed:  # holes and padding only mask columns: transformers' 2-D mask path
                inputs["attention_mask"] = torch.cat([self.valid, token_valid], dim=1).long()
                inputs["position_ids"] = positions
                return inputs
            allowed = self.chain_allowed(token_valid)
        inputs["attention_mask"] = self.layout.masks(allowed, positions, torch.cat([self.positions(), positions], 1))
        inputs["position_ids"] = positions
        return inputs

    def chain_allowed(self, token_valid: torch.BoolTensor) -> torch.BoolTensor:
        """[B, W, length + W] which keys each new column may see: the row's real cached columns and its real new
        columns up to itself (each column sees itself, so padding never leaves a query with nothing to see)."""
        width = token_valid.shape[1]
        causal = torch.ones(width, width, dtype=torch.bool, device=self.device).tril()
        new = (causal[None] & token_valid[:, None, :]) | torch.eye(width, dtype=torch.bool, device=self.device)
        return torch.cat([self.valid[:, None, :].expand(-1, width, -1), new], dim=2)

    def extend(self, token_valid: torch.BoolTensor) -> None:
        """Record the columns a forward just added to the cache (``token_valid`` [B, W]: which are real)."""
        token_valid = token_valid.to(self.device)
        self.valid = torch.cat([self.valid, token_valid], dim=1)
        self.next_position += token_valid.sum(-1)

    def keep(self, kept: torch.BoolTensor) -> None:
        """Of the last ``kept.shape[1]`` columns, keep in each row those ``kept`` marks (and that were
        valid); the others become holes. Then crop and pack."""
        width, valid = kept.shape[1], self.valid.clone()
        valid[:, self.length - width :] &= kept.to(self.device)
        self._hold(valid)

    def keep_counts(self, counts: list[int]) -> None:
        """Keep each row's first ``counts[b]`` tokens (in column order); its later tokens become holes."""
        counts = torch.tensor(counts, device=self.device)
        self._hold(self.valid & (self.valid.long().cumsum(-1) <= counts[:, None]))

    def _hold(self, valid: torch.BoolTensor) -> None:
        """Hold only the tokens ``valid`` [B, length] marks (a subset of those held), then crop and pack."""
        self.next_position -= (self.valid & ~valid).sum(-1)
        self.valid = valid
        used = self.valid.any(0).nonzero()
        keep_first(self.cache, int(used[-1]) + 1 if len(used) else 0)
        self.valid = self.valid[:, : self.cache.get_seq_length()]
        if self.valid.shape[0] > 1 and self.length > (1 + PACK_SLACK) * int(self.valid.sum(-1).max()):
            self.pack()

    def pack(self) -> None:
        """Move each row's valid columns to the right end, holes to the left; drop all-hole columns."""
        count = self.valid.sum(-1)
        width = int(count.max()) if len(count) else 0
        # where each row's tokens go
        slot = torch.arange(width, device=self.device)[None, :] >= (width - count)[:, None]
        # gather index: for every target slot, the source column (holes take column 0, masked anyway)
        order = torch.argsort((~self.valid).long(), dim=1, stable=True)[:, :width]  # valid columns first, in order
        source = torch.zeros(len(count), width, dtype=torch.long, device=self.device)
        source[slot] = order[torch.arange(width, device=self.device)[None, :] < count[:, None]]
        for layer in self.cache.layers:
            if layer.keys is None or not layer.keys.numel():
                continue
            index = source[:, None, :, None].to(layer.keys.device)
            layer.keys = layer.keys.gather(2, index.expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3]))
            layer.values = layer.values.gather(2, index.expand(-1, layer.values.shape[1], -1, layer.values.shape[3]))
        self.valid = slot

    def copy_rows(self, rows: list[int]) -> RowCache:
        """A RowCache holding a copy of ``rows`` only, for forwards that the other rows sit out."""
        index = torch.tensor(rows, dtype=torch.long, device=self.device)
        cache = DynamicCache([(None, None) if not layer.is_initialized else  # nothing cached yet
                              (layer.keys[index.to(layer.keys.device)], layer.values[index.to(layer.keys.device)])
                              for layer in self.cache.layers])
        return RowCache(None, len(rows), parts=RowParts(cache, self.device, self.layout, self.valid[index],
                                                        self.next_position[index]))

    def last_columns(self, width: int, rows: list[int] | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, the keys and values [len(rows), heads, width, head_dim] of the last ``width`` columns (of
        ``rows``, or every row)."""
        rows = range(len(self.valid)) if rows is None else rows
        picked = []
        for layer in self.cache.layers:
            index = torch.tensor(rows, dtype=torch.long, device=layer.keys.device)
            picked.append((layer.keys[index, :, layer.keys.shape[2] - width :],
                           layer.values[index, :, layer.values.shape[2] - width :]))
        return picked

    def append_columns(self, pieces: list[tuple[list[int], list[tuple[torch.Tensor, torch.Tensor]]]],
                       token_valid: torch.BoolTensor) -> None:
        """Add ``token_valid.shape[1]`` columns whose keys and values come from forwards on copies of some rows
        (``pieces``: rows, and per layer their new columns, as many as those forwards fed, at most that width);
        the rest are holes (masked by ``token_valid``)."""
        width = token_valid.shape[1]
        for i in range(len(pieces[0][1])):
            some_keys, some_values = pieces[0][1][i]
            keys = some_keys.new_zeros(len(self.valid), some_keys.shape[1], width, some_keys.shape[3])
            values = some_values.new_zeros(len(self.valid), some_values.shape[1], width, some_values.shape[3])
            for rows, new in pieces:
                index = torch.tensor(rows, dtype=torch.long, device=keys.device)
                keys[index, :, : new[i][0].shape[2]], values[index, :, : new[i][1].shape[2]] = new[i]
            self.cache.update(keys, values, i)
        self.extend(token_valid)

    def select(self, rows: torch.LongTensor) -> None:
        """Keep only the rows at indices ``rows`` [B'], in that order (finished rows stop costing work)."""
        rows = rows.to(self.device)
        self.cache.batch_select_indices(rows)
        self.valid, self.next_position = self.valid[rows], self.next_position[rows]
        if len(rows) and not bool(self.valid[:, 0].any()):
            self.pack()


class RowSubset:
    """Forwards for a shrinking subset of a `RowCache`'s rows, one column at a time, so rows that wait cost no
    compute (a batched CPU forward costs about its number of rows). Narrowing copies the kept rows' cache;
    `close` appends the columns fed since the first narrowing to the full cache, as holes where a row was not fed."""

    def __init__(self, full: RowCache) -> None:
        self.full, self.part, self.batch = full, full, full.valid.shape[0]
        self.rows = list(range(self.batch))  # rows of the full batch that `part` holds, in order
        self.columns: list[torch.BoolTensor] = []  # per forward since the first narrowing: rows fed, [B, 1]
        self.left: list[tuple[list[int], list[tuple[torch.Tensor, torch.Tensor]]]] = []  # columns of rows gone

    def keep(self, rows: list[int]) -> None:
        """Feed only ``rows`` (of those kept so far) from now on."""
        gone = [i for i, r in enumerate(self.rows) if r not in rows]
        if gone and self.columns:
            self.left.append(([self.rows[i] for i in gone], self.part.last_columns(len(self.columns), gone)))
        self.part, self.rows = self.part.copy_rows([self.rows.index(r) for r in rows]), list(rows)

    def inputs(self, tokens: torch.LongTensor, token_valid: torch.BoolTensor) -> dict:
        """`RowCache.inputs` for the kept rows of the full-batch column ``tokens`` [B, 1] (``token_valid`` [B, 1])."""
        index = self._index(tokens.device)
        return self.part.inputs(tokens[index], token_valid[index])

    def extend(self, token_valid: torch.BoolTensor) -> None:
        """Record a forward's full-batch column (``token_valid`` [B, 1])."""
        self.part.extend(token_valid[self._index(token_valid.device)])
        self.columns.append(token_valid)

    def spread(self, x: torch.Tensor) -> torch.Tensor:
        """A forward's output ``x`` [len(rows), ...] for the kept rows, as a full batch [B, ...] (zeros in the other
        rows)."""
        full = x.new_zeros(self.batch, *x.shape[1:])
        full[self._index(x.device)] = x
        return full

    def close(self) -> None:
        """Append the columns fed since the first narrowing to the full cache."""
        if self.columns:  # (columns are only fed after a narrowing)
            last = (self.rows, self.part.last_columns(len(self.columns)))
            self.full.append_columns([*self.left, last], torch.cat(self.columns, dim=1))

    def _index(self, device: torch.device) -> torch.LongTensor:
        """[len(rows)] the kept rows' indices in the full batch, on ``device``."""
        return torch.tensor(self.rows, dtype=torch.long, device=device)
