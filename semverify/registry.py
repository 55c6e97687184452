"""One registry for what a run is made of: acceptance rules, drafter kinds and method presets, by name.

Everything that builds a rule or a drafter goes through here (``generate()``, the command line, the
evaluation harness), with a typed :class:`RunContext` for what the run knows about itself and
:class:`DraftResources` for the models and files it loaded. Method packages register their own
entries when imported (``import semverify`` imports them all).
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from .drafters import (
    BaseDrafter,
    Drafter,
    HybridDrafter,
    ModelDrafter,
    ModelTreeDrafter,
    NoDrafter,
    PromptLookupDrafter,
)
from .rules import BaseRule, GreedyMatch, SpeculativeSampling, TypicalAcceptance


@dataclass(frozen=True)
class RunContext:
    """What a run tells the rules it builds: the models' names (EASD finds their entropy calibrations,
    SemanticSpec their probes), the decoding temperature (1.0 under greedy decoding, whose rules see the
    T=1 distributions) and the tokenizer (for rules that write prompts)."""

    draft_model: str | None = None
    target_model: str | None = None
    temperature: float = 1.0
    tokenizer: Any = None

    @classmethod
    def for_decoding(cls, draft_model: str | None, target_model: str | None, do_sample: bool,
                     temperature: float | None, tokenizer: Any = None) -> "RunContext":
        return cls(draft_model, target_model, (temperature or 1.0) if do_sample else 1.0, tokenizer)


# -- acceptance rules ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class _RuleEntry:
    factory: Callable[..., BaseRule]
    contextual: bool  # called as factory(context, **params)


_RULES: dict[str, _RuleEntry] = {}


def register_rule(name: str, factory: Callable[..., BaseRule], *, contextual: bool = False) -> None:
    """Make the rule name ``name`` build ``factory(**params)``, or ``factory(context, **params)`` when
    ``contextual`` (the rule needs to know the run: models, temperature, tokenizer)."""
    _RULES[name] = _RuleEntry(factory, contextual)


def available_rules() -> list[str]:
    """Names accepted by ``generate(rule=...)``, the command line's ``--rule`` and method presets."""
    return sorted(_RULES)


def get_rule(rule: str | BaseRule, context: RunContext | None = None, **params) -> BaseRule:
    """A rule object from a registered name (with constructor params), or a rule object passed through."""
    if not isinstance(rule, str):
        if params:
            raise ValueError("rule parameters are only accepted with a rule name, not a rule object")
        if not isinstance(rule, BaseRule):
            raise TypeError(f"rule must be a rule name or a BaseRule (semverify.rules), got {type(rule).__name__}")
        return rule
    if rule not in _RULES:
        raise ValueError(f"unknown acceptance rule {rule!r}; available: {', '.join(available_rules())}")
    entry = _RULES[rule]
    check_param_types(rule, entry.factory, params)
    return entry.factory(context or RunContext(), **params) if entry.contextual else entry.factory(**params)


def check_param_types(rule: str, factory: Callable, params: dict) -> None:
    """Refuse a parameter whose value is not of the type its default has (a number given as text, say),
    naming the parameter, before the rule's own code meets it."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return
    for key, value in params.items():
        default = signature.parameters[key].default if key in signature.parameters else inspect.Parameter.empty
        if isinstance(default, bool):
            if not isinstance(value, bool):
                raise ValueError(f"rule {rule!r}: {key} expects true or false, got {value!r}")
        elif isinstance(default, int) and (isinstance(value, (str, bool, float))):
            raise ValueError(f"rule {rule!r}: {key} expects an integer, got {value!r}")
        elif isinstance(default, float) and isinstance(value, (str, bool)):
            raise ValueError(f"rule {rule!r}: {key} expects a number, got {value!r}")


def parse_param(text: str) -> tuple[str, Any]:
    """``key=value`` -> (key, value), the value as int, float, bool or str: parameters as typed."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"expected key=value, got {text!r}")
    value = value.strip()
    if value.lower() in ("true", "false"):
        return key.strip(), value.lower() == "true"
    for kind in (int, float):
        try:
            return key.strip(), kind(value)
        except ValueError:
            pass
    return key.strip(), value


# -- drafters -----------------------------------------------------------------------------------------

