"""A batch's verification split by draft length: on a CPU a forward costs about its token positions, so a row
with a short draft should not be padded to the longest row's draft (step drafts range from 2 to 128 tokens)."""

from __future__ import annotations

from typing import NamedTuple

import torch
from transformers import PreTrainedModel

from .cache import RowCache

# A forward's fixed cost (reading the weights, copying its rows' cache) in token positions of compute: a split
# must save more padded positions than this per extra forward.
FORWARD_OVERHEAD = 32


def width_groups(lengths: list[int], unseen: int, overhead: int | None = None,
                 most: int = 4) -> list[list[int]] | None:
    """Rows (by index) in up to ``most`` groups of similar draft ``lengths``, each verified in its own forward of
    ``unseen`` + its longest draft columns, when that costs fewer positions (each forward charged ``overhead``,
    by default `FORWARD_OVERHEAD`) than one forward at the longest draft; None when one forward is cheapest."""
    overhead = FORWARD_OVERHEAD if overhead is None else overhead
    if len(set(lengths)) < 2:  # nothing to save (and the search below is quadratic in the rows)
        return None
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    sizes = [lengths[r] for r in order]
    n = len(order)
    # best[g][j]: the cheapest cover of the j shortest rows by g groups, with where its last group starts
    best = [[(0, 0)] + [(float("inf"), 0)] * n]
    for g in range(1, min(most, n) + 1):
        row = [(float("inf"), 0)] * (n + 1)
        for j in range(1, n + 1):
            row[j] = min((best[g - 1][i][0] + overhead + (j - i) * (unseen + sizes[j - 1]), i) for i in range(j))
        best.append(row)
    groups = min(range(1, len(best)), key=lambda g: best[g][n][0])
    if groups == 1:
        return None
    cuts, j = [], n
    for g in range(groups, 0, -1):
        i = best[g][j][1]
        cuts.append(order[i:j])
        j = i
    return cuts[::-1]


class ForwardRows(NamedTuple):
    """A verification forward's input: each row's unseen tokens then its draft, which columns are real, and each
    row's draft length."""

    tokens: torch.LongTensor  # [B, unseen + n]
    valid: torch.BoolTensor  # [B, unseen + n]
    lengths: list[int]  # [B]


def grouped_forward(target: PreTrainedModel, cache: RowCache, batch_rows: ForwardRows, groups: list[list[int]],
                    want_hidden: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The verification forward over ``batch_rows`` as one forward per group of rows (on a copy of the group's
    cache, only as wide as the group's longest draft), merged: returns the logits [B, n+1, V] (and last hidden
    states [B, n+1, H]) of each row's last ``max(lengths) + 1`` positions, zeros past a group's width, and extends
    ``cache`` as one forward would (columns past a row's draft are holes)."""
    tokens, token_valid, lengths = batch_rows
    batch, drafted = tokens.shape[0], max(lengths)
    unseen = tokens.shape[1] - drafted
    logits, hidden, pieces = None, None, []
    for rows in groups:
        width = max(lengths[r] for r in rows)
        index = torch.tensor(rows, dtype=torch.long, device=tokens.device)
        part = cache.copy_rows(rows)
        out = target(**part.inputs(tokens[index, : unseen + width], token_valid[index, : unseen + width]),
                     logits_to_keep=width + 1, output_hidden_states=want_hidden)
        pieces.append((rows, part.last_columns(unseen + width)))
        if logits is None:
            logits = out.logits.new_zeros(batch, drafted + 1, out.logits.shape[-1])
        logits[index, : width + 1] = out.logits
        if want_hidden:
            last = out.hidden_states[-1][:, -(width + 1) :]
            hidden = last.new_zeros(batch, drafted + 1, last.shape[-1]) if hidden is None else hidden
            hidden[index, : width + 1] = last
    cache.append_columns(pieces, token_valid)
    return logits, hidden
