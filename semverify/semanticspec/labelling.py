"""Probe training data drawn where the probes are used.

At inference a drafted step follows a prefix the models wrote themselves, cut where the step drafter
cuts, and the target probe reads the target's states over a *draft* step. So the data is built the
same way: prefixes are the models' own sampled answers to train prompts, cut at the step ends the
:class:`StepSegmenter` finds in their token ids; at each prefix both models sample one-step
continuations in a batch, and the target reads every draft step in one more batched forward (its
features, and its token statistics over the step, for the token-level rules). One file per prefix
under ``work/samples``; a killed run resumes where it stopped.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import torch
from tqdm.auto import tqdm
from transformers import StoppingCriteria, StoppingCriteriaList

from ..answers import Answer, generate_answers
from ..cache import new_cache
from ..rules import entropy
from ..sampling import Sampler
from ..types import eos_ids
from .segment import StepSegmenter

# per-token statistics of a model's distribution at each step token, in this column order
STATS = ("logp", "logp_warped", "rank", "top_prob", "entropy")


@dataclass(frozen=True)
class LabelSettings:
    """How probe data is drawn. Sampling matches the runs the probes serve (T=0.7, no top-p)."""

    samples: int = 8  # one-step continuations per model and prefix (the authors: 20)
    temperature: float = 0.7
    top_p: float = 1.0
    max_step_tokens: int = 128  # the step cap of the `semanticspec` method
    per_answer: int = 3  # prefixes cut from one answer
    answer_tokens: int = 384
    seed: int = 0

    @property
    def sampler(self) -> Sampler:
        return Sampler(do_sample=True, temperature=self.temperature, top_p=self.top_p)


def step_ends(ids: Sequence[int], segmenter: StepSegmenter) -> list[int]:
    """Offsets in an answer's token ids after which the step drafter closes a step (break or cap)."""
    ends, start = [], 0
    for i in range(len(ids)):
        if segmenter.ends_step(list(ids[start : i + 1])):
            ends.append(i + 1)
            start = i + 1
    return ends


def prefix_cuts(ids: Sequence[int], segmenter: StepSegmenter, per_answer: int, rng: random.Random) -> list[int]:
    """Up to ``per_answer`` step ends of an answer, chosen at random, after which another step follows.

    The first step is always the target's (``target_first_step``), so a cut comes after at least one step.
    """
    ends = [e for e in step_ends(ids, segmenter) if e < len(ids)]
    return sorted(rng.sample(ends, min(per_answer, len(ends))))


def token_stats(logits: torch.Tensor, tokens: torch.LongTensor, sampler: Sampler) -> torch.Tensor:
    """[..., 5] statistics (``STATS``) of raw ``logits`` [..., V] at the chosen ``tokens`` [...]."""
    logits = logits.float()
    chosen = logits.gather(-1, tokens[..., None]).squeeze(-1)
    warped = sampler.probs(logits)
    return torch.stack([
        chosen - logits.logsumexp(-1),
        warped.gather(-1, tokens[..., None]).squeeze(-1).clamp_min(1e-30).log(),
        (logits > chosen[..., None]).sum(-1).float(),
        warped.max(-1).values,
        entropy(warped),
    ], dim=-1)


class _StepEnds(StoppingCriteria):
    """Per-row stop for ``model.generate``: the tokens after ``start`` form a complete step."""

    def __init__(self, segmenter: StepSegmenter, start: int) -> None:
        self.segmenter, self.start = segmenter, start

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        return torch.tensor([self.segmenter.ends_step(row[self.start :].tolist()) for row in input_ids])


