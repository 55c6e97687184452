"""Method presets: a drafter kind and a rule with their parameters, by name, and the parsing of
``sd`` / ``typical:posterior_threshold=0.2,k=4`` specs and JSON method configs into them.

Method packages register their presets here when imported (``import semverify`` imports them all).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from .registry import Registry, RunContext, available_drafters, drafter_kind, get_rule, parse_param
from .rules import BaseRule, check_draft_length

_CONTEXT_PARAMS = ("draft_model", "target_model", "draft_calibration", "target_calibration", "temperature")


@dataclass(frozen=True)
class Method:
    """One decoding method: a drafter kind, a rule and their parameters, and the draft length k.

    ``decoder="draft"`` decodes with the draft model alone (a reference point for lossy methods).
    """

    name: str
    drafter: str
    rule: str = "speculative"
    rule_params: dict = field(default_factory=dict)
    k: int = 5
    drafter_params: dict = field(default_factory=dict)
    decoder: str = "target"

    def __post_init__(self) -> None:
        if self.drafter not in available_drafters():
            raise ValueError(f"method {self.name!r}: unknown drafter {self.drafter!r}; use one of "
                             f"{', '.join(available_drafters())}")
        kind = drafter_kind(self.drafter)
        if self.decoder not in ("target", "draft"):
            raise ValueError(f"method {self.name!r}: decoder must be 'target' or 'draft', got {self.decoder!r}")
        if self.decoder == "draft" and self.drafter != "none":
            raise ValueError(f"method {self.name!r}: the draft model decodes alone, so it takes drafter 'none', "
                             f"not {self.drafter!r}")
        if self.k < 1:
            raise ValueError(f"method {self.name!r}: k must be >= 1, got {self.k}")
        if self.drafter_params:
            if not kind.settings:
                raise ValueError(f"method {self.name!r}: drafter {self.drafter!r} takes no settings")
            unknown = sorted(set(self.drafter_params) - set(kind.settings))
            if unknown:
                raise ValueError(f"method {self.name!r}: unknown drafter settings {', '.join(unknown)}; "
                                 f"known: {', '.join(sorted(kind.settings))}")

    @classmethod
    def from_record(cls, record: dict) -> "Method":
        """A method as a run folder's ``run.json`` records it (older records included)."""
        params = {k: v for k, v in record.get("rule_params", {}).items()
                  if k not in _CONTEXT_PARAMS or str(v).endswith((".json", ".pt"))}
        return cls(**{**record, "rule_params": params})

    def build_rule(self, context: RunContext | None = None) -> BaseRule:
        return get_rule(self.rule, context, **self.rule_params)

    def checked(self, context: RunContext | None = None) -> "Method":
        """This method, checked by building its rule once in ``context`` (see `checked_rule`)."""
        self.checked_rule(context)
        return self

    def checked_rule(self, context: RunContext | None = None) -> BaseRule:
        """This method's rule, built in ``context``: unknown rules, bad parameters, missing files and a rule
        the drafter cannot serve fail here, before any model loads, with the method's name."""
        try:
            rule = self.build_rule(context)
            check_draft_length(rule, self.k)
        except (ValueError, TypeError, FileNotFoundError) as err:
            raise ValueError(f"method {self.name!r}: {err}") from err
        if rule.needs_draft_probs and not drafter_kind(self.drafter).gives_probs:
            raise ValueError(f"method {self.name!r}: rule {self.rule!r} needs draft probabilities, which the "
                             f"{self.drafter!r} drafter cannot give; use drafter 'model'")
        return rule

    def lossless(self, context: RunContext | None = None) -> bool:
        """Does it keep the target's output distribution? The draft model alone does not."""
        return self.decoder == "target" and self.build_rule(context).lossless

    @property
    def retrieves(self) -> bool:
        """Does its drafter retrieve from a datastore?"""
        return drafter_kind(self.drafter).retrieval

    def datastore(self, default: str | None) -> str | None:
        """The datastore file this method retrieves from: its own ``drafter.datastore``, else the run's."""
        return self.drafter_params.get("datastore", default) if self.retrieves else None

    @property
    def drafter_settings(self) -> dict:
        """The drafter's constructor settings: ``drafter_params`` without the datastore file."""
        return {k: v for k, v in self.drafter_params.items() if k != "datastore"}

    @property
    def needs(self) -> set[str]:
        """Resources to load for this method (the draft model also when it decodes alone)."""
        return set(drafter_kind(self.drafter).needs) | ({"draft_model"} if self.decoder == "draft" else set())

    def to_dict(self) -> dict:
        spec = {"name": self.name, "drafter": self.drafter, "rule": self.rule, "rule_params": self.rule_params,
                "k": self.k}
        if self.drafter_params:
            spec["drafter_params"] = self.drafter_params
        if self.decoder != "target":
            spec["decoder"] = self.decoder
        return spec  # optional keys only when set, so runs written before them still resume


