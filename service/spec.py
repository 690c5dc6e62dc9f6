"""SweepSpec: the sweep YAML, validated at the edge.

`parse_spec(text_or_dict)` returns a `SweepSpec` or raises `SpecError` holding every problem at once,
each as `field.path: what is wrong, got <value>`. Task params (fixed and searched) are checked
against the task's own config dataclass (jobs/registry.py) before anything is queued.
"""

from __future__ import annotations

import math
import re
import typing
import warnings
from collections.abc import Mapping
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from service.errors import SpecError

NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"
ALIAS_RE = r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$"
MAX_TRIALS = 100_000
MAX_DEPTH = 20


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

    def values_to_check(self) -> list[tuple[str, Any]]:
        """(sub-path, value) pairs that must each be a valid value of the parameter."""
        kind = self.kind
        value = getattr(self, kind)
        if kind in ("grid", "choice"):
            return [(f"{kind}[{i}]", v) for i, v in enumerate(value)]
        if kind == "randint":
            return [(f"{kind}[0]", value[0]), (f"{kind}[1]", value[1] - 1)]
        return [(f"{kind}[0]", value[0]), (f"{kind}[1]", value[1])]


class Search(_Strict):
    algorithm: Literal["grid", "random", "optuna"] = Field(default="grid")
    num_samples: int = Field(default=1, ge=1, le=MAX_TRIALS, description="Repeats of the grid, or samples.")
    seed: int | None = Field(default=None, ge=0, description="Seed of the search algorithm.")


class Scheduler(_Strict):
    type: Literal["fifo", "asha"] = "fifo"
    max_t: int = Field(default=100, ge=1, description="ASHA: most iterations a trial may run.")
    grace_period: int = Field(default=1, ge=1, description="ASHA: iterations before a trial may be stopped.")
    reduction_factor: float = Field(default=2.0, gt=1, le=100)

    @model_validator(mode="after")
    def _grace_below_max(self) -> Scheduler:
        if self.grace_period > self.max_t:
            raise ValueError(f"grace_period ({self.grace_period}) must be <= max_t ({self.max_t})")
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


with warnings.catch_warnings():
    # `register` shadows ABCMeta.register on the class only; instances read the field. Keep the YAML key.
    warnings.filterwarnings("ignore", message='Field name "register"')

    class SweepSpec(_Strict):
        name: str = Field(pattern=NAME_RE, description="Also the MLflow experiment name.")
        task: str = Field(min_length=1)
        metric: Metric
        params: dict[str, Any] = Field(default_factory=dict, description="Fixed task config.")
        space: dict[str, Domain] = Field(default_factory=dict, description="Searched task config.")
        search: Search = Field(default_factory=Search)
        scheduler: Scheduler = Field(default_factory=Scheduler)
        resources: Resources = Field(default_factory=Resources)
        max_concurrent_trials: int | None = Field(default=None, ge=1, le=10_000)
        max_failures: int = Field(default=1, ge=0, le=100, description="Retries of a failed trial.")
        time_budget_s: float | None = Field(default=None, gt=0, le=30 * 24 * 3600)
        priority: int = Field(default=50, ge=0, le=100, description="Higher runs first.")
        register: Register | None = None

        @model_validator(mode="after")
        def _search_fits_space(self) -> SweepSpec:
            overlap = sorted(set(self.params) & set(self.space))
            # Whole-spec rules: each message starts with the field path it is about (see describe_error).
            if overlap:
                raise ValueError(f"space.{overlap[0]}: also given in params; keep one of the two")
            if self.search.algorithm == "optuna":
                grids = sorted(k for k, d in self.space.items() if d.kind == "grid")
                if grids:
                    raise ValueError(f"space.{grids[0]}: optuna cannot search a grid; use choice, or search: grid")
            if self.trials_total > MAX_TRIALS:
                raise ValueError(
                    f"search.num_samples: the sweep would run {self.trials_total} trials "
                    f"(num_samples x grid sizes); at most {MAX_TRIALS} are allowed"
                )
            return self

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


# --- loading YAML safely ------------------------------------------------------------------------


class _NoAliasLoader(yaml.SafeLoader):
    """A safe loader that refuses anchors/aliases: they can expand a small file into a huge spec."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.YAMLError(f"YAML aliases (*{event.anchor}) are not allowed in a sweep spec; write values out")
        if self.depth > MAX_DEPTH:
            raise yaml.YAMLError(f"the document nests deeper than {MAX_DEPTH} levels")
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self.depth = 0


def load_yaml(text: str | bytes) -> Any:
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SpecError([f"<document>: not UTF-8 text (byte {exc.start}); save the file as UTF-8"]) from None
    try:
        return yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        where = ""
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError([f"<document>: not valid YAML{where}: {problem}"]) from None


# --- error messages -----------------------------------------------------------------------------


def format_loc(loc: tuple[Any, ...] | list[Any]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "<document>"


def _model_at(loc: tuple[Any, ...]) -> Any:
    """The pydantic model (or None) that holds the key `loc[-1]`, by walking SweepSpec's fields."""
    model: Any = SweepSpec
    for part in loc[:-1]:
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
            if not loc and re.match(r"^[A-Za-z_][\w.\[\]]*: ", text):
                return text  # a whole-spec rule that names its own field
        text = text.replace("Input should be", "must be").replace("Input should have", "must have")
        text = text[:1].lower() + text[1:]
    got = f", got {value!r}" if _scalar(value) and kind not in ("value_error", "assertion_error") else ""
    return f"{format_loc(loc)}: {text}{got}"


