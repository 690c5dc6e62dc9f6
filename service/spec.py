"""SweepSpec: the sweep YAML, validated at the edge.

`parse_spec(text_or_dict)` returns a `SweepSpec` or raises `SpecError` holding every problem at once,
each as `field.path: what is wrong, got <value>` (a key that is not a plain name is written `["a b"]`).
Task params (fixed and searched) are checked against the task's own config dataclass (jobs/registry.py)
without coercion, as the worker will build it, before anything is queued. The text is read by
service.spec_loading (no aliases, duplicate keys, tags beyond plain data, deep nesting); here numbers
must be finite and fit in 64 bits, strings free of control characters (tests/badinput).
"""

from __future__ import annotations

import json
import math
import re
import typing
import warnings
from collections.abc import Mapping
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from service.data_paths import data_path_errors
from service.errors import SpecError
from service.settings import get_settings
from service.spec_loading import load_yaml, show

if typing.TYPE_CHECKING:
    from jobs.registry import Task

NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"
ALIAS_RE = r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$"
MAX_TRIALS = 100_000


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Metric(_Strict):
    name: str = Field(min_length=1, description="A metric the task reports, e.g. accuracy.")
    mode: Literal["min", "max"] | None = Field(default=None, description="Better is min or max; task default.")


class Domain(_Strict):
    """One searched parameter: exactly one of the keys below."""

    grid: list[Any] | None = Field(default=None, min_length=1, description="Every value, one trial each.")
    choice: list[Any] | None = Field(default=None, min_length=1, description="Sampled uniformly from the list.")
    uniform: tuple[float, float] | None = Field(default=None, description="[low, high], float.")
    loguniform: tuple[float, float] | None = Field(default=None, description="[low, high], float > 0.")
    randint: tuple[int, int] | None = Field(default=None, description="[low, high), integer.")

    @model_validator(mode="after")
    def _one_kind(self) -> Domain:
        kinds = [k for k in ("grid", "choice", "uniform", "loguniform", "randint") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError(
                f"give exactly one of grid, choice, uniform, loguniform, randint; got {', '.join(kinds) or 'none'}"
            )
        kind = kinds[0]
        if kind in ("uniform", "loguniform", "randint"):
            low, high = getattr(self, kind)
            if not (math.isfinite(low) and math.isfinite(high)):
                raise ValueError(f"{kind} bounds must be finite numbers, got [{low}, {high}]")
            if low >= high:
                raise ValueError(f"{kind} needs low < high, got [{low}, {high}]")
            if kind == "loguniform" and low <= 0:
                raise ValueError(f"loguniform needs low > 0, got {low}")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in ("grid", "choice", "uniform", "loguniform", "randint") if getattr(self, k) is not None)

    def values_to_check(self) -> list[tuple[tuple[str, int], Any]]:
        """((kind, index), value) pairs that must each be a valid value of the parameter."""
        kind = self.kind
        value = getattr(self, kind)
        if kind in ("grid", "choice"):
            return [((kind, i), v) for i, v in enumerate(value)]
        if kind == "randint":
            return [((kind, 0), value[0]), ((kind, 1), value[1] - 1)]
        return [((kind, 0), value[0]), ((kind, 1), value[1])]


class Search(_Strict):
    algorithm: Literal["grid", "random", "optuna"] = Field(default="grid")
    num_samples: int = Field(default=1, ge=1, le=MAX_TRIALS, description="Repeats of the grid, or samples.")
    # Optuna's samplers (numpy RandomState) take seeds below 2**32: a larger one would fail the sweep at its start.
    seed: int | None = Field(default=None, ge=0, le=2**32 - 1, description="Seed of the search algorithm.")


