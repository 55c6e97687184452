"""Methods to compare: a drafter kind, an acceptance rule and their parameters, by name.

A method is written ``name`` or ``name:key=value,key=value`` on the command line (keys: ``k``, rule
constructor arguments, and ``drafter.NAME`` for the drafter's own settings, e.g. a retrieval drafter's
``drafter.max_nodes=24`` or its own ``drafter.datastore=FILE``), or given as JSON objects in a config file. A run's context (the model
names and decoding temperature) fills the rule arguments that describe it, e.g. EASD's calibrations.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from semverify.rules import get_rule, parse_param, with_context
from semverify.sense import RetrievalDrafter

# retrieval drafter kinds -> RetrievalDrafter switches (REST: exact suffix; DReSD: hidden states; SEN: both)
RETRIEVAL = {"rest": {"semantic": False}, "dresd": {"lexical": False}, "sen": {}}
DRAFTERS = ("none", "model", "model_int8", "prompt_lookup", "step", *RETRIEVAL)  # step: SemanticSpec's StepDrafter


@dataclass(frozen=True)
class Method:
    """One decoding method: drafter kind, rule name, rule parameters and draft length k."""

    name: str
    drafter: str
    rule: str = "speculative"
    rule_params: dict = field(default_factory=dict)
    k: int = 5
    drafter_params: dict = field(default_factory=dict)
    decoder: str = "target"  # the model that decodes: "draft" runs the draft model alone, a reference point

    def __post_init__(self) -> None:
        if self.drafter not in DRAFTERS:
            raise ValueError(f"method {self.name!r}: unknown drafter {self.drafter!r}; use one of {', '.join(DRAFTERS)}")
        if self.decoder not in ("target", "draft"):
            raise ValueError(f"method {self.name!r}: decoder must be 'target' or 'draft', got {self.decoder!r}")
        if self.decoder == "draft" and self.drafter != "none":
            raise ValueError(f"method {self.name!r}: the draft model decodes alone, so it takes drafter 'none', "
                             f"not {self.drafter!r}")
        if self.k < 1:
            raise ValueError(f"method {self.name!r}: k must be >= 1, got {self.k}")
        if self.drafter_params:
            if self.drafter not in RETRIEVAL:
                raise ValueError(f"method {self.name!r}: drafter settings are taken by the retrieval drafters "
                                 f"({', '.join(RETRIEVAL)}), not {self.drafter!r}")
            allowed = set(inspect.signature(RetrievalDrafter).parameters) - set(RETRIEVAL[self.drafter])
            unknown = sorted(set(self.drafter_params) - allowed)
            if unknown:
                raise ValueError(f"method {self.name!r}: unknown drafter settings {', '.join(unknown)}; "
                                 f"known: {', '.join(sorted(allowed))}")

    def in_context(self, context: dict | None) -> "Method":
        """This method with the context's rule arguments filled in, checked by building its rule once:
        unknown rules, bad parameters and a rule the drafter cannot serve fail here, before models load."""
        method = replace(self, rule_params=with_context(self.rule, self.rule_params, context or {}))
        try:
            rule = method.build_rule()
        except (ValueError, TypeError, FileNotFoundError) as err:
            raise ValueError(f"method {self.name!r}: {err}") from err
        if rule.needs_draft_probs and not self.needs_draft_model:
            raise ValueError(f"method {self.name!r}: rule {self.rule!r} needs draft probabilities, which the "
                             f"{self.drafter!r} drafter cannot give; use drafter 'model'")
        return method

    def datastore(self, default: str | None) -> str | None:
        """The datastore file this method retrieves from: its own ``drafter.datastore``, else the run's."""
        return self.drafter_params.get("datastore", default) if self.drafter in RETRIEVAL else None

    @property
    def drafter_settings(self) -> dict:
        """The drafter's constructor settings: ``drafter_params`` without the datastore file."""
        return {k: v for k, v in self.drafter_params.items() if k != "datastore"}

    def build_rule(self):
        return get_rule(self.rule, **self.rule_params)

    @property
    def lossless(self) -> bool:
        """Does it keep the target's output distribution? The draft model alone does not."""
        return self.decoder == "target" and self.build_rule().lossless

    @property
    def needs_draft_model(self) -> bool:
        return self.drafter in ("model", "model_int8", "step") or self.decoder == "draft"

    def to_dict(self) -> dict:
        spec = {"name": self.name, "drafter": self.drafter, "rule": self.rule, "rule_params": self.rule_params,
                "k": self.k}
        if self.drafter_params:
            spec["drafter_params"] = self.drafter_params
        if self.decoder != "target":
            spec["decoder"] = self.decoder
        return spec  # optional keys only when set, so runs written before them still resume


