"""The registries a run is built from: acceptance rules and drafter kinds, by name.

Everything that builds a rule or a drafter goes through here (``generate()``, the command line, the
evaluation harness), with a typed `RunContext` for what the run knows about itself and
`DraftResources` for the models and files it loaded. Method packages register their own
entries when imported (``import semverify`` imports them all).
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

from .drafters import (
    BaseDrafter,
    Drafter,
    HybridDrafter,
    ModelDrafter,
    ModelTreeDrafter,
    NoDrafter,
    PromptLookupDrafter,
)
from .phases import PHASE_PARAMS, limit_to_phase
from .planner import planner_for
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


T = TypeVar("T")


class Registry(Generic[T]):
    """Entries by name, in the order registered; an unknown name is an error naming the known ones
    (``unknown``: the message, with ``{name}``, the name and the closest known one, and ``{known}``)."""

    def __init__(self, unknown: str) -> None:
        self.unknown = unknown
        self.entries: dict[str, T] = {}

    def add(self, name: str, entry: T) -> None:
        self.entries[name] = entry

    def names(self) -> list[str]:
        return list(self.entries)

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def get(self, name: str) -> T:
        if name not in self.entries:
            raise ValueError(self.unknown.format(name=f"{name!r}{closest(name, self.entries)}",
                                                 known=", ".join(self.entries)))
        return self.entries[name]


def closest(name: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the known name nearest ``name``, or nothing when none is near."""
    match = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


# -- acceptance rules ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class _RuleEntry:
    factory: Callable[..., BaseRule]
    contextual: bool  # called as factory(context, **params)
    takes: Callable | None = None  # whose signature and docstring describe the params (default: the factory)


_RULES: Registry[_RuleEntry] = Registry("unknown acceptance rule {name}; available: {known}")


def register_rule(name: str, factory: Callable[..., BaseRule], *, contextual: bool = False,
                  takes: Callable | None = None) -> None:
    """Make the rule name ``name`` build ``factory(**params)``, or ``factory(context, **params)`` when
    ``contextual`` (the rule needs to know the run: models, temperature, tokenizer). ``takes``: the callable whose
    keyword parameters and docstring describe ``params``, where the factory only passes them on."""
    _RULES.add(name, _RuleEntry(factory, contextual, takes))


def available_rules() -> list[str]:
    """Names accepted by ``generate(rule=...)``, the command line's ``--rule`` and method presets."""
    return sorted(_RULES.names())


def get_rule(rule: str | BaseRule, context: RunContext | None = None, **params) -> BaseRule:
    """A rule object from a registered name (with constructor params), or a rule object passed through; the
    ``phase_*`` parameters limit either to a span of the output (`semverify.phases`)."""
    phase = {key: params.pop(key) for key in PHASE_PARAMS if key in params}
    built = _build_rule(rule, context, params)
    return limit_to_phase(built, context, **phase) if phase else built


def _build_rule(rule: str | BaseRule, context: RunContext | None, params: dict) -> BaseRule:
    if not isinstance(rule, str):
        if params:
            raise ValueError("rule parameters are only accepted with a rule name, not a rule object")
        if not isinstance(rule, BaseRule):
            raise TypeError(f"rule must be a rule name or a BaseRule (semverify.rules), got {type(rule).__name__}")
        return rule
    entry = _RULES.get(rule)
    check_params(rule, entry.takes or entry.factory, params)
    return entry.factory(context or RunContext(), **params) if entry.contextual else entry.factory(**params)


def rule_factory(name: str) -> Callable[..., BaseRule]:
    """What builds rule ``name`` (its class, for the registered classes), or what describes its parameters."""
    entry = _RULES.get(name)
    return entry.takes or entry.factory


def rule_params(name: str) -> dict[str, Any]:
    """The parameters rule ``name`` takes and their defaults (``inspect.Parameter.empty`` where required), besides
    the phase parameters that limit a token rule (`semverify.phases`); `semverify rules` prints them."""
    entry = _RULES.get(name)
    parameters, _ = _keywords(entry.takes or entry.factory)
    parameters = parameters[1:] if entry.contextual and entry.takes is None else parameters
    return {p.name: p.default for p in parameters}