class Scheduler(_Strict):
    type: Literal["fifo", "asha", "pbt"] = "fifo"
    max_t: int = Field(default=100, ge=1, description="ASHA: most iterations a trial may run.")
    grace_period: int = Field(default=1, ge=1, description="ASHA: iterations before a trial may be stopped.")
    reduction_factor: float = Field(default=2.0, gt=1, le=100)
    perturbation_interval: int = Field(
        default=4, ge=1, le=100_000, description="PBT: reports between two exploit/explore rounds of the population."
    )
    hyperparam_mutations: dict[str, Domain] = Field(
        default_factory=dict,
        description="PBT: the params it may change, each with the range it resamples from; a perturbed number "
        "is multiplied by 0.8 or 1.2 and kept inside that range.",
    )
    quantile_fraction: float = Field(
        default=0.25, gt=0, le=0.5, description="PBT: the bottom fraction copies the weights of the top fraction."
    )
    resample_probability: float = Field(
        default=0.25, ge=0, le=1, description="PBT: chance a mutated param is drawn afresh rather than perturbed."
    )

    @model_validator(mode="after")
    def _grace_below_max(self) -> Scheduler:
        if self.grace_period > self.max_t:
            raise ValueError(f"grace_period ({self.grace_period}) must be <= max_t ({self.max_t})")
        return self


class StopRules(_Strict):
    """When a sweep ends before its trials are all done (W&B's metric.target, a wall-clock cap)."""

    target: float | None = Field(
        default=None,
        description="End the sweep once a trial's metric reaches this (>= for max, <= for min): that trial "
        "finishes, the others stop and are recorded as cancelled.",
    )
    max_minutes: float | None = Field(
        default=None,
        gt=0,
        le=30 * 24 * 60,
        description="End the sweep after this many minutes of running (counted per attempt): finished trials "
        "are kept, the rest recorded as cancelled.",
    )

    @field_validator("target")
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError(f"must be a finite number, got {v!r}")
        return v

    @model_validator(mode="after")
    def _some_rule(self) -> StopRules:
        if self.target is None and self.max_minutes is None:
            raise ValueError("give target, max_minutes or both (or leave `stop` out)")
        return self


class Resources(_Strict):
    cpus: float = Field(default=1.0, gt=0, le=1024, description="CPUs per trial (per worker with workers > 1).")
    gpus: float = Field(default=0.0, ge=0, le=64, description="GPUs per trial; > 0 runs a Ray Train job.")
    workers: int = Field(default=1, ge=1, le=256, description="> 1 runs a Ray Train TorchTrainer job.")


class Register(_Strict):
    model: str = Field(pattern=NAME_RE, description="Model Registry name for the best trial's model.")
    alias: str = Field(default="champion", pattern=ALIAS_RE)

    @field_validator("alias")
    @classmethod
    def _not_reserved(cls, v: str) -> str:
        if v == "latest" or re.fullmatch(r"[vV]\d+", v):
            raise ValueError(f"alias {v!r} is reserved by MLflow; pick another name such as champion")
        return v


CODE_TASK = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")
"""`task` of a sweep that brings code: module:attribute, the module importable from the code's root."""
CLAIM_ID_RE = r"^[a-z0-9][a-z0-9_.-]{0,63}$"


