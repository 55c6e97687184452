"""An lm-evaluation-harness model that generates through semverify (``pip install 'semverify[lm-eval]'``).

``lm-eval run --model semverify --model_args pretrained=T,assistant_model=D,rule=easd,num_assistant_tokens=5``
(or ``prompt_lookup_num_tokens=10``) evaluates any lm-eval task: ``generate_until`` decodes with
`semverify.generate`, stopping at the task's ``until`` strings after at most ``max_gen_toks``
tokens, and the likelihood requests are scored by plain target forward passes. With ``stats_path``,
tau, alpha and tokens/s of every generation are written there, beside lm-eval's results
(``semverify lm-eval`` sets it from ``--output_path``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm.auto import tqdm

from .generation import generate
from .models import load_model
from .registry import available_rules
from .stats import SpecStats

ARGS = ("pretrained", "assistant_model", "rule", "acceptance", "num_assistant_tokens", "prompt_lookup_num_tokens",
        "dtype", "max_gen_toks", "max_length", "stats_path", "seed", "device")


@register_model("semverify")
class SemverifyLM(TemplateLM):
    """lm-eval's view of a target model decoded by semverify's speculative loop. Requests are decoded one
    at a time (each has its own stop strings), so lm-eval's ``batch_size`` does not change anything."""

    def __init__(self, pretrained: str, assistant_model: str | None = None, rule: str | None = None,
                 acceptance: str | None = None, num_assistant_tokens: int | None = None,
                 prompt_lookup_num_tokens: int | None = None, dtype: str = "bfloat16", max_gen_toks: int = 256,
                 max_length: int = 4096, stats_path: str | None = None, seed: int = 0, batch_size=1,
                 max_batch_size=None, device: str = "cpu", **unknown) -> None:
        super().__init__()
        if unknown:
            raise ValueError(f"semverify's lm-eval model does not take {', '.join(sorted(unknown))}; it takes "
                             f"{', '.join(ARGS)}")
        if assistant_model and prompt_lookup_num_tokens:
            raise ValueError("give assistant_model or prompt_lookup_num_tokens, not both")
        self.rule = rule or acceptance or "speculative"
        if self.rule not in available_rules():
            raise ValueError(f"unknown rule {self.rule!r}; available: {', '.join(available_rules())}")
        self.model, self.tokenizer = load_model(pretrained, dtype=dtype, device=device)
        self.draft = load_model(assistant_model, dtype=dtype, device=device)[0] if assistant_model else None
        if self.draft is not None:
            self.drafting = {"assistant_model": self.draft, "num_assistant_tokens": _int(num_assistant_tokens)}
        elif prompt_lookup_num_tokens:
            self.drafting = {"prompt_lookup_num_tokens": _int(prompt_lookup_num_tokens)}
        else:
            self.drafting = {}
        self.pretrained, self.max_gen_toks, self.max_length = pretrained, int(max_gen_toks), int(max_length)
        self.stats_path = Path(stats_path) if stats_path else None
        self.generator = torch.Generator().manual_seed(int(seed))
        self.stats: list[dict] = []
        self._device = torch.device(device)
        self._rank, self._world_size = 0, 1

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer.name_or_path.replace("/", "__")

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return self.tokenizer.chat_template if chat_template else None

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(chat_history, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return self.tokenizer(string, add_special_tokens=bool(add_special_tokens)).input_ids

    @torch.inference_mode()
    def _token_logprobs(self, tokens: list[int], score_from: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probabilities of ``tokens[score_from:]`` given what precedes them, and whether each is the argmax."""
        logits = self.model(torch.tensor([tokens[-self.max_length :]])).logits[0].float()
        start = score_from - max(0, len(tokens) - self.max_length)
        logp = logits[start - 1 : -1].log_softmax(-1)
        target = torch.tensor(tokens[-self.max_length :][start:])
        return logp.gather(-1, target[:, None])[:, 0], logp.argmax(-1) == target

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        results = []
        for _, context, continuation in tqdm(requests, desc="loglikelihood", disable=disable_tqdm):
            logp, greedy = self._token_logprobs(context + continuation, len(context))
            results.append((float(logp.sum()), bool(greedy.all())))
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        results = []
        for (text,) in tqdm([r.args for r in requests], desc="loglikelihood_rolling", disable=disable_tqdm):
            windows = map(make_disjoint_window, get_rolling_token_windows(
                token_list=self.tok_encode(text), prefix_token=self.prefix_token_id, max_seq_len=self.max_length,
                context_len=1))
            results.append(sum(float(self._token_logprobs(c + p, len(c))[0].sum()) for c, p in windows))
        return results

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        outputs = []
        for context, gen_kwargs in tqdm([r.args for r in requests], desc="generate_until", disable=disable_tqdm):
            kwargs = dict(gen_kwargs)
            until = kwargs.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(kwargs.pop("max_gen_toks", self.max_gen_toks))
            do_sample = bool(kwargs.pop("do_sample", False)) and float(kwargs.get("temperature", 1.0) or 0) > 0
            sampling = {k: kwargs.pop(k) for k in ("temperature", "top_k", "top_p") if k in kwargs} if do_sample else {}
            for k in ("temperature", "top_k", "top_p"):
                kwargs.pop(k, None)
            if kwargs:
                raise ValueError(f"semverify's lm-eval model does not take the generation arguments "
                                 f"{', '.join(sorted(kwargs))}")
            ids = self.tokenizer(context, return_tensors="pt", add_special_tokens=False).input_ids
            started = time.perf_counter()
            out = generate(self.model, ids, rule=self.rule, tokenizer=self.tokenizer, max_new_tokens=max_new,
                           do_sample=do_sample, stop_strings=until or None, generator=self.generator,
                           return_dict_in_generate=True, **sampling, **self.drafting)
            text = self.tokenizer.decode(out.sequences[0, ids.shape[1] :], skip_special_tokens=True)
            for stop in until:  # lm-eval takes the continuation up to its first stop sequence
                text = text.split(stop)[0]
            outputs.append(text)
            self._record(out.spec_stats, time.perf_counter() - started)
        return outputs

    def _record(self, stats: SpecStats, seconds: float) -> None:
        """Keep one generation's statistics, and rewrite ``stats_path`` with all of them and their totals."""
        self.stats.append({"new_tokens": stats.new_tokens, "steps": stats.steps, "tau": stats.tau,
                           "alpha": stats.alpha, "tokens_per_second": stats.new_tokens / seconds if seconds else 0.0})
        if self.stats_path is None:
            return
        tokens, steps = sum(s["new_tokens"] for s in self.stats), sum(s["steps"] for s in self.stats)
        drafted = [s["alpha"] for s in self.stats if s["steps"]]
        summary = {"model": self.pretrained, "rule": self.rule,
                   "drafter": "assistant_model" if self.draft is not None else next(iter(self.drafting), "none"),
                   "generations": len(self.stats), "tau": tokens / steps if steps else 0.0,
                   "alpha_mean": sum(drafted) / len(drafted) if drafted else 0.0,
                   "tokens_per_second_median": sorted(s["tokens_per_second"] for s in self.stats)[len(self.stats) // 2],
                   "per_generation": self.stats}
        self.stats_path.parent.mkdir(parents=True, exist_ok=True)
        self.stats_path.write_text(json.dumps(summary, indent=2))


def _int(value) -> int | None:
    return None if value is None else int(value)
