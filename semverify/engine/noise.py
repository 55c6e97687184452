"""Noise: where every random draw of the engine comes from, and the one module that tells its kinds apart.

A run's noise (the `Noise` type) is one of three kinds:

- a **stream**: a ``torch.Generator`` (None: torch's global one); draws consume it in order;
- **one per row**: a list with a stream (or coupled noise) for each row of the batch; row b of a batched draw
  uses the b-th, so a row draws what it would draw alone;
- **coupled**: `CoupledNoise` (one row) or `CoupledRows` (a batch), public Gumbel noise keyed by output position
  (`semverify.engine.coupling`), so every method draws the target's token at a position from the same noise.

The engine and the rules ask for draws through the functions here (`sample_from`, `uniform`, `sample_rows`,
`target_noise`) and for a row's or a step's noise through `per_row`, `joined`, `at_offset` and `drafting`; nothing
else in the package tests which kind it holds.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .coupling import TARGET_STREAM, CoupledNoise, CoupledRows

Noise = torch.Generator | CoupledNoise | CoupledRows | Sequence[torch.Generator | CoupledNoise | None] | None


def is_coupled(noise: Noise) -> bool:
    """Whether draws go through coupled noise (a `CoupledNoise` or `CoupledRows`) rather than a torch stream."""
    return isinstance(noise, (CoupledNoise, CoupledRows))


def _is_rows(noise: Noise) -> bool:
    return isinstance(noise, (list, tuple))


def per_row(noise: Noise, batch: int) -> list:
    """Each row's own noise: the list's entries, a `CoupledRows`' rows, else the one noise for every row (a stream
    shared in row order, or coupled noise that the caller derives per row)."""
    if _is_rows(noise):
        if len(noise) != batch:
            raise ValueError(f"generator has {len(noise)} entries (one per row) for a batch of {batch} rows")
        return list(noise)
    return list(noise.rows) if isinstance(noise, CoupledRows) else [noise] * batch


def call_noise(noise: Noise, batch: int, device: torch.device | str = "cpu") -> Noise:
    """The noise of a `generate` call: ``noise`` as given for one row (a fresh stream seeded from torch's global RNG
    when None), else one per row: the list as given, each row's derived from one `CoupledNoise`, or streams seeded
    from ``noise`` (or the global RNG) in row order, so a row's draws do not depend on the other rows' content."""
    if _is_rows(noise):
        if len(noise) != batch:
            raise ValueError(f"pass one generator per row: got {len(noise)} for a batch of {batch}")
        return list(noise)
    if batch == 1 and noise is not None:
        return noise
    if is_coupled(noise):  # one noise for a batch: each row its own, derived in row order
        return [noise.row(i) for i in range(batch)]
    seeds = [int(torch.randint(2**62, (1,), generator=noise)) for _ in range(batch)]
    streams = [torch.Generator(device=device).manual_seed(seed) for seed in seeds]
    return streams[0] if batch == 1 else streams


def joined(rows: Sequence) -> Noise:
    """One noise for the rows of a batch from each row's own: itself for one row, `CoupledRows` when every row is
    coupled, else the list."""
    rows = list(rows)
    if len(rows) == 1:
        return rows[0]
    return CoupledRows(rows) if all(map(is_coupled, rows)) else rows


def rows_of(noise: Noise, rows: Sequence[int] | slice) -> Noise:
    """The noise of the batch rows ``rows`` only (a one-noise-for-all stream stays as it is)."""
    if not (_is_rows(noise) or isinstance(noise, CoupledRows)):
        return noise
    every = noise if _is_rows(noise) else noise.rows  # no copy: a batch's rows ask one at a time
    return joined(every[rows] if isinstance(rows, slice) else [every[i] for i in rows])


def at_offset(noise: Noise, offset: int, sequence: torch.Tensor | None = None) -> Noise:
    """A row's noise for a step whose first drafted token is output position ``offset`` (``sequence`` [T]: the
    row's prompt and output so far, which noise keyed by context reads); a stream is its own at every step."""
    return noise.at(offset, sequence) if is_coupled(noise) else noise


def drafting(noise: Noise) -> Noise:
    """A row's noise for a drafter whose tokens must not share the target's coupled noise
    (`CoupledNoise.drafting`); a stream is its own."""
    return noise.drafting() if is_coupled(noise) else noise


def target_noise(noise: Noise, logits: torch.Tensor, tokens: torch.Tensor = ()) -> torch.Tensor | None:
    """[B, n, V] the target stream's coupled Gumbel noise at the step's positions of ``logits`` [B, n, V] (after the
    draft ``tokens`` [B, k], for context keys); None when the noise is not coupled."""
    return noise.gumbel_like(logits, tokens=tokens) if is_coupled(noise) else None


def sample_from(probs: torch.Tensor, noise: Noise = None, positions=None, stream: int = TARGET_STREAM,
                tokens=()) -> torch.LongTensor:
    """One index per row of [..., V] ``probs`` (rows need not be normalised); returns [...].

    With one noise per batch row (dimension 0), each row draws from its own exactly what it would draw alone.
    With coupled noise the draw is the Gumbel-max at the rows' output ``positions`` (relative to the step) in
    noise ``stream``, after the step's ``tokens`` (context keys)."""
    if is_coupled(noise):
        if positions is None:
            raise ValueError("a coupled draw needs the positions of the tokens it draws")
        return noise.choose(torch.log(probs.float()), positions, stream, tokens)
    if _is_rows(noise):
        return torch.stack([sample_from(p, g) for p, g in zip(probs, noise)])
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=noise).reshape(probs.shape[:-1])


def sample_rows(probs: torch.Tensor, noises: Sequence, positions: Sequence[int],
                tokens: torch.LongTensor) -> torch.LongTensor:
    """One draw per row of [B, V] ``probs``: row b from ``noises[b]`` at its relative output position
    ``positions[b]``, after its step tokens ``tokens[b, :positions[b]]`` (context keys); returns [B]. Coupled noise
    keyed by position draws every row in one batched Gumbel-max; streams and context keys draw row by row."""
    if noises and all(is_coupled(g) and g.context is None for g in noises):
        return CoupledRows(noises).choose(torch.log(probs.float()), torch.tensor(positions))
    return torch.stack([sample_from(probs[row : row + 1], g, positions=n, tokens=tokens[row, :n])[0]
                        for row, (g, n) in enumerate(zip(noises, positions))])


def uniform(shape: tuple[int, ...], noise: Noise = None, device: torch.device | str | None = None) -> torch.Tensor:
    """Uniform [0, 1) draws of ``shape``; with one noise per row of dimension 0, row by row (coupled noise: its
    auxiliary stream at the step's first position)."""
    if is_coupled(noise):
        noise = noise.generator()
    if _is_rows(noise):
        return torch.stack([torch.rand(shape[1:], generator=g, device=device) for g in noise])
    return torch.rand(shape, generator=noise, device=device)