_METHODS: Registry[Method] = Registry("unknown method {name}; built-in methods: {known} (or use --config)")


def register_method(method: Method) -> None:
    _METHODS.add(method.name, method)


def available_methods() -> list[str]:
    return _METHODS.names()


def get_method(name: str) -> Method:
    """A registered method preset by name."""
    return _METHODS.get(name)


def parse_method(text: str, context: RunContext | None = None) -> Method:
    """``sd`` or ``typical:posterior_threshold=0.2,k=4`` -> Method (parameters override the preset's;
    ``drafter.NAME=value`` sets a drafter setting), checked in ``context``."""
    return _spec(text).checked(context)


def _spec(text: str) -> Method:
    """The method a spec names, not yet checked."""
    name, _, params = text.partition(":")
    base = get_method(name)
    if params:
        try:
            values = dict(parse_param(p) for p in params.split(","))
        except ValueError as err:
            raise ValueError(f"method {text!r}: {err}") from None
        k = int(values.pop("k", base.k))
        drafter = {key.removeprefix("drafter."): values.pop(key) for key in list(values) if key.startswith("drafter.")}
        base = replace(base, name=text, k=k, rule_params={**base.rule_params, **values},
                       drafter_params={**base.drafter_params, **drafter})
    return base


def load_methods(spec: str | None = None, config: str | Path | list[str | Path] | None = None,
                 context: RunContext | None = None, only: str | None = None) -> list[Method]:
    """Methods from a comma-separated list and/or JSON configs ``{"methods": [{name, drafter, rule, ...}]}``
    (one path or several, read in order, so a run can combine a shared set with its own extras); ``only``
    (comma-separated names) keeps just those, e.g. to resume part of a run with the run's own configs."""
    return [method for method, _ in load_method_rules(spec, config, context, only)]


def load_method_rules(spec: str | None = None, config: str | Path | list[str | Path] | None = None,
                      context: RunContext | None = None, only: str | None = None) -> list[tuple[Method, BaseRule]]:
    """`load_methods` with each method's checked rule, built once (a run reuses them)."""
    methods = [_spec(t) for t in _split(spec)] if spec else []
    for path in map(Path, [config] if isinstance(config, (str, Path)) else config or []):
        if not path.is_file():
            raise FileNotFoundError(f"method config not found: {path}")
        try:
            records = json.loads(path.read_text())["methods"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise ValueError(f"method config {path} is not a JSON object with a \"methods\" list ({err})") from None
        methods += [Method(**m) for m in records]
    if not methods:
        raise ValueError("no methods given")
    names = [m.name for m in methods]
    if len(set(names)) != len(names):
        raise ValueError(f"method names must be unique, got {names}")
    return [(m, m.checked_rule(context)) for m in (_select(methods, only) if only is not None else methods)]


def _select(methods: list[Method], only: str) -> list[Method]:
    """The methods named in ``only``, in that order; a name not among them is an error naming it."""
    by_name = {m.name: m for m in methods}
    wanted = _split(only)
    unknown = [n for n in wanted if n not in by_name]
    if unknown or not wanted:
        raise ValueError(f"--only names {', '.join(unknown) or 'no method'}; the methods given are "
                         f"{', '.join(by_name)}")
    return [by_name[n] for n in dict.fromkeys(wanted)]


def _split(spec: str) -> list[str]:
    """Split on commas that separate methods, not the ones inside a method's parameters."""
    parts: list[str] = []
    for piece in spec.split(","):
        if parts and ":" in parts[-1] and "=" in piece and ":" not in piece:
            parts[-1] += "," + piece
        else:
            parts.append(piece)
    return [p.strip() for p in parts if p.strip()]


# -- the core presets ----------------------------------------------------------------------------------

for _preset in (
    Method("vanilla", "none"),
    Method("draft_alone", "none", decoder="draft"),  # the draft model by itself: how good is what it proposes?
    Method("sd", "model"),
    Method("sd_int8", "model_int8"),
    Method("pld", "prompt_lookup", k=10),
    Method("typical", "model", "typical"),
    Method("sd_tree", "model_tree", "speculative", k=8),  # draft-model trees (sampled: sibling by sibling)
    Method("sd_adaptive", "model", drafter_params={"adaptive": True}, k=10),
    Method("sd_auto", "model", drafter_params={"plan": True}, k=8),  # draft length planned from forward costs
    Method("hybrid", "hybrid"),  # prompt lookup, the draft model on a miss
):
    register_method(_preset)