@dataclass
class DraftResources:
    """The models and files drafters are built from; a drafter kind names the ones it needs."""

    draft_model: Any = None
    draft_model_int8: Any = None
    tokenizer: Any = None
    datastore: Any = None
    eos_token_id: int | list[int] | None = None
    confidence_threshold: float | None = 0.4
    max_matching_ngram_size: int = 2


@dataclass(frozen=True)
class DrafterKind:
    """A way to draft: ``factory(resources, k, **settings)`` builds a ``drafter`` (the class, whose declared
    abilities the kind reports before anything is built); ``needs`` names the resources it draws on
    (``draft_model``, ``draft_model_int8``, ``tokenizer``, ``datastore``) and ``settings`` the constructor
    settings a method may give it (``drafter.NAME=value``)."""

    name: str
    factory: Callable[..., Drafter]
    drafter: type[BaseDrafter]
    needs: tuple[str, ...] = ()
    settings: tuple[str, ...] = ()
    default_k: int = 5
    retrieval: bool = False  # drafts from a datastore: the run's, or a method's own ``drafter.datastore``
    step_cap: bool = False  # k caps a whole step's tokens, not a token draft's length

    @property
    def gives_probs(self) -> bool:
        """Do its drafts carry the distribution they were sampled from (as EASD needs)?"""
        return self.drafter.gives_probs

    @property
    def batches(self) -> bool:
        """Can it draft for a batch of rows (generate() with input_ids [B > 1, T])?"""
        return self.drafter.batching != "single"


_DRAFTERS: dict[str, DrafterKind] = {}
_NEEDS = {"draft_model": "a model (the draft model)", "draft_model_int8": "a model (the int8 draft model)",
          "tokenizer": "the tokenizer", "datastore": "a datastore"}


def register_drafter(kind: DrafterKind) -> None:
    _DRAFTERS[kind.name] = kind


def available_drafters() -> list[str]:
    return list(_DRAFTERS)


def drafter_kind(name: str) -> DrafterKind:
    if name not in _DRAFTERS:
        raise ValueError(f"unknown drafter {name!r}; use one of {', '.join(_DRAFTERS)}")
    return _DRAFTERS[name]


def make_drafter(name: str, resources: DraftResources, k: int, **settings) -> Drafter:
    """The one place drafters are built: kind ``name`` over ``resources``, for drafts of up to k tokens."""
    kind = drafter_kind(name)
    missing = [_NEEDS[need] for need in kind.needs if getattr(resources, need) is None]
    if missing:
        raise ValueError(f"drafter {name!r} needs {' and '.join(missing)}")
    unknown = sorted(set(settings) - set(kind.settings))
    if unknown:
        known = ", ".join(kind.settings) or "none"
        raise ValueError(f"drafter {name!r} takes no setting {', '.join(unknown)} (its settings: {known})")
    return kind.factory(resources, k, **settings)


# -- method presets -----------------------------------------------------------------------------------

# rule parameters that earlier runs stored in their methods although the run determines them (model names,
# temperature); dropped when such a record is read, since they now come from the run context
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
        kind = drafter_kind(self.drafter) if self.drafter in _DRAFTERS else None
        if kind is None:
            raise ValueError(f"method {self.name!r}: unknown drafter {self.drafter!r}; use one of "
                             f"{', '.join(_DRAFTERS)}")
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
        """This method, checked by building its rule once in ``context``: unknown rules, bad parameters,
        missing files and a rule the drafter cannot serve fail here, before any model loads."""
        try:
            rule = self.build_rule(context)
        except (ValueError, TypeError, FileNotFoundError) as err:
            raise ValueError(f"method {self.name!r}: {err}") from err
        if rule.needs_draft_probs and not drafter_kind(self.drafter).gives_probs:
            raise ValueError(f"method {self.name!r}: rule {self.rule!r} needs draft probabilities, which the "
                             f"{self.drafter!r} drafter cannot give; use drafter 'model'")
        return self

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


_METHODS: dict[str, Method] = {}


def register_method(method: Method) -> None:
    _METHODS[method.name] = method


def available_methods() -> list[str]:
    return list(_METHODS)


def get_method(name: str) -> Method:
    """A registered method preset by name."""
    if name not in _METHODS:
        raise ValueError(f"unknown method {name!r}; built-in methods: {', '.join(_METHODS)} (or use --config)")
    return _METHODS[name]


