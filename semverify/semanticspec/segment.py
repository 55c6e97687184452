"""Reasoning steps: a step ends at a paragraph break (SemanticSpec's stop strings) or at a length cap."""

from __future__ import annotations

import re
from dataclasses import dataclass

# The authors' stop strings: a paragraph break, whatever punctuation precedes it (all end in "\n\n").
DEFAULT_STOPS = ("\n\n",)


@dataclass(frozen=True)
class StepSegmenter:
    """Decides where steps end, from token ids of any tokenizer (by decoding the last few tokens).

    ``stops``: strings that end a step (kept in the step); ``max_step_tokens``: the cap.
    """

    tokenizer: object
    stops: tuple[str, ...] = DEFAULT_STOPS
    max_step_tokens: int = 128

    def __post_init__(self) -> None:
        if not self.stops or any(not s for s in self.stops):
            raise ValueError("stops must be non-empty strings")
        if self.max_step_tokens < 1:
            raise ValueError(f"max_step_tokens must be >= 1, got {self.max_step_tokens}")

    def ends_step(self, step_ids: list[int]) -> bool:
        """Whether a step made of ``step_ids`` is complete: it ends with a stop string, or hit the cap."""
        if len(step_ids) >= self.max_step_tokens:
            return True
        tail = self.tokenizer.decode(step_ids[-4:])
        return any(tail.endswith(s) for s in self.stops)

    def contains_break(self, ids: list[int]) -> bool:
        """Whether a stop string occurs anywhere in the text of ``ids``."""
        text = self.tokenizer.decode(ids)
        return any(s in text for s in self.stops)

    def split(self, text: str) -> list[str]:
        """Cut text after every (run of) stop strings; the pieces concatenate back to ``text``."""
        pattern = "|".join(re.escape(s) for s in sorted(self.stops, key=len, reverse=True))
        cuts = [m.end() for m in re.finditer(f"(?:{pattern})+", text)]
        bounds = [0, *[c for c in cuts if c < len(text)], len(text)]
        return [text[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]
