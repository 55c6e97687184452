"""One warp for draft and target: temperature, top-k, top-p, in that order (as transformers does), or
transformers' own logits processors when a call asks for more (penalties, bans, minimum lengths...)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch


@dataclass(frozen=True)
class Sampler:
    """Turns logits into the distribution a token is drawn from; greedy when ``do_sample`` is False.

    The same instance warps the draft's and the target's logits, which is what keeps speculative
    sampling lossless (a q computed differently from how the draft sampled silently biases output).
    ``processors``, one ``LogitsProcessorList`` per batch row, replace the built-in warp with the list
    transformers builds from a generation config (its warpers included): each position is then
    processed with its own prefix, as transformers' assisted generation does.
    """

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    processors: tuple | None = None

    def __post_init__(self) -> None:
        if self.do_sample and not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 when do_sample=True, got {self.temperature}")
        if self.top_k is not None and self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    def warp(self, logits: torch.Tensor, prefixes: Sequence[torch.LongTensor] | None = None,
             following: torch.LongTensor | None = None) -> torch.Tensor:
        """Processed fp32 logits [..., V]; masked tokens get -inf. Greedy returns raw logits.

        With ``processors``, ``logits`` are [B, V] after the rows ``prefixes`` or [B, n, V] where position
        i follows the row's prefix and ``following[b, :i]`` (a chain draft).
        """
        if self.processors is not None:
            return self._process(logits, prefixes, following)
        logits = logits.float()
        if not self.do_sample:
            return logits
        if self.temperature != 1.0:
            logits = logits / self.temperature
        if self.top_k and self.top_k < logits.shape[-1]:
            kth = torch.topk(logits, self.top_k, dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if self.top_p is not None and self.top_p < 1.0:
            sorted_logits, order = torch.sort(logits, dim=-1, descending=False)
            cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
            drop_sorted = cum <= 1 - self.top_p
            drop_sorted[..., -1] = False  # always keep the most likely token
            drop = drop_sorted.scatter(-1, order, drop_sorted)
            logits = logits.masked_fill(drop, float("-inf"))
        return logits

    def _process(self, logits: torch.Tensor, prefixes, following) -> torch.Tensor:
        """`warp` by each row's ``processors``: fp32 logits shaped as ``logits`` [B, V] or [B, n, V]."""
        if prefixes is None:
            raise ValueError("this sampler applies logits processors, which need each row's prefix")
        flat = logits.dim() == 2
        logits = logits.float()[:, None] if flat else logits.float()
        out = torch.empty_like(logits)
        for row, (processors, prefix) in enumerate(zip(self.processors, prefixes)):
            ids = prefix if logits.shape[1] == 1 else torch.cat([prefix, following[row, : logits.shape[1] - 1]])
            for i in range(logits.shape[1]):  # position i sees a view of the row's ids: one copy per row
                out[row, i] = processors(ids[None, : len(prefix) + i], logits[row, i][None].clone())[0]
        return out[:, 0] if flat else out

    def rows(self, keep: Sequence[int]) -> "Sampler":
        """This sampler for the rows ``keep`` of its batch (their processors)."""
        if self.processors is None:
            return self
        return replace(self, processors=tuple(self.processors[i] for i in keep))

    def probs(self, logits: torch.Tensor, prefixes: Sequence[torch.LongTensor] | None = None,
              following: torch.LongTensor | None = None) -> torch.Tensor:
        """[..., V] softmax of the warped ``logits`` [..., V], fp32."""
        return torch.softmax(self.warp(logits, prefixes, following), dim=-1)
