"""Prompt lookup decoding: propose what followed an earlier occurrence of the current n-gram suffix."""

from __future__ import annotations

import torch

from ..types import Draft, eos_ids
from .base import BaseDrafter


class PromptLookupDrafter(BaseDrafter):
    """n-gram lookup in the prompt and the text generated so far (Saxena 2023; transformers' PLD).

    Tries suffixes of ``max_ngram_size`` tokens down to 1 and copies up to k tokens that followed a
    match: the latest match (``prefer="recent"``, the default) or the earliest (``"first"``, what
    transformers does). On the GSM8K outputs of the default pair the latest match gave 4% more tokens
    per target forward. Deterministic, so its q is one-hot (``probs=None``). A draft stops after EOS.
    """

    def __init__(self, max_ngram_size: int = 2, prefer: str = "recent", eos_token_id: int | list[int] | None = None):
        if max_ngram_size < 1:
            raise ValueError(f"max_ngram_size must be >= 1, got {max_ngram_size}")
        if prefer not in ("first", "recent"):
            raise ValueError(f"prefer must be 'first' or 'recent', got {prefer!r}")
        self.max_ngram_size = max_ngram_size
        self.prefer = prefer
        self.eos = torch.tensor(eos_ids(eos_token_id))

    def propose(self, input_ids: torch.LongTensor, k: int, sampler=None, generator=None) -> Draft:
        seq = input_ids[0]
        for n in range(min(self.max_ngram_size, len(seq) - 1), 0, -1):
            windows = seq[:-1].unfold(0, n, 1)  # every n-gram that ends before the last token
            hits = (windows == seq[-n:]).all(dim=-1).nonzero().flatten()
            if len(hits):
                start = int(hits[0] if self.prefer == "first" else hits[-1]) + n
                cont = seq[start : start + k]
                stops = torch.isin(cont, self.eos.to(cont.device)).nonzero()
                if len(stops):
                    cont = cont[: int(stops[0]) + 1]
                return Draft(tokens=cont[None, :].clone())
        return Draft.empty(1, input_ids.device)
