"""Coupled sampling: public Gumbel noise keyed by (seed, stream, position), so every method draws the
target's token at a position from the same noise.

A token drawn as ``argmax(warped_logits + g)``, with ``g`` i.i.d. Gumbel(0, 1), is an exact sample from
the softmax of the warped logits (the Gumbel-max trick). When the target alone, and every speculative
method, draw the target's token at output position t with the same ``g_t``, a lossless method reproduces
the target alone token for token whatever its drafter (drafter-invariant speculative decoding, Daliri,
Musco and Suresh, arXiv 2408.07978), and a lossy rule differs from it only where the rule decides
otherwise: common random numbers for accuracy comparisons.

Two expansions of a key into noise over the vocabulary: ``"counter"`` (the default) hashes (key, token) with
integer arithmetic on the logits' device, every position of a call in one batched operation; ``"legacy"``
seeds a CPU ``torch.Generator`` per key and draws float64 uniforms, which is what the committed coupled runs
(`results/gsm8k-500`, `results/gsm8k-coupled`) drew, and stays available so that they can be resumed and
reproduced. Both are keyed by the same (seed, sample, stream, position or context).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence

import torch

from .argmax import vocab_argmax

# the noise streams: the target's token, EASD's resample (coupling 1), other uniform draws (a step rule's test), and
# the draft's own tokens where a rule decides from the target's coupled tokens itself (`CoupledNoise.drafting`)
TARGET_STREAM, RESAMPLE_STREAM, AUXILIARY_STREAM, DRAFT_STREAM = 0, 1, 2, 3
# how coupled runs draw the emitted tokens: 1, each rule's own coupled branch (rows before 2026-12-07); 2, the
# engine draws the Gumbel-max of the rule's emitted law (`semverify.engine.drawing`). Rows record it.
COUPLING_VERSION = 2
NOISE_KINDS = ("counter", "legacy")  # how a key becomes noise over the vocabulary (see the module's docstring)
_M32 = 0xFFFFFFFF


def mix(*parts: int) -> int:
    """A 63-bit seed from integers, the same on every machine and Python run (unlike ``hash``)."""
    digest = hashlib.blake2b(b",".join(str(int(p)).encode() for p in parts), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def _int32(c: int) -> int:
    """A 32-bit constant as the int32 value with the same bits."""
    return c - (1 << 32) if c >= 1 << 31 else c


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finaliser, in place on an int32 tensor ``h`` [...], returned (a bijection that spreads
    every input bit over the output): products wrap around as uint32 arithmetic does, and shifts are made logical
    by a mask."""
    h ^= (h >> 16) & 0xFFFF
    h *= _int32(0x85EBCA6B)
    h ^= (h >> 13) & 0x7FFFF
    h *= _int32(0xC2B2AE35)
    h ^= (h >> 16) & 0xFFFF
    return h


