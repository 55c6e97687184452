"""``semverify.generate``: the ``model.generate`` signature, decoded by the speculative loop."""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass

import torch
from transformers import GenerationConfig, PreTrainedModel
from transformers.generation.utils import GenerateDecoderOnlyOutput

from .drafters import Drafter
from .loop import speculative_generate
from .registry import DraftResources, RunContext, drafter_kind, get_rule, make_drafter
from .rules import AcceptanceRule
from .sampling import Sampler
from .stats import SpecStats
from .types import eos_ids

DEFAULT_NUM_DRAFT_TOKENS = 5

# transformers' defaults for the fields semverify reads when a config leaves them unset.
_DEFAULTS = {
    "do_sample": False, "temperature": 1.0, "top_k": 50, "top_p": 1.0, "max_length": 20,
    "assistant_confidence_threshold": 0.4, "max_matching_ngram_size": 2,
}
# Logits processors and search modes the loop does not apply yet, with their neutral values.
_UNSUPPORTED = {
    "num_beams": (None, 1), "num_return_sequences": (None, 1), "repetition_penalty": (None, 1.0),
    "no_repeat_ngram_size": (None, 0), "min_new_tokens": (None, 0), "min_length": (None, 0),
    "typical_p": (None, 1.0), "min_p": (None,), "epsilon_cutoff": (None, 0.0), "eta_cutoff": (None, 0.0),
    "bad_words_ids": (None,), "sequence_bias": (None,), "suppress_tokens": (None,),
    "begin_suppress_tokens": (None,), "forced_bos_token_id": (None,), "forced_eos_token_id": (None,),
    "output_scores": (None, False), "output_logits": (None, False), "output_attentions": (None, False),
    "output_hidden_states": (None, False), "guidance_scale": (None, 1.0),
}


@dataclass
class SpecGenerateOutput(GenerateDecoderOnlyOutput):
    """transformers' decoder-only output plus the call's :class:`SpecStats`."""

    spec_stats: SpecStats | None = None


def generate(
    model: PreTrainedModel,
    inputs: torch.LongTensor | None = None,
    *,
    rule: str | AcceptanceRule = "speculative",
    assistant_model: PreTrainedModel | None = None,
    drafter: Drafter | None = None,
    num_assistant_tokens: int | None = None,
    prompt_lookup_num_tokens: int | None = None,
    generation_config: GenerationConfig | None = None,
    streamer=None,
    tokenizer=None,
    assistant_tokenizer=None,
    attention_mask: torch.Tensor | None = None,
    generator: torch.Generator | list[torch.Generator] | None = None,
    acceptance: str | AcceptanceRule | None = None,
    **kwargs,
) -> torch.LongTensor | SpecGenerateOutput:
    """Decode like ``model.generate``, verifying drafts with the acceptance ``rule``.

    A batch is left-padded with its ``attention_mask``, as transformers batches; each row keeps its own
    accepted lengths and stops at its own EOS, and with one generator per row (``generator=[...]``)
    draws exactly what it would draw alone.

    The drafter is ``assistant_model`` (a small model; a rule that verifies whole steps drafts steps
    with it), prompt lookup when ``prompt_lookup_num_tokens`` is set, a custom ``drafter``, or none
    (one target token per step). ``num_assistant_tokens`` (argument or config field) is the draft
    length k (default 5; a step rule's step cap 128). Sampling settings, ``max_new_tokens`` and
    ``eos_token_id`` come from ``kwargs`` and ``generation_config`` as in transformers. Returns the
    sequences, or with ``return_dict_in_generate=True`` a :class:`SpecGenerateOutput` whose
    ``spec_stats`` holds the call's statistics. Random draws use ``generator`` or one seeded from
    torch's global RNG, so ``torch.manual_seed`` makes sampled runs repeatable. ``acceptance`` is the
    former name of ``rule``.
    """
    if acceptance is not None:
        warnings.warn("generate(acceptance=...) is now generate(rule=...)", FutureWarning, stacklevel=2)
        rule = acceptance
    input_ids = kwargs.pop("input_ids", None) if inputs is None else inputs
    if input_ids is None:
        raise ValueError("pass the prompt token ids as inputs or input_ids")
    config = copy.deepcopy(generation_config if generation_config is not None else model.generation_config)
    unused = config.update(**kwargs)
    if unused:
        raise TypeError(f"generate() got unexpected keyword arguments: {', '.join(sorted(unused))}")
    _refuse_unsupported(config)

    sampler = Sampler(*(_setting(config, name) for name in ("do_sample", "temperature", "top_k", "top_p")))
    context = RunContext.for_decoding(getattr(assistant_model, "name_or_path", None), model.name_or_path,
                                      sampler.do_sample, sampler.temperature, tokenizer)
    rule = get_rule(rule, context)
    drafter, k = _pick_drafter(model, rule, assistant_model, drafter, num_assistant_tokens, prompt_lookup_num_tokens,
                               config, tokenizer, assistant_tokenizer)
    max_new = config.max_new_tokens
    if max_new is None:
        max_new = _setting(config, "max_length") - input_ids.shape[1]
    generator = row_generators(generator, input_ids.shape[0], input_ids.device)
    if streamer is not None and input_ids.shape[0] == 1:
        streamer.put(input_ids.cpu())
    eos = eos_ids(config.eos_token_id)
    sequences, stats = speculative_generate(
        model, input_ids, drafter=drafter, rule=rule, num_draft_tokens=k,
        max_new_tokens=max_new, sampler=sampler, eos_token_id=config.eos_token_id,
        generator=generator, streamer=streamer, attention_mask=attention_mask,
        pad_token_id=config.pad_token_id if config.pad_token_id is not None else (eos[0] if eos else None),
    )
    if config.return_dict_in_generate:
        return SpecGenerateOutput(sequences=sequences, spec_stats=stats)
    return sequences


