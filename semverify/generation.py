"""``semverify.generate``: the ``model.generate`` signature, decoded by the speculative loop."""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass

import torch
from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel, StoppingCriteriaList
from transformers.generation.utils import GenerateDecoderOnlyOutput

from .drafters import Drafter
from .engine.coupling import CoupledNoise
from .engine.loop import prompt_rows, speculative_generate
from .engine.noise import call_noise
from .engine.sampling import Sampler
from .generation_config import processors, refuse_unsupported, setting
from .generation_config import stopping_criteria as build_criteria
from .registry import DraftResources, RunContext, drafter_kind, get_rule, make_drafter
from .rules import BaseRule, check_draft_length
from .stats import SpecStats
from .types import eos_ids

DEFAULT_NUM_DRAFT_TOKENS = 5
PLANNED_MAX = 8  # num_assistant_tokens="auto": the planner chooses 0..8 draft tokens a step


@dataclass
class SpecGenerateOutput(GenerateDecoderOnlyOutput):
    """transformers' decoder-only output plus the call's `SpecStats`."""

    spec_stats: SpecStats | None = None


def generate(model: PreTrainedModel, inputs: torch.LongTensor | None = None, *, rule: str | BaseRule = "speculative",
             assistant_model: PreTrainedModel | None = None, drafter: Drafter | None = None,
             num_assistant_tokens: int | str | None = None, prompt_lookup_num_tokens: int | None = None,
             generation_config: GenerationConfig | None = None, streamer=None, tokenizer=None, assistant_tokenizer=None,
             attention_mask: torch.Tensor | None = None,  # [B, prompt length] 1 for real tokens, left-padded
             generator: torch.Generator | CoupledNoise | list[torch.Generator | CoupledNoise] | None = None,
             logits_processor: LogitsProcessorList | None = None, stopping_criteria: StoppingCriteriaList | None = None,
             acceptance: str | BaseRule | None = None, **kwargs) -> torch.LongTensor | SpecGenerateOutput:
    """Decode like ``model.generate``, verifying drafts with the acceptance ``rule``.

    A batch is left-padded with its ``attention_mask``, as transformers batches; each row keeps its own
    accepted lengths and stops at its own EOS, and with one generator per row (``generator=[...]``)
    draws exactly what it would draw alone. The drafter is ``assistant_model`` (a small model; a rule
    that verifies whole steps drafts steps with it), prompt lookup when ``prompt_lookup_num_tokens`` is
    set, a custom ``drafter``, or none (one target token per step). ``num_assistant_tokens`` (argument
    or config field) is the draft length k (default 5; a step rule's step cap 128);
    ``num_assistant_tokens_schedule="heuristic"`` adapts it per call (+2 after a fully accepted draft,
    -1 otherwise; transformers keeps it across calls); ``num_assistant_tokens="auto"`` plans it each step,
    0 to 8 tokens, for the most expected tokens per second from this machine's forward costs (measured once
    and cached; see `semverify.planner`), so a draft model that does not pay is not used.

    Sampling settings, ``max_new_tokens`` and ``eos_token_id`` come from ``kwargs`` and
    ``generation_config`` as in transformers, and so do the logits processors it builds
    (``repetition_penalty``, ``min_new_tokens``, ``no_repeat_ngram_size``, ``bad_words_ids``, ... plus
    ``logits_processor``), applied at every verified position with its own prefix and to the draft
    model's distribution; ``stop_strings`` (with ``tokenizer``), ``max_time`` and ``stopping_criteria``
    end a row at the first token after which they hold. Settings it does not do raise an error naming
    them (see `semverify.generation_config`). Returns the sequences, or with
    ``return_dict_in_generate=True`` a `SpecGenerateOutput` whose ``spec_stats`` holds the
    call's statistics. Random draws use ``generator`` or one seeded from torch's global RNG, so
    ``torch.manual_seed`` makes sampled runs repeatable; ``generator=CoupledNoise(seed)`` (one per row for a
    batch, see `semverify.engine.coupling`) draws every target token from noise keyed by (seed, position), so
    every lossless drafter gives the target alone's output for that seed. ``acceptance`` is the former name
    of ``rule``.
    """
    if acceptance is not None:
        warnings.warn("generate(acceptance=...) is now generate(rule=...)", FutureWarning, stacklevel=2)
        rule = acceptance
    input_ids, config = _prompt_and_config(model, inputs, generation_config, kwargs)  # input_ids: [B, prompt length]
    sampler = _sampler(model, config, prompt_rows(input_ids, attention_mask), logits_processor)
    rule = get_rule(rule, RunContext.for_decoding(None if assistant_model is None else assistant_model.name_or_path,
                                                  model.name_or_path, sampler.do_sample, sampler.temperature,
                                                  tokenizer))
    drafter, k = _pick_drafter(model, rule, assistant_model, drafter, num_assistant_tokens, prompt_lookup_num_tokens,
                               config, tokenizer, assistant_tokenizer)
    max_new = _max_new_tokens(config, input_ids.shape[1])
    generator = call_noise(generator, input_ids.shape[0], input_ids.device)
    if streamer is not None and input_ids.shape[0] == 1:
        streamer.put(input_ids.cpu())
    sequences, stats = speculative_generate(
        model, input_ids, drafter=drafter, rule=rule, k=k, max_new_tokens=max_new, sampler=sampler,
        eos_token_id=config.eos_token_id, generator=generator, streamer=streamer, attention_mask=attention_mask,
        pad_token_id=_pad_token_id(config), stopping_criteria=build_criteria(config, tokenizer, stopping_criteria))
    return SpecGenerateOutput(sequences=sequences, spec_stats=stats) if config.return_dict_in_generate else sequences