@torch.inference_mode()
def sample_steps(model, prefixes: Sequence[Sequence[int]], segmenter: StepSegmenter, settings: LabelSettings,
                 pad_id: int, emitting: bool = False) -> list[dict]:
    """``settings.samples`` one-step continuations of each prefix, all in one left-padded batch drawn by
    ``model.generate`` from torch's global generator (seed it first).

    Returns per prefix the steps' ids and, with ``emitting``, the mean last-layer state of the positions
    that emitted each step's tokens (the draft probe's feature).
    """
    n = settings.samples
    width = max(map(len, prefixes))
    rows = [[pad_id] * (width - len(p)) + list(p) for p in prefixes for _ in range(n)]
    mask = [[0] * (width - len(p)) + [1] * len(p) for p in prefixes for _ in range(n)]
    out = model.generate(input_ids=torch.tensor(rows), attention_mask=torch.tensor(mask), do_sample=True,
                         temperature=settings.temperature, top_p=settings.top_p, top_k=0,
                         max_new_tokens=segmenter.max_step_tokens, pad_token_id=pad_id,
                         stopping_criteria=StoppingCriteriaList([_StepEnds(segmenter, width)]),
                         output_hidden_states=emitting, return_dict_in_generate=True)
    new = out.sequences[:, width:].tolist()
    eos = set(eos_ids(model.generation_config.eos_token_id))
    steps = [_cut_step(row, segmenter, eos) for row in new]
    if emitting:  # hidden_states[j][-1]: the last layer when token j was emitted ([:, -1] of the prefill at j=0)
        states = torch.stack([h[-1][:, -1].float() for h in out.hidden_states], dim=1)
        pooled = [states[r, : len(step)].mean(0).half() for r, step in enumerate(steps)]
    return [{"ids": steps[i * n : (i + 1) * n],
             **({"emitting": torch.stack(pooled[i * n : (i + 1) * n])} if emitting else {})}
            for i in range(len(prefixes))]


def _cut_step(row: list[int], segmenter: StepSegmenter, eos: set[int]) -> list[int]:
    """A generated row up to the end of its first step (a break, the cap, or EOS), padding dropped."""
    for j, token in enumerate(row):
        if token in eos or segmenter.ends_step(row[: j + 1]):
            return row[: j + 1]
    return row


@torch.inference_mode()
def read_steps(model, prefix: Sequence[int], steps: list[list[int]], sampler: Sampler) -> dict:
    """``model``'s view of given continuations of ``prefix``, as a verification prefill sees them: the
    mean and last last-layer state at the step's tokens and ``STATS`` at every step token. One forward
    over the right-padded steps on a shared prefix cache (causal attention: padding is never seen)."""
    n, width = len(steps), max(map(len, steps))
    cache = new_cache(model)
    out = model(input_ids=torch.tensor([list(prefix)]), cache=cache, use_cache=True, logits_to_keep=1)
    first = out.logits[:, -1:]
    cache.batch_repeat_interleave(n)
    batch = torch.zeros(n, width, dtype=torch.long)
    for r, step in enumerate(steps):
        batch[r, : len(step)] = torch.tensor(step)
    out = model(input_ids=batch, cache=cache, use_cache=True, output_hidden_states=True)
    h = out.hidden_states[-1].float()
    mean, last, stats = [], [], []
    for r, step in enumerate(steps):
        m = len(step)
        logits = torch.cat([first[0], out.logits[r, : m - 1]])  # row j predicts step token j
        mean.append(h[r, :m].mean(0))
        last.append(h[r, m - 1])
        stats.append(token_stats(logits, batch[r, :m], sampler).half())
    return {"tokens_mean": torch.stack(mean).half(), "tokens_last": torch.stack(last).half(), "stats": stats}


def sample_prefixes(target, draft, prefixes: Sequence[Sequence[int]], segmenter: StepSegmenter,
                    settings: LabelSettings, pad_id: int) -> list[dict]:
    """Both models' samples at each prefix (one batch per model), then the target's reading of all of them:
    per prefix ``{"target": {ids, tokens_mean, tokens_last, stats}, "draft": {ids, emitting, tokens_mean,
    tokens_last, stats}}`` where the features and statistics are always the target's, except ``emitting``."""
    own = sample_steps(target, prefixes, segmenter, settings, pad_id)
    drafted = sample_steps(draft, prefixes, segmenter, settings, pad_id, emitting=True)
    results = []
    for prefix, mine, theirs in zip(prefixes, own, drafted):
        n = len(mine["ids"])
        read = read_steps(target, prefix, mine["ids"] + theirs["ids"], settings.sampler)
        own, drafted = ({k: read[k][rows] for k in ("tokens_mean", "tokens_last", "stats")}
                        for rows in (slice(0, n), slice(n, None)))
        results.append({"target": {"ids": mine["ids"], **own},
                        "draft": {"ids": theirs["ids"], "emitting": theirs["emitting"], **drafted}})
    return results