def row_generators(generator: torch.Generator | list[torch.Generator] | None, batch: int,
                   device: torch.device | str = "cpu") -> torch.Generator | list[torch.Generator]:
    """The random streams of a call: ``generator`` as given for one row (a fresh one seeded from torch's
    global RNG when None), else one per row, each seeded from ``generator`` (or the global RNG) in row
    order, so a row's draws do not depend on the other rows' content."""
    if isinstance(generator, (list, tuple)):
        if len(generator) != batch:
            raise ValueError(f"pass one generator per row: got {len(generator)} for a batch of {batch}")
        return list(generator)
    if batch == 1 and generator is not None:
        return generator
    seeds = [int(torch.randint(2**62, (1,), generator=generator)) for _ in range(batch)]
    streams = [torch.Generator(device=device).manual_seed(seed) for seed in seeds]
    return streams[0] if batch == 1 else streams


def _setting(config: GenerationConfig, name: str):
    """A config field, or transformers' default for it when the config leaves it unset."""
    value = getattr(config, name, None)
    return _DEFAULTS.get(name) if value is None else value


def _refuse_unsupported(config: GenerationConfig) -> None:
    bad = [f"{name}={getattr(config, name)!r}" for name, neutral in _UNSUPPORTED.items()
           if getattr(config, name, None) not in neutral]
    if bad:
        raise NotImplementedError(
            f"semverify.generate does not apply {', '.join(bad)} yet; pass neutral values to decode without them"
        )


def _pick_drafter(model, rule, assistant_model, drafter, num_assistant_tokens, prompt_lookup_num_tokens,
                  config, tokenizer, assistant_tokenizer) -> tuple[Drafter, int]:
    """Which drafter serves this call, built through the registry, and the draft length k."""
    chosen = [name for name, v in (("assistant_model", assistant_model), ("drafter", drafter),
              ("prompt_lookup_num_tokens", prompt_lookup_num_tokens)) if v is not None]
    if len(chosen) > 1:
        raise ValueError(f"pass only one way to draft, got {' and '.join(chosen)}")
    for name, value in (("num_assistant_tokens", num_assistant_tokens), ("prompt_lookup_num_tokens",
                                                                         prompt_lookup_num_tokens)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if assistant_model is not None:
        check_same_vocabulary(model, assistant_model, tokenizer, assistant_tokenizer)
    kind = ("prompt_lookup" if prompt_lookup_num_tokens is not None else  # a step rule drafts whole steps:
            getattr(rule, "preferred_drafter", "model") if assistant_model is not None else "none")
    # the config's num_assistant_tokens counts tokens, not a step rule's step cap
    k = (prompt_lookup_num_tokens or num_assistant_tokens or (None if kind == "step" else config.num_assistant_tokens)
         or (DEFAULT_NUM_DRAFT_TOKENS if drafter is not None else drafter_kind(kind).default_k))
    if drafter is not None:
        return drafter, k
    resources = DraftResources(draft_model=assistant_model, tokenizer=tokenizer, eos_token_id=config.eos_token_id,
                               confidence_threshold=_setting(config, "assistant_confidence_threshold"),
                               max_matching_ngram_size=_setting(config, "max_matching_ngram_size"))
    return make_drafter(kind, resources, k), k


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