def _prompt_and_config(model: PreTrainedModel, inputs: torch.LongTensor | None,
                       generation_config: GenerationConfig | None,
                       kwargs: dict) -> tuple[torch.LongTensor, GenerationConfig]:
    """The prompt ids [B, prompt length] (``inputs``, else ``input_ids`` popped from ``kwargs``) and a copy of the
    generation config updated with ``kwargs``, refusing unknown and unsupported settings first."""
    input_ids = kwargs.pop("input_ids", None) if inputs is None else inputs
    if input_ids is None:
        raise ValueError("pass the prompt token ids as inputs or input_ids")
    config = copy.deepcopy(generation_config if generation_config is not None else model.generation_config)
    unknown = sorted(k for k in kwargs if not hasattr(config, k))
    if unknown:
        raise TypeError(f"generate() got unexpected keyword arguments: {', '.join(unknown)}")
    refuse_unsupported(config, kwargs)  # before transformers validates the settings it would not use here
    config.update(**kwargs)
    return input_ids, config


def _sampler(model: PreTrainedModel, config: GenerationConfig, prompts: list[torch.LongTensor],
             logits_processor: LogitsProcessorList | None) -> Sampler:
    """The call's sampling settings, with the logits processors that ``config`` and ``logits_processor`` ask for."""
    return Sampler(*(setting(config, name) for name in ("do_sample", "temperature", "top_k", "top_p")),
                   processors=processors(model, config, prompts, logits_processor))


def _max_new_tokens(config: GenerationConfig, prompt_length: int) -> int:
    """``max_new_tokens``, else what ``max_length`` leaves after the prompt."""
    if config.max_new_tokens is not None:
        return config.max_new_tokens
    return setting(config, "max_length") - prompt_length


def _pad_token_id(config: GenerationConfig) -> int | None:
    """The pad token of finished rows: ``pad_token_id``, else the first end-of-sequence token."""
    if config.pad_token_id is not None:
        return config.pad_token_id
    eos = eos_ids(config.eos_token_id)
    return eos[0] if eos else None


def _pick_drafter(model, rule, assistant_model, drafter, num_assistant_tokens, prompt_lookup_num_tokens,
                  config, tokenizer, assistant_tokenizer) -> tuple[Drafter, int]:
    """Which drafter serves this call, built through the registry, and the draft length k."""
    chosen = [name for name, v in (("assistant_model", assistant_model), ("drafter", drafter),
              ("prompt_lookup_num_tokens", prompt_lookup_num_tokens)) if v is not None]
    if len(chosen) > 1:
        raise ValueError(f"pass only one way to draft, got {' and '.join(chosen)}")
    planned = num_assistant_tokens == "auto"
    if planned:
        if assistant_model is None or rule.preferred_drafter != "model":
            raise ValueError('num_assistant_tokens="auto" plans a draft model\'s length: pass assistant_model= '
                             "with a token rule")
        num_assistant_tokens = PLANNED_MAX
    for name, value in (("num_assistant_tokens", num_assistant_tokens), ("prompt_lookup_num_tokens",
                                                                         prompt_lookup_num_tokens)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if assistant_model is not None:
        check_same_vocabulary(model, assistant_model, tokenizer, assistant_tokenizer)
    kind = ("prompt_lookup" if prompt_lookup_num_tokens is not None else  # a step rule drafts whole steps:
            rule.preferred_drafter if assistant_model is not None else "none")
    # the config's num_assistant_tokens counts tokens, not a step rule's step cap
    given = (prompt_lookup_num_tokens or num_assistant_tokens
             or (None if drafter_kind(kind).step_cap else config.num_assistant_tokens))
    if given:
        check_draft_length(rule, given)
    # a window rule's default draft is as long as its window
    k = given or max(DEFAULT_NUM_DRAFT_TOKENS if drafter is not None else drafter_kind(kind).default_k, rule.min_k)
    if drafter is not None:
        return drafter, k
    resources = DraftResources(draft_model=assistant_model, target_model=model, tokenizer=tokenizer,
                               eos_token_id=config.eos_token_id,
                               confidence_threshold=setting(config, "assistant_confidence_threshold"),
                               max_matching_ngram_size=setting(config, "max_matching_ngram_size"))
    schedule = config.num_assistant_tokens_schedule or "constant"
    if schedule not in ("constant", "heuristic", "heuristic_transient"):
        raise ValueError(f"num_assistant_tokens_schedule must be constant, heuristic or heuristic_transient, got "
                         f"{schedule!r}")
    if planned:
        return make_drafter(kind, resources, k, plan=True), k
    adaptive = {"adaptive": True, "start": k} if schedule != "constant" and kind == "model" else {}
    if adaptive:  # transformers' heuristic grows the draft length without a bound; here up to 4 x the start
        k = 4 * k
    return make_drafter(kind, resources, k, **adaptive), k


def check_same_vocabulary(target, assistant, tokenizer=None, assistant_tokenizer=None) -> None:
    """Refuse a draft model whose token ids do not mean the same as the target's."""
    v_t = target.config.get_text_config().vocab_size
    v_d = assistant.config.get_text_config().vocab_size
    if v_t != v_d:
        raise ValueError(
            f"assistant_model has a vocabulary of {v_d} tokens but the target has {v_t}; speculative "
            "decoding here needs the same tokenizer and vocabulary for both models"
        )
    if (tokenizer is not None and assistant_tokenizer is not None
            and tokenizer.get_vocab() != assistant_tokenizer.get_vocab()):
        raise ValueError("assistant_tokenizer differs from tokenizer: the two models must share one vocabulary")