# --- task params --------------------------------------------------------------------------------


def _task_param_errors(task_name: str, params: Any, space: Any) -> list[str]:
    """Check fixed params and every searched value against the task's config dataclass."""
    from pydantic import TypeAdapter

    from jobs.registry import UnknownTaskError, get_task

    try:
        task = get_task(task_name)
    except UnknownTaskError as exc:
        return [f"task: {exc}"]
    adapter: TypeAdapter[Any] = TypeAdapter(task.config)
    hints = typing.get_type_hints(task.config)

    def is_int(name: Any) -> bool:
        hint = hints.get(name)
        for _ in range(3):  # unwrap Annotated[...] and X | None
            if hint is int:
                return True
            args = typing.get_args(hint)
            hint = args[0] if args else None
        return False

    known = set(task.defaults())
    errors: list[str] = []
    fixed = params if isinstance(params, dict) else {}
    for key in sorted(set(fixed) - known, key=str):  # key=str: a YAML key may be a number
        errors.append(f"params.{key}: unknown parameter for task {task_name}; known: {', '.join(sorted(known))}")
    fixed = {k: v for k, v in fixed.items() if k in known}

    def check(values: dict[str, Any], where: dict[str, tuple[Any, ...]]) -> list[str]:
        try:
            adapter.validate_python(values)
        except ValidationError as exc:
            out = []
            for err in exc.errors():
                loc = err.get("loc", ())
                key = loc[0] if loc else None
                if key in where:
                    out.append(describe_error({**err, "loc": loc[1:]}, where[key], int_field=is_int(key)))
                elif not loc:  # a cross-field rule (__post_init__); its message starts with its field
                    text = describe_error(err)
                    out.append(f"params.{text}" if re.match(r"^\w+: ", text) else f"params: {text.split(': ', 1)[-1]}")
            return out
        return []

    fixed_errors = check(fixed, {k: ("params", k) for k in fixed})
    errors += fixed_errors
    if isinstance(space, dict):
        for key, domain in sorted(space.items(), key=lambda kv: str(kv[0])):
            if key not in known:
                errors.append(f"space.{key}: unknown parameter for task {task_name}; known: {', '.join(sorted(known))}")
                continue
            if not isinstance(domain, Domain):
                continue
            for sub, value in domain.values_to_check():
                for e in check({**fixed, key: value}, {key: ("space", key, sub)}):
                    if not e.startswith("params"):
                        errors.append(e)
                    elif not fixed_errors:  # a cross-field rule (__post_init__) broken by this searched value
                        errors.append(f"space.{key}.{sub}: {e.removeprefix('params.')}")
    return sorted(set(errors), key=errors.index)


def parse_spec(source: str | bytes | dict[str, Any]) -> SweepSpec:
    """Validate a sweep spec (YAML text or an already-parsed mapping); raise SpecError with every problem."""
    data = source if isinstance(source, dict) else load_yaml(source)
    if not isinstance(data, dict):
        raise SpecError([f"<document>: a sweep spec is a mapping of keys (name, task, ...), got {type(data).__name__}"])
    errors: list[str] = []
    spec: SweepSpec | None = None
    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as exc:
        errors = [describe_error(e) for e in exc.errors()]
    task_name = data.get("task")
    if isinstance(task_name, str) and task_name:
        space = spec.space if spec else _parse_domains(data.get("space"))
        errors += _task_param_errors(task_name, data.get("params", {}), space)
        metric = data.get("metric")
        if isinstance(metric, dict) and isinstance(metric.get("name"), str):
            errors += _metric_errors(task_name, metric["name"])
    if errors:
        raise SpecError(errors)
    assert spec is not None
    if spec.metric.mode is None:
        from jobs.registry import get_task

        mode = get_task(spec.task).metrics[spec.metric.name]
        spec = spec.model_copy(update={"metric": Metric(name=spec.metric.name, mode=mode)})  # type: ignore[arg-type]
    return spec


def _parse_domains(space: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(space, dict):
        for key, raw in space.items():
            try:
                out[key] = Domain.model_validate(raw)
            except ValidationError:
                out[key] = None
    return out


def _metric_errors(task_name: str, metric: str) -> list[str]:
    from jobs.registry import UnknownTaskError, get_task

    try:
        metrics = get_task(task_name).metrics
    except UnknownTaskError:
        return []  # reported once, under `task`
    if metric not in metrics:
        return [f"metric.name: task {task_name} reports {', '.join(metrics)}; got {metric!r}"]
    return []


def spec_to_yaml(spec: SweepSpec) -> str:
    return yaml.safe_dump(spec.model_dump(mode="json", exclude_none=True), sort_keys=False)