class PaperClaim(_Strict):
    """A claim of a paper that the sweep tests (service/claims.py judges it after the sweep)."""

    id: str = Field(pattern=CLAIM_ID_RE, description="Unique in the sweep: lower-case letters, digits, _ . -.")
    text: str = Field(min_length=1, max_length=500, description="The paper's claim, in words.")
    source: str | None = Field(default=None, max_length=200, description="Where the paper says it (Table 2).")
    metric: str = Field(min_length=1, description="A metric the task reports, read at each trial's end.")
    where: dict[str, Any] = Field(
        default_factory=dict, description="Config values that select the claim's trials; seeds are pooled."
    )
    paper: float | None = Field(default=None, description="The paper's value, in the metric's own units.")
    baseline: str | None = Field(
        default=None,
        description="A metric the same trials report that learns nothing (baseline/...), weighed beside the task's "
        "own baselines for the metric: the strongest of them decides.",
    )
    baselines: list[str] | None = Field(
        default=None, max_length=50, description="More such metrics to weigh; the strongest of all decides."
    )
    replicates: list[str] = Field(
        default_factory=lambda: ["seed"],
        min_length=1,
        max_length=10,
        description="The keys in which the pooled trials may differ: independent replicates (seed, a data seed).",
    )
    count: str | None = Field(
        default=None,
        description="A metric the same trial reports: how many independent runs `metric` is the rate of. A "
        "condition of one trial is then judged on that rate with its 95% Wilson interval.",
    )
    versus: dict[str, Any] | None = Field(
        default=None, description="A comparison: the other condition's config values (paper_versus is its value)."
    )
    paper_versus: float | None = Field(default=None, description="The paper's value for the `versus` condition.")
    tolerance: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="The band around the paper's value, as a share of it (default 0.05, at most 2 points above 90%).",
    )
    tolerance_abs: float | None = Field(
        default=None, gt=0, description="The band around the paper's value, in the metric's own units."
    )
    unit: Literal["fraction", "percent"] | None = Field(
        default=None,
        description="A percentage metric (0-1 or 0-100): above 90% the default band is at most 2 points wide.",
    )

    @model_validator(mode="after")
    def _comparison_complete(self) -> PaperClaim:
        if self.versus is not None and (self.paper is None or self.paper_versus is None):
            raise ValueError("a comparison (versus) needs both paper and paper_versus: the paper's two values")
        if self.versus is None and self.paper_versus is not None:
            raise ValueError("paper_versus is the value of a `versus` condition; give versus too, or drop it")
        if self.count is not None and self.versus is not None:
            raise ValueError("count (a rate's Wilson interval) judges a value claim; drop count or versus")
        if self.tolerance is not None and self.tolerance_abs is not None:
            raise ValueError("give the band once: tolerance (a share of the paper's value) or tolerance_abs")
        for name, value in (("paper", self.paper), ("paper_versus", self.paper_versus)):
            if value is not None and not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        return self


