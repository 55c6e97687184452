"""What ``semverify.generate`` does with each ``GenerationConfig`` field: every field is honoured, only
accepted at a neutral value (a clear error names it otherwise), or is bookkeeping. Nothing set is
silently ignored; a test walks the config's fields so a new transformers field cannot slip through.

Logits processors and warpers come from transformers itself (the list ``model.generate`` would build),
and stop strings, ``max_time`` and custom stopping criteria from its criteria classes.
"""

from __future__ import annotations

import copy
from typing import Sequence

import torch
from transformers import GenerationConfig, LogitsProcessorList, PreTrainedModel, StoppingCriteriaList
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper
from transformers.generation.stopping_criteria import MaxTimeCriteria, StopStringCriteria

# transformers' defaults for the fields semverify reads when a config leaves them unset
DEFAULTS = {
    "do_sample": False, "temperature": 1.0, "top_k": 50, "top_p": 1.0, "max_length": 20,
    "assistant_confidence_threshold": 0.4, "max_matching_ngram_size": 2,
}

# honoured: sampling, lengths, special tokens, drafting, stopping, and every logits processor/warper
HONOURED = {
    "do_sample", "temperature", "top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff", "top_h",
    "max_new_tokens", "max_length", "min_new_tokens", "min_length", "eos_token_id", "pad_token_id",
    "repetition_penalty", "encoder_repetition_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size",
    "bad_words_ids", "suppress_tokens", "begin_suppress_tokens", "sequence_bias", "forced_bos_token_id",
    "forced_eos_token_id", "exponential_decay_length_penalty", "remove_invalid_values", "renormalize_logits",
    "stop_strings", "max_time", "num_assistant_tokens", "assistant_confidence_threshold", "prompt_lookup_num_tokens",
    "max_matching_ngram_size", "return_dict_in_generate", "num_assistant_tokens_schedule",
}
# accepted only at these values: other search modes, outputs and cache settings the loop does not do
NEUTRAL = {
    "num_beams": (None, 1), "num_beam_groups": (None, 1), "num_return_sequences": (None, 1),
    "diversity_penalty": (None, 0.0), "length_penalty": (None, 1.0), "early_stopping": (None, False),
    "constraints": (None,), "force_words_ids": (None,), "penalty_alpha": (None,), "dola_layers": (None,),
    "low_memory": (None, False), "guidance_scale": (None, 1.0), "watermarking_config": (None,),
    "token_healing": (None, False), "prefill_chunk_size": (None,), "output_scores": (None, False),
    "output_logits": (None, False), "output_attentions": (None, False), "output_hidden_states": (None, False),
    "use_cache": (None, True), "cache_implementation": (None, "dynamic"), "cache_config": (None,),
    "max_cache_len": (None,), "compile_config": (None,), "disable_compile": (None, False, True),
    "continuous_batching_config": (None,), "speculation_type": (None,), "use_mtp": (None, False),
    "assistant_early_exit": (None,), "assistant_lookbehind": (None,), "target_lookbehind": (None,),
    "assistant_ensemble_weight": (None,),
    "decoder_start_token_id": (None,),
}
# bookkeeping: does not change what a decoder-only model generates from a given prompt
BOOKKEEPING = {"transformers_version", "_from_model_config", "bos_token_id", "is_assistant"}
_BUILT_IN = (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)  # what Sampler does itself


def setting(config: GenerationConfig, name: str):
    """A config field, or transformers' default for it when the config leaves it unset."""
    value = getattr(config, name, None)
    return DEFAULTS.get(name) if value is None else value


def refuse_unsupported(config: GenerationConfig, overrides: dict | None = None) -> None:
    """A clear error for every field set (in ``config``, or by ``overrides``) to something the loop would
    not do, and for fields this module does not know."""
    fields = {**config.to_dict(), **(overrides or {})}
    unknown = sorted(set(fields) - HONOURED - set(NEUTRAL) - BOOKKEEPING)
    if unknown:
        raise NotImplementedError(f"semverify.generate does not know the generation setting(s) {', '.join(unknown)} "
                                  "(a newer transformers?); leave them unset")
    bad = [f"{name}={fields[name]!r}" for name, neutral in NEUTRAL.items() if fields.get(name) not in neutral]
    if bad:
        raise NotImplementedError(f"semverify.generate does not do {', '.join(bad)}; speculative decoding here is "
                                  "greedy or sampled decoding of one or more sequences, without beams or extra outputs")


def processors(model: PreTrainedModel, config: GenerationConfig, prompts: Sequence[torch.LongTensor],
               extra: LogitsProcessorList | None = None) -> tuple[LogitsProcessorList, ...] | None:
    """One transformers ``LogitsProcessorList`` per prompt, as ``model.generate`` builds it from ``config``
    (and ``extra``), or None when it would only hold the temperature/top-k/top-p warpers that
    `Sampler` applies itself."""
    config = resolved(config)
    model._prepare_special_tokens(config, True, prompts[0].device)

    def build(prompt: torch.LongTensor) -> LogitsProcessorList:
        if config.max_new_tokens is not None:  # as transformers' generate: the length limit of this row
            config.max_length = len(prompt) + config.max_new_tokens
        return model._get_logits_processor(generation_config=config, input_ids_seq_length=len(prompt),
                                           encoder_input_ids=prompt[None], device=prompt.device, model_kwargs={},
                                           logits_processor=extra or LogitsProcessorList())

    first = build(prompts[0])
    if all(isinstance(p, _BUILT_IN) for p in first):
        return None
    return (first, *(build(p) for p in prompts[1:]))


def resolved(config: GenerationConfig) -> GenerationConfig:
    """``config`` with the sampling fields set to what decoding uses (transformers' defaults when unset)."""
    config = copy.deepcopy(config)
    for name in ("do_sample", "temperature", "top_k", "top_p"):
        setattr(config, name, setting(config, name))
    if not config.do_sample:
        config.temperature = config.top_k = config.top_p = None
    return config


def stopping_criteria(config: GenerationConfig, tokenizer, extra: StoppingCriteriaList | None = None
                      ) -> StoppingCriteriaList | None:
    """Stop strings (they need ``tokenizer``), ``max_time`` and the caller's own criteria; EOS and the
    token budget are the loop's own. None when there are none."""
    criteria = StoppingCriteriaList(extra or [])
    if config.max_time is not None:
        criteria.append(MaxTimeCriteria(max_time=config.max_time))
    if config.stop_strings is not None:
        if tokenizer is None:
            raise ValueError("stop_strings need the tokenizer to find them in the tokens: pass tokenizer= to "
                             "generate()")
        criteria.append(StopStringCriteria(stop_strings=config.stop_strings, tokenizer=tokenizer))
    return criteria or None