def answer_prefixes(answers: Sequence[tuple[int, str, Answer]], tokenizer, segmenter: StepSegmenter,
                    settings: LabelSettings) -> list[dict]:
    """The prefixes to sample at: (problem, who answered, token ids), in problem order, so that adding
    problems later appends prefixes and keeps the numbering of those already sampled."""
    rng = random.Random(settings.seed)
    prefixes = []
    for problem, source, answer in answers:
        prompt = tokenizer(answer.prompt, add_special_tokens=False).input_ids
        for cut in prefix_cuts(answer.ids, segmenter, settings.per_answer, rng):
            prefixes.append({"problem": problem, "source": source, "cut": cut, "ids": prompt + list(answer.ids[:cut])})
    return prefixes


def collect(target, draft, tokenizer, prompts: Sequence[str], work: str | os.PathLike,
            settings: LabelSettings = LabelSettings(), answer_batch: int = 8, group: int = 4,
            progress: bool = True) -> Path:
    """Everything probe training needs from the models, into ``work`` (resumable):

    1. sampled answers to ``prompts``: even-numbered prompts answered by the target, odd ones by the
       draft (``answers-target.jsonl``, ``answers-draft.jsonl``), since accepted draft steps and target
       steps both make up the prefixes a step is judged after;
    2. up to ``settings.per_answer`` prefixes per answer (``prefixes.jsonl``);
    3. ``samples/NNNNN.pt`` per prefix: :func:`sample_prefixes` over ``group`` prefixes at a time (wider
       batches use the CPU better), seeded by the group's first prefix.
    """
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    _check_settings(work, settings)
    segmenter = StepSegmenter(tokenizer, max_step_tokens=settings.max_step_tokens)
    answers = []
    for source, model, parity in (("target", target, 0), ("draft", draft, 1)):
        mine = list(range(parity, len(prompts), 2))
        got = generate_answers(model, tokenizer, [prompts[i] for i in mine], work / f"answers-{source}.jsonl",
                               answer_batch, settings.answer_tokens, do_sample=True,
                               temperature=settings.temperature, seed=settings.seed + parity, progress=progress,
                               desc=f"{source} answers")
        by_prompt = {a.prompt: a for a in got}
        answers += [(i, source, by_prompt[prompts[i]]) for i in mine if prompts[i] in by_prompt]
    prefixes = answer_prefixes(sorted(answers, key=lambda a: a[0]), tokenizer, segmenter, settings)
    (work / "prefixes.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prefixes))
    folder = work / "samples"
    folder.mkdir(exist_ok=True)
    todo = [i for i in range(len(prefixes)) if not (folder / f"{i:05d}.pt").exists()]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    bar = tqdm(total=len(prefixes), initial=len(prefixes) - len(todo), desc="sample steps", unit="prefix",
               disable=not progress)
    for start in range(0, len(todo), group):
        chunk = todo[start : start + group]
        torch.manual_seed(settings.seed * 1_000_003 + chunk[0])  # generate() draws from the global generator
        results = sample_prefixes(target, draft, [prefixes[i]["ids"] for i in chunk], segmenter, settings, pad_id)
        for i, data in zip(chunk, results):
            for side in ("target", "draft"):
                data[side]["text"] = [tokenizer.decode(ids) for ids in data[side]["ids"]]
            data.update(prefix=prefixes[i], prefix_text=tokenizer.decode(prefixes[i]["ids"]))
            path = folder / f"{i:05d}.pt"
            tmp = path.with_name(path.name + ".tmp")
            torch.save(data, tmp)
            os.replace(tmp, path)
        bar.update(len(chunk))
    bar.close()
    return folder


def _check_settings(work: Path, settings: LabelSettings) -> None:
    """Record the settings in ``work/settings.json``; refuse to resume a folder drawn with other ones."""
    path = work / "settings.json"
    mine = asdict(settings)
    if path.is_file():
        theirs = json.loads(path.read_text())
        if theirs != mine:
            diff = ", ".join(f"{k}: {theirs.get(k)} there, {v} now" for k, v in mine.items() if theirs.get(k) != v)
            raise ValueError(f"{work} holds probe data drawn with other settings ({diff}); use another folder")
        return
    path.write_text(json.dumps(mine, indent=2))