def parse_method(text: str, context: RunContext | None = None) -> Method:
    """``sd`` or ``typical:posterior_threshold=0.2,k=4`` -> Method (parameters override the preset's;
    ``drafter.NAME=value`` sets a drafter setting)."""
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
    return base.checked(context)


def load_methods(spec: str | None = None, config: str | Path | list[str | Path] | None = None,
                 context: RunContext | None = None, only: str | None = None) -> list[Method]:
    """Methods from a comma-separated list and/or JSON configs ``{"methods": [{name, drafter, rule, ...}]}``
    (one path or several, read in order, so a run can combine a shared set with its own extras); ``only``
    (comma-separated names) keeps just those, e.g. to resume part of a run with the run's own configs."""
    methods = [parse_method(t, context) for t in _split(spec)] if spec else []
    for path in map(Path, [config] if isinstance(config, (str, Path)) else config or []):
        if not path.is_file():
            raise FileNotFoundError(f"method config not found: {path}")
        try:
            records = json.loads(path.read_text())["methods"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise ValueError(f"method config {path} is not a JSON object with a \"methods\" list ({err})") from None
        methods += [Method(**m).checked(context) for m in records]
    if not methods:
        raise ValueError("no methods given")
    names = [m.name for m in methods]
    if len(set(names)) != len(names):
        raise ValueError(f"method names must be unique, got {names}")
    return _select(methods, only) if only is not None else methods


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


# -- the core entries ---------------------------------------------------------------------------------

def _model_drafter(resources: DraftResources, k: int, **settings) -> ModelDrafter:
    return ModelDrafter(resources.draft_model, resources.confidence_threshold, resources.eos_token_id, **settings)


def _int8_model_drafter(resources: DraftResources, k: int, **settings) -> ModelDrafter:
    return ModelDrafter(resources.draft_model_int8, resources.confidence_threshold, resources.eos_token_id,
                        **settings)


def _model_tree_drafter(resources: DraftResources, k: int, **settings) -> ModelTreeDrafter:
    return ModelTreeDrafter(resources.draft_model, eos_token_id=resources.eos_token_id, **settings)


def _hybrid_drafter(resources: DraftResources, k: int, min_tokens: int = 2, **settings) -> HybridDrafter:
    return HybridDrafter(_model_drafter(resources, k, **settings), _prompt_lookup(resources, k), min_tokens)


def _prompt_lookup(resources: DraftResources, k: int, **settings) -> PromptLookupDrafter:
    return PromptLookupDrafter(resources.max_matching_ngram_size, eos_token_id=resources.eos_token_id, **settings)


register_rule("greedy", GreedyMatch)
register_rule("speculative", SpeculativeSampling)
register_rule("typical", TypicalAcceptance)
register_drafter(DrafterKind("none", lambda resources, k: NoDrafter(), NoDrafter))
_ADAPTIVE = ("entropy_stop", "adaptive", "start")  # a model drafter's own settings (drafter.NAME=...)
register_drafter(DrafterKind("model", _model_drafter, ModelDrafter, needs=("draft_model",), settings=_ADAPTIVE))
register_drafter(DrafterKind("model_int8", _int8_model_drafter, ModelDrafter, needs=("draft_model_int8",),
                             settings=_ADAPTIVE))
register_drafter(DrafterKind("model_tree", _model_tree_drafter, ModelTreeDrafter, needs=("draft_model",),
                             settings=("budget", "branch", "threshold"), default_k=8))
register_drafter(DrafterKind("hybrid", _hybrid_drafter, HybridDrafter, needs=("draft_model",),
                             settings=("min_tokens", *_ADAPTIVE)))
register_drafter(DrafterKind("prompt_lookup", _prompt_lookup, PromptLookupDrafter, settings=("prefer",), default_k=10))
for _preset in (
    Method("vanilla", "none"),
    Method("draft_alone", "none", decoder="draft"),  # the draft model by itself: how good is what it proposes?
    Method("sd", "model"),
    Method("sd_int8", "model_int8"),
    Method("pld", "prompt_lookup", k=10),
    Method("typical", "model", "typical"),
    Method("sd_tree", "model_tree", "speculative", k=8),  # draft-model trees (sampled: sibling by sibling)
    Method("sd_adaptive", "model", drafter_params={"adaptive": True}, k=10),
    Method("hybrid", "hybrid"),  # prompt lookup, the draft model on a miss
):
    register_method(_preset)
