"""The methods ``semverify speed`` and ``semverify throughput`` time, named by the registry's presets.

semverify's methods are the registry's presets (``vanilla``, ``sd``, ``sd_int8``, ``pld``, ``sd_tree``,
``sd_adaptive``, ``hybrid``, ...), decoded as ``semverify compare`` decodes them; ``PRESET_int8`` runs a
draft-model preset on the int8 draft. transformers' own ``generate`` runs beside them as ``hf_`` and the
preset it matches: ``hf_vanilla`` (the target alone), ``hf_sd`` and ``hf_sd_int8`` (assisted generation, with
transformers' own draft length) and ``hf_pld`` (prompt lookup). Both commands decode greedily.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from semverify import load_model
from semverify.engine.clock import device_clock
from semverify.methods import Method, available_methods, get_method
from semverify.registry import DraftResources, RunContext, drafter_kind

from .runner import decode, refuse_int8_off_cpu

HF_METHODS = ("hf_vanilla", "hf_sd", "hf_sd_int8", "hf_pld")
_DRAFTS = {"draft_model", "draft_model_int8"}


@dataclass(frozen=True)
class TimedMethod:
    """A method to time: the registry preset it is (for transformers' methods: the one it matches), and
    whether it drafts with the int8 draft model."""

    name: str
    method: Method
    int8: bool = False

    @property
    def hf(self) -> bool:
        """Is it transformers' ``generate`` (not semverify's loop)?"""
        return self.name.startswith("hf_")

    @property
    def draft(self) -> str | None:
        """The draft model it drafts with: ``"plain"`` (as loaded), ``"int8"`` or None."""
        return ("int8" if self.int8 else "plain") if self.method.needs & _DRAFTS else None


def timed_method(name: str, k: int | None = None, lookup: int | None = None) -> TimedMethod:
    """The method ``name`` (see the module), with ``k`` as a draft-model method's draft length and ``lookup``
    as a prompt-lookup method's (None: the preset's own)."""
    base = name.removeprefix("hf_")
    preset = base if base in available_methods() else base.removesuffix("_int8")
    if preset not in available_methods() or (name.startswith("hf_") and name not in HF_METHODS):
        raise ValueError(f"unknown method {name!r}: use a method preset ({', '.join(available_methods())}), "
                         f"PRESET_int8 for a draft-model preset on the int8 draft, or {', '.join(HF_METHODS)}")
    method = get_method(preset)
    if method.retrieves:
        raise ValueError(f"method {name!r} drafts from a datastore; time it with semverify compare --datastore")
    if base != preset and "draft_model" not in method.needs:
        raise ValueError(f"method {name!r}: only a preset that drafts with the draft model as loaded has an "
                         f"_int8 version, not {preset!r}")
    tokens = method.needs & _DRAFTS and not drafter_kind(method.drafter).step_cap  # k counts draft tokens
    length = lookup if method.drafter == "prompt_lookup" else k if tokens else None
    return TimedMethod(name, replace(method, k=length) if length is not None else method, base.endswith("_int8"))


def dtype_label(env: dict) -> str:
    """A timing run's dtype as its tables print it: with ``fastest``, what it chose per role."""
    chosen = env.get("dtypes")
    if env["dtype"] != "fastest" or not chosen:
        return env["dtype"]
    return f"fastest ({', '.join(f'{role} {dtype}' for role, dtype in chosen.items())})"


class Decoders:
    """What a timing run decodes with, loaded and built once: the target and its tokenizer, the draft models
    the methods draft with, and each method's resources and rule (greedy)."""

    def __init__(self, target: str, draft: str, dtype: str, methods: list[TimedMethod], device: str = "cpu") -> None:
        int8 = [m.name for m in methods if m.draft == "int8"]
        refuse_int8_off_cpu(int8, device)
        self.target, self.tokenizer = load_model(target, dtype=dtype, device=device)
        self.device, self.clock = self.target.device, device_clock(self.target.device)
        drafts: dict[str, Any] = {}
        if any(m.draft == "plain" for m in methods):
            drafts["plain"] = load_model(draft, dtype=dtype, device=device, role="draft")[0]
        if int8:
            drafts["int8"] = load_model(draft, quantize="int8")[0]
        self.dtypes = {role: str(model.dtype).removeprefix("torch.") for role, model in
                       (("target", self.target), ("draft", drafts.get("plain"))) if model is not None}
        eos = self.target.generation_config.eos_token_id
        self.resources = {m.name: DraftResources(draft_model=drafts.get(m.draft), draft_model_int8=drafts.get("int8"),
                                                 target_model=self.target,
                                                 tokenizer=self.tokenizer, eos_token_id=eos) for m in methods}
        context = RunContext.for_decoding(draft, target, False, None, self.tokenizer)
        self.rules = {m.name: m.method.build_rule(context) for m in methods if not m.hf}
        self.pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

    def decode(self, m: TimedMethod, ids: torch.LongTensor, max_new_tokens: int,
               mask: torch.LongTensor | None = None) -> tuple[torch.LongTensor, dict | None]:
        """The new tokens of ``ids`` (a left-padded batch with its ``mask``) with ``m``, and semverify's
        statistics of the call (None for transformers')."""
        common = dict(max_new_tokens=max_new_tokens, do_sample=False)
        ids = ids.to(self.device)
        if mask is not None:  # pad only a batch: transformers masks a prompt's pad-id tokens when no mask is given
            common.update(attention_mask=mask.to(self.device), pad_token_id=self.pad)
        own = self.resources[m.name]
        if m.hf:
            extra = ({"prompt_lookup_num_tokens": m.method.k} if m.method.drafter == "prompt_lookup"
                     else {"assistant_model": own.draft_model} if m.draft else {})
            return self.target.generate(ids, **common, **extra)[:, ids.shape[1]:], None
        result = decode(m.method, self.rules[m.name], self.target, own, ids, **common)
        return result.sequences[:, ids.shape[1]:], result.spec_stats.to_dict()

    def warm_up(self, methods: list[TimedMethod], max_new_tokens: int) -> None:
        """Decode a short prompt with each method: first calls pay one-off allocation costs."""
        ids = self.tokenizer("Warm up.", return_tensors="pt").input_ids
        for m in methods:
            self.decode(m, ids, max_new_tokens)
