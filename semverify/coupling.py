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
from collections.abc import Sequence

import torch

# the noise streams: the target's token, EASD's resample, other uniform draws (a step rule's test)
TARGET_STREAM, RESAMPLE_STREAM, AUXILIARY_STREAM = 0, 1, 2


def mix(*parts: int) -> int:
    """A 63-bit seed from integers, the same on every machine and Python run (unlike ``hash``)."""
    digest = hashlib.blake2b(b",".join(str(int(p)).encode() for p in parts), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class CoupledNoise:
    """One generation's public randomness: Gumbel noise for every (stream, output position).

    Pass it where a ``torch.Generator`` goes (``generate(..., do_sample=True, generator=CoupledNoise(seed))``,
    one per row for a batch): the loop then gives every draw the position of the token it draws, and the
    target's tokens become a function of the seed alone. ``sample`` derives the noise of a further sample
    of the same problem. Position 0 is the first generated token; `at` shifts the origin.
    """

    def __init__(self, seed: int, sample: int = 0, *, offset: int = 0, _cache: dict | None = None) -> None:
        self.seed, self.sample, self.offset = int(seed), int(sample), int(offset)
        self._cache = {} if _cache is None else _cache

    def __repr__(self) -> str:
        return f"CoupledNoise(seed={self.seed}, sample={self.sample}, offset={self.offset})"

    def at(self, offset: int) -> "CoupledNoise":
        """This noise with relative position 0 at output position ``offset``; noise of earlier
        positions is dropped from the cache (generation only moves forward)."""
        for key in [key for key in self._cache if key[1] < offset]:
            del self._cache[key]
        return CoupledNoise(self.seed, self.sample, offset=offset, _cache=self._cache)

    def row(self, index: int) -> "CoupledNoise":
        """Independent noise for row ``index`` of a batch given one noise for all rows."""
        return CoupledNoise(mix(self.seed, index), self.sample)

    def gumbel(self, position: int, vocab: int, stream: int = TARGET_STREAM) -> torch.Tensor:
        """The [vocab] Gumbel(0, 1) noise at relative ``position`` of ``stream`` (fp32, cached)."""
        key = (stream, self.offset + int(position), vocab)
        if key not in self._cache:
            g = torch.Generator().manual_seed(mix(self.seed, self.sample, *key))
            u = torch.rand(vocab, generator=g, dtype=torch.float64).clamp_(1e-300, 1.0 - 1e-16)
            self._cache[key] = (-torch.log(-torch.log(u))).float()
        return self._cache[key]

    def choose(self, logits: torch.Tensor, positions: torch.Tensor | Sequence[int] | int | None = None,
               stream: int = TARGET_STREAM) -> torch.LongTensor:
        """Gumbel-max tokens of warped ``logits`` [..., V] (log-probabilities do as well); ``positions``
        (relative, broadcast to ``logits.shape[:-1]``) default to 0, 1, ... along the last position axis."""
        shape, vocab = logits.shape[:-1], logits.shape[-1]
        if positions is None:
            if not shape:
                raise ValueError("a single distribution needs its position")
            positions = torch.arange(shape[-1])
        pos = torch.as_tensor(positions, dtype=torch.long).expand(shape).reshape(-1).tolist()
        noise = torch.stack([self.gumbel(p, vocab, stream) for p in pos]).to(logits.device)
        return (logits.reshape(-1, vocab).float() + noise).argmax(dim=-1).reshape(shape)

    def generator(self, position: int = 0) -> torch.Generator:
        """A torch stream for the auxiliary draws at relative ``position`` (a step rule's uniform)."""
        return torch.Generator().manual_seed(mix(self.seed, self.sample, AUXILIARY_STREAM, self.offset + position))


def is_coupled(generator: object) -> bool:
    """Whether draws go through coupled noise (a `CoupledNoise`) rather than a torch stream."""
    return isinstance(generator, CoupledNoise)


def at_offset(generator, offset: int):
    """The row's stream for a step whose first drafted token is output position ``offset``."""
    return generator.at(offset) if is_coupled(generator) else generator