def counter_gumbel(keys: Sequence[int] | torch.Tensor, vocab: int, device: torch.device | str | None = None
                   ) -> torch.Tensor:
    """[N, vocab] Gumbel(0, 1) noise (fp32) for N 63-bit ``keys``, a pure function of (key, token) computed with
    32-bit integer hashing on ``device``: the same on every device, one batched operation for every key.

    Each entry takes 24 bits of a two-round hash, u = (m + 1/2) / 2^24, and -log(u) is computed from u or
    from 1 - u (both exact in fp32 on their half), so no entry is infinite: the noise lies in [-2.9, 17.4],
    and the Gumbel-max draw differs from an exact softmax draw by at most about 1e-7 in total variation."""
    keys = torch.as_tensor(keys, dtype=torch.long, device=device).reshape(-1, 1)
    low, high = (keys & _M32).to(torch.int32), ((keys >> 32) & _M32).to(torch.int32)  # the int32 with those bits
    first = _fmix32(_fmix32(low ^ _int32(0x9E3779B9)) ^ high)
    second = _fmix32(first ^ 0x7F4A7C15)
    h = torch.arange(vocab, dtype=torch.int32, device=keys.device)[None, :] * _int32(0x9E3779B9) + first
    h = _fmix32(_fmix32(h) ^ second)
    m = (h >> 8) & 0xFFFFFF  # 24 bits
    low_half = m < (1 << 23)  # u < 1/2: -log(u) directly; else -log1p(-(1 - u)), with 1 - u exact
    u = (m.float() + 0.5) * 2.0**-24
    rest = ((1 << 24) - m).float().sub_(0.5).mul_(2.0**-24)
    return torch.where(low_half, u.log_().neg_(), rest.neg_().log1p_().neg_()).log_().neg_()


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
                 noise: str = "counter", _shared: _Shared | None = None, _draft: bool = False) -> None:
        if context is not None and context < 1:
            raise ValueError(f"context must be None (position keys) or >= 1 tokens, got {context}")
        if noise not in NOISE_KINDS:
            raise ValueError(f"noise must be one of {', '.join(NOISE_KINDS)}, got {noise!r}")
        self.seed, self.sample, self.offset, self.context = int(seed), int(sample), int(offset), context
        self.noise = noise
        self._shared = _Shared() if _shared is None else _shared
        self._draft = _draft  # target-stream draws go to DRAFT_STREAM (`drafting`)

    def __repr__(self) -> str:
        keys = "" if self.context is None else f", context={self.context}"
        kind = "" if self.noise == "counter" else f", noise={self.noise!r}"
        return f"CoupledNoise(seed={self.seed}, sample={self.sample}, offset={self.offset}{keys}{kind})"

    def at(self, offset: int, sequence: torch.Tensor | Sequence[int] | None = None) -> "CoupledNoise":
        """This noise with relative position 0 at output position ``offset``; noise drawn for earlier
        positions is dropped (generation only moves forward). Context keys need the row's ``sequence`` [T]
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
        return CoupledNoise(self.seed, self.sample, offset=offset, context=self.context, noise=self.noise,
                            _shared=shared, _draft=self._draft)

    def drafting(self) -> "CoupledNoise":
        """This noise for a drafter whose tokens must not share the target's noise: its target-stream draws come
        from a stream of their own (a rule that decides by comparing drafts with the target's own tokens, over a
        window or a whole step, keeps its law only when the two are drawn independently)."""
        return CoupledNoise(self.seed, self.sample, offset=self.offset, context=self.context, noise=self.noise,
                            _shared=self._shared, _draft=True)

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
        return CoupledNoise(mix(self.seed, index), self.sample, context=self.context, noise=self.noise)

    def gumbel(self, position: int, vocab: int, stream: int = TARGET_STREAM,
               tokens: Sequence[int] = ()) -> torch.Tensor:
        """The [vocab] Gumbel(0, 1) noise at relative ``position`` of ``stream`` (fp32); context keys also read
        the ``tokens`` drawn before it in this step (at least ``position`` of them)."""
        return self.noise_at([position], vocab, stream, tokens)[0]

    def noise_at(self, positions: Sequence[int], vocab: int, stream: int = TARGET_STREAM, tokens: Sequence[int] = (),
                 device: torch.device | str | None = None) -> torch.Tensor:
        """[len(positions), vocab] noise at relative ``positions`` of ``stream``: counter noise in one batched
        operation on ``device``, legacy noise drawn (and cached) on the CPU key by key."""
        seeds = self._seeds(positions, vocab, stream, tokens)
        if self.noise == "counter":
            return counter_gumbel([mix(self.seed, self.sample, *seed) for seed in seeds], vocab, device)
        cache, keys = self._shared.cache, [seed if self.context is None else (*seed, vocab) for seed in seeds]
        for seed, key in zip(seeds, keys):
            if key not in cache:
                g = torch.Generator().manual_seed(mix(self.seed, self.sample, *seed))
                u = torch.rand(vocab, generator=g, dtype=torch.float64).clamp_(1e-300, 1.0 - 1e-16)
                cache[key] = (-torch.log(-torch.log(u))).float()
        return torch.stack([cache[key] for key in keys]).to(device)

    def _seeds(self, positions: Sequence[int], vocab: int, stream: int, tokens: Sequence[int]) -> list[tuple]:
        """The key of each draw: (stream, absolute position, vocab), or (stream, occurrences, context...)."""
        if self._draft and stream == TARGET_STREAM:
            stream = DRAFT_STREAM
        if self.context is None:
            return [(stream, self.offset + int(p), vocab) for p in positions]
        return [(stream, *self._context_key(int(p), tokens)) for p in positions]

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

    def gumbel_like(self, logits: torch.Tensor, positions: torch.Tensor | Sequence[int] | int | None = None,
                    stream: int = TARGET_STREAM, tokens: torch.Tensor | Sequence[int] = ()) -> torch.Tensor:
        """Gumbel noise shaped as ``logits`` [..., V]; ``positions`` (relative, broadcast to ``logits.shape[:-1]``)
        default to 0, 1, ... along the last position axis. ``tokens``: the step's tokens before those positions
        (one path: a draft chain), for context keys."""
        shape, vocab = logits.shape[:-1], logits.shape[-1]
        if positions is None:
            if not shape:
                raise ValueError("a single distribution needs its position")
            positions = torch.arange(shape[-1])
        pos = torch.as_tensor(positions, dtype=torch.long).expand(shape).reshape(-1).tolist()
        path = torch.as_tensor(tokens).reshape(-1).tolist() if self.context is not None else ()
        return self.noise_at(pos, vocab, stream, path, logits.device).reshape(logits.shape)

    def choose(self, logits: torch.Tensor, positions: torch.Tensor | Sequence[int] | int | None = None,
               stream: int = TARGET_STREAM, tokens: torch.Tensor | Sequence[int] = ()) -> torch.LongTensor:
        """Gumbel-max tokens of warped ``logits`` [..., V] (log-probabilities do as well), with the noise of
        `gumbel_like`."""
        return vocab_argmax(logits.float() + self.gumbel_like(logits, positions, stream, tokens))

    def generator(self, position: int = 0) -> torch.Generator:
        """A torch stream for the auxiliary draws at relative ``position`` (a step rule's uniform); keyed by
        position in both keyings (each step's offset is new, so its draws are fresh)."""
        return torch.Generator().manual_seed(mix(self.seed, self.sample, AUXILIARY_STREAM, self.offset + position))


class CoupledRows:
    """The noises of a batch's rows as one generator: row b of every draw uses ``rows[b]``, so a rule called once
    on the padded batch draws what each row would draw alone (counter noise: one batched operation)."""

    def __init__(self, rows: Sequence[CoupledNoise]) -> None:
        self.rows = list(rows)

    def gumbel_like(self, logits: torch.Tensor, positions: torch.Tensor | Sequence[int] | int | None = None,
                    stream: int = TARGET_STREAM, tokens: torch.Tensor | Sequence[int] = ()) -> torch.Tensor:
        """`CoupledNoise.gumbel_like` for [B, ..., V] ``logits`` whose row b draws from ``rows[b]`` (``positions``
        and ``tokens`` broadcast as there; ``tokens`` [B, ...] per row)."""
        shape, vocab, batch = logits.shape[:-1], logits.shape[-1], len(self.rows)
        if positions is None:
            if len(shape) < 2:
                raise ValueError("rows of single distributions need their positions")
            positions = torch.arange(shape[-1])
        pos = torch.as_tensor(positions, dtype=torch.long).expand(shape).reshape(batch, -1).tolist()
        paths = (torch.as_tensor(tokens).reshape(batch, -1).tolist() if len(tokens) and self.rows[0].context
                 else [()] * batch)
        if all(row.noise == "counter" for row in self.rows):
            keys = [mix(row.seed, row.sample, *seed) for row, p, path in zip(self.rows, pos, paths)
                    for seed in row._seeds(p, vocab, stream, path)]
            return counter_gumbel(keys, vocab, logits.device).reshape(logits.shape)
        return torch.cat([row.noise_at(p, vocab, stream, path, logits.device)
                          for row, p, path in zip(self.rows, pos, paths)]).reshape(logits.shape)

    def choose(self, logits: torch.Tensor, positions: torch.Tensor | Sequence[int] | int | None = None,
               stream: int = TARGET_STREAM, tokens: torch.Tensor | Sequence[int] = ()) -> torch.LongTensor:
        """`CoupledNoise.choose` row by row (each row its own noise), in one batched operation: [B, ...] tokens of
        ``logits`` [B, ..., V]."""
        return vocab_argmax(logits.float() + self.gumbel_like(logits, positions, stream, tokens))

    def generator(self, position: int = 0) -> list[torch.Generator]:
        """Each row's auxiliary stream (`uniform` then draws row by row)."""
        return [row.generator(position) for row in self.rows]