with warnings.catch_warnings():
    # `register` shadows ABCMeta.register on the class only; instances read the field. Keep the YAML key.
    warnings.filterwarnings("ignore", message='Field name "register"')

    class SweepSpec(_Strict):
        name: str = Field(pattern=NAME_RE, description="Also the MLflow experiment name.")
        task: str = Field(
            min_length=1,
            max_length=100,
            description="A registered task, e.g. tversky.xor; with `code`, module:attribute of a Task in that code.",
        )
        code: str | None = Field(
            default=None,
            min_length=1,
            max_length=500,
            description="Your own code: a folder or a .py file, relative to this YAML file. `layerlab submit` packs "
            "and uploads it; every trial imports `task` from it.",
        )
        metric: Metric
        params: dict[str, Any] = Field(default_factory=dict, description="Fixed task config.")
        space: dict[str, Domain] = Field(default_factory=dict, description="Searched task config.")
        search: Search = Field(default_factory=Search)
        scheduler: Scheduler = Field(default_factory=Scheduler)
        resources: Resources = Field(default_factory=Resources)
        max_concurrent_trials: int | None = Field(default=None, ge=1, le=10_000)
        max_failures: int = Field(default=1, ge=0, le=100, description="Retries of a failed trial.")
        time_budget_s: float | None = Field(default=None, gt=0, le=30 * 24 * 3600)
        stop: StopRules | None = Field(default=None, description="End the sweep early: a target, a time cap.")
        max_attempts: int | None = Field(
            default=None,
            ge=1,
            le=100,
            description="Claims of the sweep before the queue gives up on it (a worker that dies costs one); "
            "the service's LAYERLAB_MAX_ATTEMPTS (5) when unset. `layerlab resume` grants as many again.",
        )
        priority: int = Field(default=50, ge=0, le=100, description="Higher runs first.")
        register: Register | None = None
        claims: list[PaperClaim] = Field(
            default_factory=list, max_length=200, description="Paper claims judged after the sweep (claims.json)."
        )

        @model_validator(mode="after")
        def _search_fits_space(self) -> SweepSpec:
            overlap = sorted(set(self.params) & set(self.space))
            # Whole-spec rules: each message starts with the field path it is about (see describe_error).
            if overlap:
                raise ValueError(f"space{key_segment(overlap[0])}: also given in params; keep one of the two")
            if self.search.algorithm == "optuna":
                grids = sorted(k for k, d in self.space.items() if d.kind == "grid")
                if grids:
                    raise ValueError(
                        f"space{key_segment(grids[0])}: optuna cannot search a grid; use choice, or search: grid"
                    )
            if self.code is not None:
                if not CODE_TASK.fullmatch(self.task):
                    raise ValueError(
                        f"task: with `code`, name the Task object in it as module:attribute (my_layer:TASK), "
                        f"got {show(self.task)}"
                    )
                if self.metric.mode is None:
                    raise ValueError(
                        "metric.mode: with `code` the service does not import your code to read the metric's "
                        "direction; give min or max"
                    )
            if self.scheduler.type == "pbt":
                self._pbt_fits()
            ids = [c.id for c in self.claims]
            doubled = next((i for i, c in enumerate(ids) if ids.index(c) != i), None)
            if doubled is not None:
                raise ValueError(f"claims[{doubled}].id: {ids[doubled]!r} is used twice; give each claim its own id")
            if self.trials_total > MAX_TRIALS:
                raise ValueError(
                    f"search.num_samples: the sweep would run {self.trials_total} trials "
                    f"(num_samples x grid sizes); at most {MAX_TRIALS} are allowed"
                )
            return self

        def _pbt_fits(self) -> None:
            """PBT rewrites trial configs as it goes, which Tune allows only with its own random or grid
            variants, and restores weights through a one-process trial's checkpoints."""
            if self.search.algorithm == "optuna":
                raise ValueError(
                    "search.algorithm: PBT changes the trials' configs itself, which optuna cannot "
                    "follow; use random (or grid) with scheduler type pbt"
                )
            if self.trials_total < 2:
                raise ValueError(
                    f"search.num_samples: PBT needs a population of at least 2 trials, got {self.trials_total}"
                )
            if self.uses_train:
                raise ValueError(
                    "scheduler.type: pbt runs one-process trials; set resources.workers to 1 and "
                    "resources.gpus to 0, or use fifo or asha"
                )
            mutations = self.scheduler.hyperparam_mutations
            if not mutations:
                raise ValueError(
                    "scheduler.hyperparam_mutations: type pbt needs the params PBT may change, each with "
                    "its range (e.g. lr: {loguniform: [1e-4, 1e-2]})"
                )
            grids = sorted(k for k, d in mutations.items() if d.kind == "grid")
            if grids:
                raise ValueError(
                    f"scheduler.hyperparam_mutations{key_segment(grids[0])}: PBT draws from a range or "
                    "a choice, not a grid; use choice"
                )
            unknown = sorted(set(mutations) - set(self.space) - set(self.params))
            if unknown:
                raise ValueError(
                    f"scheduler.hyperparam_mutations{key_segment(unknown[0])}: not a param of the "
                    "sweep; give its first value in space (searched) or params (fixed)"
                )

        @property
        def trials_total(self) -> int:
            n = self.search.num_samples
            for d in self.space.values():
                if d.kind == "grid":
                    n *= len(d.grid or [])
            return n

        @property
        def uses_train(self) -> bool:
            """Trials asking for several workers or for GPUs run as Ray Train TorchTrainer jobs."""
            return self.resources.workers > 1 or self.resources.gpus > 0


# --- error messages -----------------------------------------------------------------------------


# Every number and string a task receives goes through JSON (the queue) and reaches torch, Tune and
# MLflow: NaN/Infinity have no JSON form, ints past 64 bits overflow torch and PostgreSQL, and control
# characters or unpaired surrogates in a string break file paths (NUL), logs and UTF-8 encoders.
INT64 = 2**63
_BAD_CHAR = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")


IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BRACKET = r'\[(?:-?\d[\d.e+-]*|-?Infinity|NaN|"(?:[^"\\\n]|\\.)*"|true|false|null|key)\]'
FIELD_PATH = rf"(?:[A-Za-z_]\w*|{_BRACKET})(?:\.\w+|\.?{_BRACKET})*"
"""A field path as key_segment and format_loc write it (a whole-spec rule's message starts with one)."""


def key_segment(key: Any) -> str:
    """One mapping key of a field path: `.name` for a plain identifier or an integer key, else `[<JSON>]`
    (`["a.b"]`, `["x\\n"]`, `[null]`), so that a key holding dots, colons or newlines cannot make a path
    ambiguous or an error message span two lines. Keys are not cut short: the path must name the key."""
    if isinstance(key, str) and IDENTIFIER.fullmatch(key) or type(key) is int:
        return f".{key}"
    if not (isinstance(key, str | int | float | bool) or key is None):
        key = str(key)
    text = json.dumps(key, ensure_ascii=False)
    if _BAD_CHAR.search(text):  # an unpaired surrogate: no UTF-8 response could carry it raw
        text = json.dumps(key)
    return f"[{text}]"


def format_loc(loc: tuple[Any, ...] | list[Any]) -> str:
    """A pydantic error location as a field path: `space.lr.grid[0]`, `params["a b"]`."""
    out = ""
    for part in loc:
        if type(part) is int:
            out += f"[{part}]"
        elif part == "[key]":  # pydantic's mark for a mapping's key
            out += ".[key]"
        else:
            out += key_segment(part)
    return out.removeprefix(".") or "<document>"


