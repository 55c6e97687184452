"""Probe training data drawn where the probes are used.

At inference a drafted step follows a prefix the models wrote themselves, cut where the step drafter
cuts, and the target probe reads the target's states over a *draft* step. So the data is built the
same way: prefixes are the models' own sampled answers to train prompts, cut at the step ends the
`StepSegmenter` finds in their token ids; at each prefix both models sample one-step
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

from ..answers import Answer, generate_answers
from ..engine.cache import new_cache
from ..engine.noise import sample_from
from ..engine.sampling import Sampler
from ..rules import entropy
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


@torch.inference_mode()
def sample_steps(model, prefixes: Sequence[Sequence[int]], segmenter: StepSegmenter, settings: LabelSettings,
                 pad_id: int, generator: torch.Generator) -> list[dict]:
    """``settings.samples`` one-step continuations of each prefix, drawn with ``generator``.

    The prefixes are prefilled once, in one left-padded batch, and each row is repeated per sample; a
    row leaves the batch one forward after its step ends (that forward gives the state at its last
    token), so stragglers run alone. Returns per prefix the steps' ids, the mean last-layer state of the
    positions that emitted them (``emitting``: the draft probe's feature), the mean and last state at
    the step's own positions (``tokens_mean``/``tokens_last``: the target probe's) and the model's own
    ``STATS`` at each step token.
    """
    n, sampler, cap = settings.samples, settings.sampler, segmenter.max_step_tokens
    width = max(map(len, prefixes))
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prefixes])
    ids = torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in prefixes])
    cache = new_cache(model)
    out = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp_min(0), cache=cache,
                use_cache=True, logits_to_keep=1, output_hidden_states=True)
    cache.batch_repeat_interleave(n)
    mask, position = mask.repeat_interleave(n, 0), (mask.sum(-1) - 1).repeat_interleave(n)
    logits = out.logits[:, -1].float().repeat_interleave(n, 0)
    state = out.hidden_states[-1][:, -1].float().repeat_interleave(n, 0)
    rows = len(prefixes) * n
    steps, emitting, at, stats = ([[] for _ in range(rows)] for _ in range(4))
    done, active = [False] * rows, list(range(rows))
    eos = set(eos_ids(model.generation_config.eos_token_id))
    while active:
        token = sample_from(sampler.probs(logits), generator)
        token_stat = token_stats(logits, token, sampler)
        keep = []
        for i, r in enumerate(active):
            if steps[r]:
                at[r].append(state[i])  # the state at the token fed last
            if done[r]:
                continue  # that forward fed its final token: the row leaves the batch
            steps[r].append(int(token[i]))
            emitting[r].append(state[i])
            stats[r].append(token_stat[i])
            done[r] = segmenter.ends_step(steps[r]) or int(token[i]) in eos or len(steps[r]) >= cap
            keep.append(i)
        if not keep:
            break
        index = torch.tensor(keep)
        if len(keep) < len(active):
            cache.batch_select_indices(index)
            mask, position = mask[index], position[index]
        mask, position = torch.cat([mask, torch.ones(len(keep), 1, dtype=mask.dtype)], dim=1), position + 1
        out = model(input_ids=token[index, None], attention_mask=mask, position_ids=position[:, None], cache=cache,
                    use_cache=True, logits_to_keep=1, output_hidden_states=True)
        logits, state = out.logits[:, -1].float(), out.hidden_states[-1][:, -1].float()
        active = [active[i] for i in keep]
    pooled = lambda states: torch.stack(states).mean(0).half()  # noqa: E731
    return [{"ids": [steps[r] for r in group],
             "emitting": torch.stack([pooled(emitting[r]) for r in group]),
             "tokens_mean": torch.stack([pooled(at[r]) for r in group]),
             "tokens_last": torch.stack([at[r][-1].half() for r in group]),
             "stats": [torch.stack(stats[r]).half() for r in group]}
            for group in (range(i * n, (i + 1) * n) for i in range(len(prefixes)))]


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
                    settings: LabelSettings, pad_id: int, generator: torch.Generator) -> list[dict]:
    """Both models' samples at each prefix, and the target's reading of the draft's: per prefix
    ``{"target": {ids, tokens_mean, tokens_last, stats}, "draft": {ids, emitting, tokens_mean, tokens_last,
    stats, draft_stats}}``, where the draft's ``tokens_*`` and ``stats`` are the target's over its steps."""
    own = sample_steps(target, prefixes, segmenter, settings, pad_id, generator)
    drafted = sample_steps(draft, prefixes, segmenter, settings, pad_id, generator)
    results = []
    for prefix, mine, theirs in zip(prefixes, own, drafted):
        read = read_steps(target, prefix, theirs["ids"], settings.sampler)
        results.append({"target": {k: mine[k] for k in ("ids", "tokens_mean", "tokens_last", "stats")},
                        "draft": {"ids": theirs["ids"], "emitting": theirs["emitting"], "draft_stats": theirs["stats"],
                                  **read}})
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
    3. ``samples/NNNNN.pt`` per prefix: `sample_prefixes` over ``group`` prefixes at a time (wider
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
        g = torch.Generator().manual_seed(settings.seed * 1_000_003 + chunk[0])
        results = sample_prefixes(target, draft, [prefixes[i]["ids"] for i in chunk], segmenter, settings, pad_id, g)
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


def drawn_settings(work: str | os.PathLike) -> LabelSettings:
    """The settings the samples under ``work`` were drawn with."""
    path = Path(work) / "settings.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: no probe data was drawn in {work}")
    return LabelSettings(**json.loads(path.read_text()))


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