def _keywords(described: Callable) -> tuple[list[inspect.Parameter], bool]:
    """The named parameters of ``described``, following a class's ``**kwargs`` into the constructor of the base
    class it passes them to, and whether any ``**kwargs`` is left open."""
    try:
        parameters = list(inspect.signature(described).parameters.values())
    except (TypeError, ValueError):
        return [], True
    named = [p for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if len(named) == len(parameters) or not isinstance(cls := getattr(described, "func", described), type):
        return named, len(named) != len(parameters)
    base = next((b for b in cls.__mro__[1:] if "__init__" in vars(b)), object)
    more, open_ended = _keywords(base) if base is not object else ([], True)
    return named + [p for p in more if p.name not in {q.name for q in named}], open_ended


def rule_summary(name: str) -> str:
    """Rule ``name``'s parameters with their defaults, one line: ``a=1, b, ...`` (``b`` required), or ``none``."""
    def shown(value: Any) -> str:
        text = repr(value)
        return text if len(text) <= 40 else f"{text[:36]}...{text[-1]}"

    return ", ".join(key if default is inspect.Parameter.empty else f"{key}={shown(default)}"
                     for key, default in rule_params(name).items()) or "none"


def check_params(rule: str, factory: Callable, params: dict) -> None:
    """Refuse a parameter the rule does not take (naming the closest and listing those it takes), and one whose
    value is not of the type its default has (a number given as text, say), before the rule's own code meets it."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return
    known = rule_params(rule)
    open_ended = _keywords(factory)[1]
    for key, value in params.items():
        if key not in known and not open_ended:
            raise ValueError(f"rule {rule!r} takes no parameter {key!r}{closest(key, [*known, *PHASE_PARAMS])}; its "
                             f"parameters: {rule_summary(rule)} (a token rule also takes {', '.join(PHASE_PARAMS)})")
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
    target_model: Any = None  # the model that verifies (a draft planner reads its forward costs)
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


_DRAFTERS: Registry[DrafterKind] = Registry("unknown drafter {name}; use one of {known}")
_NEEDS = {"draft_model": "a model (the draft model)", "draft_model_int8": "a model (the int8 draft model)",
          "tokenizer": "the tokenizer", "datastore": "a datastore"}


def register_drafter(kind: DrafterKind) -> None:
    _DRAFTERS.add(kind.name, kind)


def available_drafters() -> list[str]:
    return _DRAFTERS.names()


def drafter_kind(name: str) -> DrafterKind:
    return _DRAFTERS.get(name)


def make_drafter(name: str, resources: DraftResources, k: int, **settings) -> Drafter:
    """The one place drafters are built: kind ``name`` over ``resources``, for drafts of up to k tokens."""
    kind = drafter_kind(name)
    missing = [_NEEDS[need] for need in kind.needs if getattr(resources, need) is None]
    if missing:
        raise ValueError(f"drafter {name!r} needs {' and '.join(missing)}")
    unknown = sorted(set(settings) - set(kind.settings))
    if unknown:
        known = ", ".join(kind.settings) or "none"
        raise ValueError(f"drafter {name!r} takes no setting {', '.join(unknown)}{closest(unknown[0], kind.settings)} "
                         f"(its settings: {known})")
    return kind.factory(resources, k, **settings)


# -- method presets -----------------------------------------------------------------------------------

# rule parameters that earlier runs stored in their methods although the run determines them (model names,
# temperature); dropped when such a record is read, since they now come from the run context
# -- the core entries ---------------------------------------------------------------------------------

def _model_drafter(resources: DraftResources, k: int, plan: bool = False, **settings) -> ModelDrafter:
    return _drafting_with(resources.draft_model, resources, k, plan, settings)


def _int8_model_drafter(resources: DraftResources, k: int, plan: bool = False, **settings) -> ModelDrafter:
    return _drafting_with(resources.draft_model_int8, resources, k, plan, settings)


def _drafting_with(model, resources: DraftResources, k: int, plan: bool, settings: dict) -> ModelDrafter:
    """A model drafter on ``model``; ``plan``: its draft length planned per step (up to k) from this machine's
    forward costs of the target and ``model``."""
    if plan:
        if resources.target_model is None:
            raise ValueError("drafter.plan needs the target model among the draft resources")
        settings = {**settings, "planner": planner_for(resources.target_model, model, k)}
    return ModelDrafter(model, resources.confidence_threshold, resources.eos_token_id, **settings)


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
_ADAPTIVE = ("entropy_stop", "adaptive", "start", "plan")  # a model drafter's own settings (drafter.NAME=...)
register_drafter(DrafterKind("model", _model_drafter, ModelDrafter, needs=("draft_model",), settings=_ADAPTIVE))
register_drafter(DrafterKind("model_int8", _int8_model_drafter, ModelDrafter, needs=("draft_model_int8",),
                             settings=_ADAPTIVE))
register_drafter(DrafterKind("model_tree", _model_tree_drafter, ModelTreeDrafter, needs=("draft_model",),
                             settings=("budget", "branch", "threshold"), default_k=8))
register_drafter(DrafterKind("hybrid", _hybrid_drafter, HybridDrafter, needs=("draft_model",),
                             settings=("min_tokens", *_ADAPTIVE)))
register_drafter(DrafterKind("prompt_lookup", _prompt_lookup, PromptLookupDrafter, settings=("prefer",), default_k=10))