def _model_at(loc: tuple[Any, ...]) -> Any:
    """The pydantic model (or None) that holds the key `loc[-1]`, by walking SweepSpec's fields."""
    model: Any = SweepSpec
    for part in loc[:-1]:
        if type(part) is int:  # an item of a list field (claims[0]): the same model
            continue
        if model is SweepSpec and part == "space":
            model = dict
            continue
        if model is dict:
            model = Domain
            continue
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return None
        ann = field.annotation
        args = getattr(ann, "__args__", ())
        model = next((a for a in (ann, *args) if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if model is None:
            return None
    return model


def _allowed_keys(loc: tuple[Any, ...]) -> list[str] | None:
    fields = getattr(_model_at(loc), "model_fields", None)
    return sorted(fields) if fields else None


def _is_int_field(loc: tuple[Any, ...]) -> bool:
    field = getattr(_model_at(loc), "model_fields", {}).get(loc[-1] if loc else None)
    return field is not None and int in (field.annotation, *getattr(field.annotation, "__args__", ()))


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def describe_error(err: Mapping[str, Any], prefix: tuple[Any, ...] = (), int_field: bool | None = None) -> str:
    loc = prefix + tuple(err.get("loc", ()))
    kind, msg, ctx = err.get("type", ""), err.get("msg", ""), err.get("ctx") or {}
    value = err.get("input")
    if kind == "missing":
        return f"{format_loc(loc)}: is required"
    if kind == "extra_forbidden":
        allowed = _allowed_keys(loc) if not prefix else None
        hint = f"; allowed keys: {', '.join(allowed)}" if allowed else ""
        return f"{format_loc(loc)}: unknown key{hint}"
    if int_field is None:
        int_field = not prefix and _is_int_field(loc)
    if kind == "greater_than" and ctx.get("gt") == 0 and int_field:
        text = "must be a positive integer"
    elif kind == "literal_error":
        text = f"must be one of {ctx.get('expected', '')}"
    elif kind == "string_pattern_mismatch":
        text = "may hold only letters, digits, '_', '.', '-' (starting with a letter or digit), at most 100 chars"
        if "alias" in str(loc[-1:]):
            text = "may hold only letters, digits, '_', '-' (not starting with a digit), at most 64 chars"
    else:
        text = str(msg)
        if text.startswith("Value error, "):
            text = text[len("Value error, ") :]
            if not loc and re.match(rf"^{FIELD_PATH}: ", text):
                return text  # a whole-spec rule that names its own field
        text = text.replace("Input should be", "must be").replace("Input should have", "must have")
        text = text[:1].lower() + text[1:]
    got = f", got {show(value)}" if _scalar(value) and kind not in ("value_error", "assertion_error") else ""
    return f"{format_loc(loc)}: {text}{got}"


# --- task params --------------------------------------------------------------------------------


def _value_errors(params: Any, space: Any) -> dict[str, str]:
    """Field path -> error, for every unusable number or string among task params and searched values."""
    found: dict[str, str] = {}
    stack: list[tuple[str, Any]] = []
    if isinstance(params, dict):
        stack += [(f"params{key_segment(k)}", v) for k, v in params.items()]
    if isinstance(space, dict):
        for k, domain in space.items():
            for kind, values in domain.items() if isinstance(domain, dict) else ():
                if kind in ("grid", "choice") and isinstance(values, list):
                    stack += [(f"space{key_segment(k)}{key_segment(kind)}[{i}]", v) for i, v in enumerate(values)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            found[path] = f"{path}: must be a finite number, got {value!r}"
        elif type(value) is int and not -INT64 <= value < INT64:
            found[path] = f"{path}: must be an integer of at most 64 bits (|value| < 2**63), got {show(value)}"
        elif isinstance(value, str) and (bad := _BAD_CHAR.search(value)):
            found[path] = (
                f"{path}: must not hold control characters or unpaired surrogates "
                f"(U+{ord(bad.group()):04X} at index {bad.start()}), got {show(value)}"
            )
        elif isinstance(value, list):
            stack += [(f"{path}[{i}]", v) for i, v in enumerate(value)]
        elif isinstance(value, dict):
            stack += [(f"{path}{key_segment(k)}", v) for k, v in value.items()]
    return found


def _runtime_form(hint: Any, value: Any) -> Any:
    """The value as the task's dataclass takes it at run time: a JSON list where the field is a tuple."""
    while typing.get_origin(hint) is typing.Annotated:
        hint = typing.get_args(hint)[0]
    return tuple(value) if typing.get_origin(hint) is tuple and isinstance(value, list) else value


def _task_param_errors(task: Task, params: Any, space: Any) -> list[str]:
    """Check fixed params and every searched value against the task's config dataclass.

    Each value is first checked strictly against its field's annotation (the worker builds the config
    with the task's own checks, which coerce nothing: "16" or 16.0 for an int would fail every trial),
    then the values that pass go through the dataclass as a whole, for its cross-field rules.
    """
    from pydantic import ConfigDict, TypeAdapter

    task_name = task.name
    adapter: TypeAdapter[Any] = TypeAdapter(task.config)
    hints = typing.get_type_hints(task.config, include_extras=True)
    strict = {k: TypeAdapter(h, config=ConfigDict(strict=True)) for k, h in hints.items()}

    def is_int(name: Any) -> bool:
        hint = hints.get(name)
        for _ in range(4):  # unwrap Annotated[...] and X | None
            if hint is int:
                return True
            args = typing.get_args(hint)
            hint = args[0] if args else None
        return False

    known = set(task.defaults())
    errors: list[str] = []
    fixed = params if isinstance(params, dict) else {}
    for key in sorted(set(fixed) - known, key=str):  # key=str: a YAML key may be a number
        errors.append(
            f"params{key_segment(key)}: unknown parameter for task {task_name}; known: {', '.join(sorted(known))}"
        )
    fixed = {k: v for k, v in fixed.items() if k in known}

    def check(values: dict[str, Any], where: dict[str, tuple[Any, ...]]) -> list[str]:
        out = []
        for key in where:
            try:
                strict[key].validate_python(_runtime_form(hints[key], values[key]))
            except ValidationError as exc:
                out += [describe_error(err, where[key], int_field=is_int(key)) for err in exc.errors()]
                values = {k: v for k, v in values.items() if k != key}
        try:
            adapter.validate_python(values)
        except ValidationError as exc:
            for err in exc.errors():
                loc = err.get("loc", ())
                field = loc[0] if loc else None
                if field in where and field in values:
                    out.append(describe_error({**err, "loc": loc[1:]}, where[field], int_field=is_int(field)))
                elif not loc:  # a cross-field rule (__post_init__); its message starts with its field
                    text = describe_error(err)
                    out.append(f"params.{text}" if re.match(r"^\w+: ", text) else f"params: {text.split(': ', 1)[-1]}")
        return out

    fixed_errors = check(fixed, {k: ("params", k) for k in fixed})
    errors += fixed_errors
    if isinstance(space, dict):
        for key, domain in sorted(space.items(), key=lambda kv: str(kv[0])):
            if key not in known:
                where = f"space{key_segment(key)}"
                errors.append(f"{where}: unknown parameter for task {task_name}; known: {', '.join(sorted(known))}")
                continue
            if not isinstance(domain, Domain):
                continue
            for sub, value in domain.values_to_check():
                for e in check({**fixed, key: value}, {key: ("space", key, *sub)}):
                    if not e.startswith("params"):
                        errors.append(e)
                    elif not fixed_errors:  # a cross-field rule (__post_init__) broken by this searched value
                        errors.append(f"{format_loc(('space', key, *sub))}: {e.removeprefix('params.')}")
    return sorted(set(errors), key=errors.index)


def parse_spec(
    source: str | bytes | dict[str, Any], data_roots: str | None = None, code_task: Task | None = None
) -> SweepSpec:
    """Validate a sweep spec (YAML text or an already-parsed mapping); raise SpecError with every problem.
    `data_roots`: where task params that name a file or folder may point (default: LAYERLAB_DATA_ROOTS).
    A spec that brings `code` is checked against `code_task`, the Task imported from it where the caller may
    import the code (`layerlab validate`); without one (the API, which never imports brought code) its params
    are checked for plain data only, and the worker's config check fails a bad one."""
    data = source if isinstance(source, dict) else load_yaml(source)
    if not isinstance(data, dict):
        raise SpecError([f"<document>: a sweep spec is a mapping of keys (name, task, ...), got {type(data).__name__}"])
    errors: list[str] = []
    spec: SweepSpec | None = None
    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as exc:
        errors = [describe_error(e) for e in exc.errors()]
    unusable = _value_errors(data.get("params"), data.get("space"))
    task, task_error = _resolve_task(data, code_task)
    errors += task_error
    if task is not None:
        space = spec.space if spec else _parse_domains(data.get("space"))
        errors += _task_param_errors(task, data.get("params", {}), space)
        if spec is not None and spec.scheduler.hyperparam_mutations:  # each range PBT may draw from, like space's
            found = _task_param_errors(task, data.get("params", {}), spec.scheduler.hyperparam_mutations)
            errors += [f"scheduler.hyperparam_mutations{e[len('space') :]}" for e in found if e.startswith("space")]
        roots = get_settings().data_roots if data_roots is None else data_roots
        params = data.get("params")
        errors += data_path_errors(task.config, params if isinstance(params, dict) else {}, space, roots)
        metric = data.get("metric")
        if isinstance(metric, dict) and isinstance(metric.get("name"), str):
            errors += _metric_errors(task, metric["name"])
        if spec is not None:
            errors += _claim_errors(spec, task)
    if unusable:
        # One message per unusable value: drop what the task's checks said about the same value.
        errors = [e for e in errors if not any(e.startswith((p + ":", p + "[", p + ".")) for p in unusable)]
        errors += sorted(unusable.values())
    if errors:
        raise SpecError(errors)
    assert spec is not None
    if spec.metric.mode is None:
        assert task is not None  # a spec with code must give the mode (SweepSpec)
        mode = task.metrics[spec.metric.name]
        spec = spec.model_copy(update={"metric": Metric(name=spec.metric.name, mode=mode)})  # type: ignore[arg-type]
    return spec


def _resolve_task(data: dict[str, Any], code_task: Task | None) -> tuple[Task | None, list[str]]:
    """The Task the spec's params are checked against, or None with the error that says why there is none."""
    task_name = data.get("task")
    if not (isinstance(task_name, str) and 0 < len(task_name) <= 100):
        return None, []  # SweepSpec's own error names it
    if data.get("code") is not None:
        return code_task, []
    from jobs.registry import UnknownTaskError, get_task

    try:
        return get_task(task_name), []
    except UnknownTaskError as exc:
        return None, [f"task: {exc}"]


def _parse_domains(space: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(space, dict):
        for key, raw in space.items():
            try:
                out[key] = Domain.model_validate(raw)
            except ValidationError:
                out[key] = None
    return out


def _metric_errors(task: Task, metric: str) -> list[str]:
    metrics = task.metrics
    if metric not in metrics:
        return [f"metric.name: task {task.name} reports {', '.join(metrics)}; got {show(metric)}"]
    return []


def _claim_errors(spec: SweepSpec, task: Task) -> list[str]:
    """Each claim's metric and baseline must be metrics of the task; its conditions must be able to match a
    trial: keys the sweep sets (params or space), values that params or a grid/choice can give."""
    metrics = task.metrics
    errors: list[str] = []
    for i, claim in enumerate(spec.claims):
        at = f"claims[{i}]"
        for field in ("metric", "baseline", "count"):
            name = getattr(claim, field)
            if name is not None and name not in metrics:
                errors.append(f"{at}.{field}: task {spec.task} reports {', '.join(metrics)}; got {show(name)}")
        for j, name in enumerate(claim.baselines or []):
            if name not in metrics:
                errors.append(f"{at}.baselines[{j}]: task {spec.task} reports {', '.join(metrics)}; got {show(name)}")
        for field in ("where", "versus"):
            condition = getattr(claim, field)
            if condition is None:
                continue
            pooled = pooled_settings(spec, condition, claim.replicates)
            if pooled:
                errors.append(
                    f"{at}.{field}: pools trials that differ in {', '.join(pooled)}, not only in "
                    f"{', '.join(claim.replicates)}; fix {'them' if len(pooled) > 1 else 'it'} in {field}, or declare "
                    "independent replicates in `replicates`"
                )
        for field in ("where", "versus"):
            for key, value in (getattr(claim, field) or {}).items():
                where = f"{at}.{field}{key_segment(key)}"
                possible = _possible_values(spec, key)
                if possible is None:
                    errors.append(f"{where}: the sweep sets no parameter {show(key)}; name one of params or space")
                elif possible and not any(_same_value(value, v) for v in possible):
                    shown = ", ".join(show(v) for v in possible[:20])
                    errors.append(f"{where}: no trial of this sweep has {show(value)}; its values: {shown}")
    return errors


def pooled_settings(spec: SweepSpec, condition: dict[str, Any], replicates: list[str]) -> list[str]:
    """The searched keys, besides the replicates, whose values differ among the trials a condition selects."""
    varying = []
    for key in spec.space:
        if key in condition or key in replicates:
            continue
        values = _possible_values(spec, key)
        if values is None or values == [] or len({json.dumps(v, sort_keys=True) for v in values}) > 1:
            varying.append(key)
    return varying


def _possible_values(spec: SweepSpec, key: str) -> list[Any] | None:
    """The values a trial's `key` can take: [params value], a grid's or choice's values, [] for a continuous
    space (any value may match), None when the sweep sets no such parameter."""
    if key in spec.params:
        return [spec.params[key]]
    domain = spec.space.get(key)
    if domain is None:
        return None
    return list(getattr(domain, domain.kind)) if domain.kind in ("grid", "choice") else []


def _same_value(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def spec_to_yaml(spec: SweepSpec) -> str:
    return yaml.safe_dump(spec.model_dump(mode="json", exclude_none=True), sort_keys=False)
