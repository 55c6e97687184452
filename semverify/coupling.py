"""Coupled sampling: public Gumbel noise keyed by (seed, stream, position), so every method draws the
target's token at a position from the same noise.

A token drawn as ``argmax(warped_logits + g)``, with ``g`` i.i.d. Gumbel(0, 1), is an exact sample from
the softmax of the warped logits (the Gumbel-max trick). When the target alone, and every speculative
method, draw the target's token at output position t with the same ``g_t``, a lossless method reproduces
the target alone token for token whatever its drafter (drafter-invariant speculative decoding, Daliri,
Musco and Suresh, arXiv 2408.07978), and a lossy rule differs from it only where the rule decides
otherwise: common random numbers for accuracy comparisons.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence

import torch

# the noise streams: the target's token, EASD's resample, other uniform draws (a step rule's test)
TARGET_STREAM, RESAMPLE_STREAM, AUXILIARY_STREAM = 0, 1, 2


def mix(*parts: int) -> int:
    """A 63-bit seed from integers, the same on every machine and Python run (unlike ``hash``)."""
    digest = hashlib.blake2b(b",".join(str(int(p)).encode() for p in parts), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class _Shared:
    """What the copies of one generation's noise share: drawn noise, and for context keys the row's tokens
    so far and how often each context occurred in its output."""

    def __init__(self) -> None:
        self.cache: dict = {}
        self.offset = 0
        self.tokens: list[int] = []  # the row's prompt and output before ``offset`` (context keys)
        self.start: int | None = None  # where its output begins
        self.counts: Counter = Counter()  # contexts of output positions before ``offset``


class CoupledNoise:
    """One generation's public randomness: Gumbel noise for every (stream, output position).

    Pass it where a ``torch.Generator`` goes (``generate(..., do_sample=True, generator=CoupledNoise(seed))``,
    one per row for a batch): the loop then gives every draw the position of the token it draws, and the
    target's tokens become a function of the seed alone. ``sample`` derives the noise of a further sample
    of the same problem. Position 0 is the first generated token; `at` shifts the origin.

    ``context=n`` keys each draw by the ``n`` tokens before it and how often that context already occurred
    in the output, instead of by position. No key repeats within an output, so every draw stays an exact
    sample, and lossless methods still equal the target alone; but a run that left another's text
    (a lossy rule's changed token) draws the same noise again as soon as its last ``n`` tokens are the
    other's, so the two texts can join again instead of continuing on unrelated noise.
    """

    def __init__(self, seed: int, sample: int = 0, *, offset: int = 0, context: int | None = None,
                 _shared: _Shared | None = None) -> None:
        if context is not None and context < 1:
            raise ValueError(f"context must be None (position keys) or >= 1 tokens, got {context}")
        self.seed, self.sample, self.offset, self.context = int(seed), int(sample), int(offset), context
        self._shared = _Shared() if _shared is None else _shared

    def __repr__(self) -> str:
        keys = "" if self.context is None else f", context={self.context}"
        return f"CoupledNoise(seed={self.seed}, sample={self.sample}, offset={self.offset}{keys})"

    def at(self, offset: int, sequence: torch.Tensor | Sequence[int] | None = None) -> "CoupledNoise":
        """This noise with relative position 0 at output position ``offset``; noise drawn for earlier
        positions is dropped (generation only moves forward). Context keys need the row's ``sequence``
        (its prompt, then its ``offset`` output tokens)."""
        shared = self._shared
        if self.context is not None:
            if sequence is None:
                raise ValueError("noise keyed by context needs the row's tokens: at(offset, sequence)")
            self._follow(offset, [int(t) for t in sequence])
        if offset != shared.offset:
            drop = [key for key in shared.cache if self.context is not None or key[1] < offset]
            for key in drop:
                del shared.cache[key]
            shared.offset = offset
        return CoupledNoise(self.seed, self.sample, offset=offset, context=self.context, _shared=shared)

    def _follow(self, offset: int, tokens: list[int]) -> None:
        """Count the contexts of the output positions before ``offset``, going on from what was counted (anew
        when ``tokens`` do not continue it: another generation with this noise)."""
        shared, start = self._shared, len(tokens) - offset
        if shared.start != start or tokens[: len(shared.tokens)] != shared.tokens:
            shared.counts, shared.tokens, shared.start = Counter(), tokens[:start], start
        for t in range(len(shared.tokens), len(tokens)):
            shared.counts[tuple(tokens[max(0, t - self.context) : t])] += 1
        shared.tokens = tokens

    def row(self, index: int) -> "CoupledNoise":
        """Independent noise for row ``index`` of a batch given one noise for all rows."""
        return CoupledNoise(mix(self.seed, index), self.sample, context=self.context)

    def gumbel(self, position: int, vocab: int, stream: int = TARGET_STREAM,
               tokens: Sequence[int] = ()) -> torch.Tensor:
        """The [vocab] Gumbel(0, 1) noise at relative ``position`` of ``stream`` (fp32, cached); context keys
        also read the ``tokens`` drawn before it in this step (at least ``position`` of them)."""
        seed = ((stream, self.offset + int(position), vocab) if self.context is None
                else (stream, *self._context_key(int(position), tokens)))
        key, cache = (seed if self.context is None else (*seed, vocab)), self._shared.cache
        if key not in cache:
            g = torch.Generator().manual_seed(mix(self.seed, self.sample, *seed))
            u = torch.rand(vocab, generator=g, dtype=torch.float64).clamp_(1e-300, 1.0 - 1e-16)
            cache[key] = (-torch.log(-torch.log(u))).float()
        return cache[key]

    def _context_key(self, position: int, tokens: Sequence[int]) -> tuple[int, ...]:
        """(earlier occurrences, context...) of the draw at relative ``position`` after this step's ``tokens``."""
        if len(tokens) < position:
            raise ValueError(f"a draw at step position {position} keyed by context needs the {position} tokens "
                             f"drawn before it in the step, got {len(tokens)}")
        n = self.context
        tail = self._shared.tokens[-n:]  # only the last n tokens before the step can be in a context
        full, end = tail + [int(t) for t in tokens[:position]], len(tail)
        context = tuple(full[max(0, end + position - n) : end + position])
        seen = self._shared.counts[context] + sum(
            tuple(full[max(0, end + j - n) : end + j]) == context for j in range(position))
        return (seen, *context)

    def choose(self, logits: torch.Tensor, positions: torch.Tensor | Sequence[int] | int | None = None,
               stream: int = TARGET_STREAM, tokens: torch.Tensor | Sequence[int] = ()) -> torch.LongTensor:
        """Gumbel-max tokens of warped ``logits`` [..., V] (log-probabilities do as well); ``positions``
        (relative, broadcast to ``logits.shape[:-1]``) default to 0, 1, ... along the last position axis.
        ``tokens``: the step's tokens before those positions (one path: a draft chain), for context keys."""
        shape, vocab = logits.shape[:-1], logits.shape[-1]
        if positions is None:
            if not shape:
                raise ValueError("a single distribution needs its position")
            positions = torch.arange(shape[-1])
        pos = torch.as_tensor(positions, dtype=torch.long).expand(shape).reshape(-1).tolist()
        path = torch.as_tensor(tokens).reshape(-1).tolist() if self.context is not None else ()
        noise = torch.stack([self.gumbel(p, vocab, stream, path) for p in pos]).to(logits.device)
        return (logits.reshape(-1, vocab).float() + noise).argmax(dim=-1).reshape(shape)

    def generator(self, position: int = 0) -> torch.Generator:
        """A torch stream for the auxiliary draws at relative ``position`` (a step rule's uniform); keyed by
        position in both keyings (each step's offset is new, so its draws are fresh)."""
        return torch.Generator().manual_seed(mix(self.seed, self.sample, AUXILIARY_STREAM, self.offset + position))


def is_coupled(generator: object) -> bool:
    """Whether draws go through coupled noise (a `CoupledNoise`) rather than a torch stream."""
    return isinstance(generator, CoupledNoise)


def at_offset(generator, offset: int, sequence: torch.Tensor | None = None):
    """The row's stream for a step whose first drafted token is output position ``offset`` (``sequence``: the
    row's prompt and output so far, which noise keyed by context reads)."""
    return generator.at(offset, sequence) if is_coupled(generator) else generator