BUILTIN = {m.name: m for m in (
    Method("vanilla", "none"),
    Method("draft_alone", "none", decoder="draft"),  # the draft model by itself: how good is what it proposes?
    Method("sd", "model"),
    Method("sd_int8", "model_int8"),
    Method("pld", "prompt_lookup", k=10),
    Method("typical", "model", "typical"),
    Method("easd", "model", "easd", {"percentile": 80}),
    # SENSE and its ablations on one datastore (--datastore): retrieval drafts 8 deep, greedy verification
    Method("rest", "rest", "greedy", k=8),
    Method("dresd", "dresd", "greedy", k=8),
    Method("sense", "sen", "sense", k=8),
    Method("sense_no_sen", "rest", "sense", k=8),
    Method("sense_no_se", "sen", "greedy", k=8),
    Method("fly", "rest", "fly", k=8),
    # SemanticSpec: whole steps of up to k tokens, probes found by the models' names
    Method("semanticspec", "step", "semanticspec", {"r_min": 0.5}, k=128),
)}


def parse_method(text: str, context: dict | None = None) -> Method:
    """``sd`` or ``typical:posterior_threshold=0.2,k=4`` -> Method (parameters override the built-in)."""
    name, _, params = text.partition(":")
    if name not in BUILTIN:
        raise ValueError(f"unknown method {name!r}; built-in methods: {', '.join(BUILTIN)} (or use --config)")
    base = BUILTIN[name]
    if params:
        try:
            values = dict(parse_param(p) for p in params.split(","))
        except ValueError as err:
            raise ValueError(f"method {text!r}: {err}") from None
        k = int(values.pop("k", base.k))
        drafter = {key.removeprefix("drafter."): values.pop(key) for key in list(values) if key.startswith("drafter.")}
        base = replace(base, name=text, k=k, rule_params={**base.rule_params, **values},
                       drafter_params={**base.drafter_params, **drafter})
    return base.in_context(context)


def load_methods(spec: str | None = None, config: str | Path | list[str | Path] | None = None,
                 context: dict | None = None) -> list[Method]:
    """Methods from a comma-separated list and/or JSON configs ``{"methods": [{name, drafter, rule, ...}]}``
    (one path or several, read in order, so a run can combine a shared set with its own extras).

    ``context``: rule arguments the run determines (``draft_calibration``, ``target_calibration``,
    ``temperature``), given to the rules whose factories take them.
    """
    methods = [parse_method(t, context) for t in _split(spec)] if spec else []
    for path in map(Path, [config] if isinstance(config, (str, Path)) else config or []):
        if not path.is_file():
            raise FileNotFoundError(f"method config not found: {path}")
        methods += [Method(**m).in_context(context) for m in json.loads(path.read_text())["methods"]]
    if not methods:
        raise ValueError("no methods given")
    names = [m.name for m in methods]
    if len(set(names)) != len(names):
        raise ValueError(f"method names must be unique, got {names}")
    return methods


def _split(spec: str) -> list[str]:
    """Split on commas that separate methods, not the ones inside a method's parameters."""
    parts: list[str] = []
    for piece in spec.split(","):
        if parts and ":" in parts[-1] and "=" in piece and ":" not in piece:
            parts[-1] += "," + piece
        else:
            parts.append(piece)
    return [p.strip() for p in parts if p.strip()]
