"""SweepSpec at the edge: every bad spec is rejected with messages that name the field, all at once."""

from __future__ import annotations

import copy
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.errors import SpecError
from service.spec import SweepSpec, parse_spec
from service.spec_loading import MAX_DEPTH

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "sweeps" / "tversky_xor_demo.yaml"
LAYERLAB = Path(sys.executable).parent / "layerlab"
DEMO_TEXT = DEMO.read_text()
DROP = object()
# `<document>` or a dotted field path with [i] indices (`.[key]` is pydantic's mark for a mapping's key).
FIELD_PATH = re.compile(r"^(<document>|[A-Za-z_]\w*(\.\w+|\[\d+\]|\.\[key\])*): \S")


def mutate(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of `base` with each dotted path set to its value (DROP deletes the key)."""
    out = copy.deepcopy(base)
    for path, value in changes.items():
        *parents, last = path.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        if value is DROP:
            del node[last]
        else:
            node[last] = value
    return out


def errors_of(source: str | bytes | dict[str, Any]) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_spec(source)
    return info.value.errors


PBT_LR = {"type": "pbt", "hyperparam_mutations": {"lr": {"loguniform": [0.001, 0.5]}}}
# (id, YAML text/bytes or {dotted.path: value} applied to the demo spec, expected start of one error)
BAD_SPECS: list[tuple[str, str | bytes | dict[str, Any], str]] = [
    ("broken-yaml", "name: [unclosed\n", "<document>: not valid YAML at line 2"),
    ("bad-indent", "name: a\n  task: b\n", "<document>: not valid YAML at line 2"),
    ("python-tag", "name: !!python/object:os.system x\n", "<document>: not valid YAML"),
    ("not-a-mapping", "- name\n- task\n", "<document>: a sweep spec is a mapping of keys"),
    ("empty-document", "", "<document>: a sweep spec is a mapping of keys"),
    ("unknown-key", {"bogus": 1}, "bogus: unknown key; allowed keys: claims, code, max_attempts, max_concurrent"),
    ("unknown-nested-key", {"resources.memory": "4G"}, "resources.memory: unknown key; allowed keys: cpus, gpus"),
    ("missing-name", {"name": DROP}, "name: is required"),
    ("missing-metric", {"metric": DROP}, "metric: is required"),
    ("unknown-task", {"task": "nope"}, "task: unknown task 'nope'; known tasks: "),
    ("unknown-param", {"params.depth": 3}, "params.depth: unknown parameter for task tversky.xor; known:"),
    ("unknown-searched-param", {"space.depth": {"grid": [1]}}, "space.depth: unknown parameter for task"),
    ("wrong-type-param", {"params.features": "many"}, "params.features: must be a valid integer"),
    ("nan-param", {"params.steps": math.nan}, "params.steps: must be a finite number, got nan"),
    ("cross-field-param", {"params.steps": 10}, "params.report_every: must be <= steps (10), got 100"),
    (
        "negative-grid-value",
        {"params.features": DROP, "space.features": {"grid": [4, 8, -4]}},
        "space.features.grid[2]: must be a positive integer, got -4",
    ),
    (
        "bad-grid-choice",
        {"space.intersection": {"grid": ["product", "median"]}},
        "space.intersection.grid[1]: must be one of 'product', 'min'",
    ),
    (
        "searched-value-breaks-cross-field-rule",
        {"params.steps": DROP, "space.steps": {"grid": [10, 1000]}},
        "space.steps.grid[0]: report_every: must be <= steps (10), got 100",
    ),
    ("empty-grid", {"space.seed": {"grid": []}}, "space.seed.grid: list should have at least 1 item"),
    ("domain-not-a-mapping", {"space.seed": [0, 1]}, "space.seed: must be a valid dictionary"),
    ("two-domain-kinds", {"space.seed": {"grid": [0], "choice": [1]}}, "space.seed: give exactly one of grid"),
    (
        "uniform-low-above-high",
        {"params.lr": DROP, "space.lr": {"uniform": [1.0, 0.1]}},
        "space.lr: uniform needs low < high, got [1.0, 0.1]",
    ),
    (
        "loguniform-at-zero",
        {"params.lr": DROP, "space.lr": {"loguniform": [0, 1]}},
        "space.lr: loguniform needs low > 0",
    ),
    (
        "uniform-infinite",
        {"params.lr": DROP, "space.lr": {"uniform": [0, math.inf]}},
        "space.lr: uniform bounds must be finite",
    ),
    ("randint-empty", {"space.seed": {"randint": [5, 5]}}, "space.seed: randint needs low < high, got [5, 5]"),
    ("param-in-both", {"params.seed": 0}, "space.seed: also given in params; keep one of the two"),
    ("negative-cpus", {"resources.cpus": -1}, "resources.cpus: must be greater than 0, got -1"),
    ("negative-gpus", {"resources.gpus": -1}, "resources.gpus: must be greater than or equal to 0, got -1"),
    ("zero-workers", {"resources.workers": 0}, "resources.workers: must be greater than or equal to 1, got 0"),
    ("absurd-num-samples", {"search.num_samples": 10**9}, "search.num_samples: must be less than or equal to 100000"),
    ("too-many-trials", {"search.num_samples": 10_000}, "search.num_samples: the sweep would run 240000 trials"),
    ("negative-search-seed", {"search.seed": -1}, "search.seed: must be greater than or equal to 0, got -1"),
    ("unknown-algorithm", {"search.algorithm": "bayes"}, "search.algorithm: must be one of 'grid', 'random'"),
    ("optuna-on-grid", {"search.algorithm": "optuna"}, "space.difference: optuna cannot search a grid"),
    ("priority-too-high", {"priority": 101}, "priority: must be less than or equal to 100, got 101"),
    ("priority-negative", {"priority": -1}, "priority: must be greater than or equal to 0, got -1"),
    ("priority-not-int", {"priority": "high"}, "priority: must be a valid integer"),
    ("unknown-metric", {"metric.name": "bleu"}, "metric.name: task tversky.xor reports loss, accuracy, converged"),
    ("bad-metric-mode", {"metric.mode": "up"}, "metric.mode: must be one of 'min' or 'max', got 'up'"),
    ("unknown-scheduler", {"scheduler.type": "hyperband"}, "scheduler.type: must be one of 'fifo', 'asha' or 'pbt'"),
    (
        "grace-above-max-t",
        {"scheduler": {"type": "asha", "grace_period": 10, "max_t": 5}},
        "scheduler: grace_period (10) must be <= max_t (5)",
    ),
    ("reserved-alias", {"register.alias": "latest"}, "register.alias: alias 'latest' is reserved by MLflow"),
    ("version-alias", {"register.alias": "v3"}, "register.alias: alias 'v3' is reserved by MLflow"),
    ("bad-model-name", {"register.model": "a b"}, "register.model: may hold only letters"),
    ("negative-time-budget", {"time_budget_s": -5}, "time_budget_s: must be greater than 0, got -5"),
    ("empty-stop", {"stop": {}}, "stop: give target, max_minutes or both (or leave `stop` out)"),
    ("zero-stop-minutes", {"stop": {"max_minutes": 0}}, "stop.max_minutes: must be greater than 0, got 0"),
    ("nan-stop-target", {"stop": {"target": float("nan")}}, "stop.target: must be a finite number"),
    ("unknown-stop-rule", {"stop": {"target": 1, "patience": 3}}, "stop.patience"),
    ("pbt-without-mutations", {"scheduler": {"type": "pbt"}}, "scheduler.hyperparam_mutations: type pbt needs"),
    (
        "pbt-grid-mutation",
        {"scheduler": PBT_LR | {"hyperparam_mutations": {"lr": {"grid": [0.1, 0.2]}}}},
        "scheduler.hyperparam_mutations.lr: PBT draws from a range or a choice, not a grid",
    ),
    (
        "pbt-unknown-param",
        {"scheduler": PBT_LR | {"hyperparam_mutations": {"lrx": {"uniform": [0.1, 0.2]}}}},
        "scheduler.hyperparam_mutations.lrx: not a param of the sweep",
    ),
    (
        "pbt-range-the-task-refuses",
        {"scheduler": PBT_LR | {"hyperparam_mutations": {"lr": {"uniform": [-1, 0.2]}}}},
        "scheduler.hyperparam_mutations.lr.uniform[0]: must be greater than 0",
    ),
    ("pbt-under-ray-train", {"scheduler": PBT_LR, "resources.workers": 2}, "scheduler.type: pbt runs one-process"),
    (
        "pbt-zero-interval",
        {"scheduler": PBT_LR | {"perturbation_interval": 0}},
        "scheduler.perturbation_interval: must be greater than or equal to 1",
    ),
    (
        "pbt-with-optuna",
        {"scheduler": PBT_LR, "space": {"seed": {"choice": [0, 1]}}, "search.algorithm": "optuna"},
        "search.algorithm: PBT changes the trials' configs itself",
    ),
    ("negative-max-failures", {"max_failures": -1}, "max_failures: must be greater than or equal to 0, got -1"),
    ("zero-concurrency", {"max_concurrent_trials": 0}, "max_concurrent_trials: must be greater than or equal to 1"),
    # A YAML key may be a number; next to string keys it once made the checks crash sorting them.
    ("numeric-param-key", DEMO_TEXT.replace("  lr: 0.1\n", "  lr: 0.1\n  1: 2\n"), "params.1: unknown parameter"),
    ("numeric-space-key", DEMO_TEXT.replace("  seed: {", "  2: {grid: [1]}\n  seed: {"), "space.2: unknown parameter"),
]


@pytest.mark.parametrize(("source", "prefix"), [case[1:] for case in BAD_SPECS], ids=[case[0] for case in BAD_SPECS])
def test_bad_spec_is_rejected_naming_the_field(
    demo_dict: dict[str, Any], source: str | bytes | dict[str, Any], prefix: str
) -> None:
    if isinstance(source, dict):
        source = mutate(demo_dict, source)
    errors = errors_of(source)
    assert any(e.startswith(prefix) for e in errors), errors
    assert all(FIELD_PATH.match(e) for e in errors), errors


def test_bad_spec_table_is_large_enough() -> None:
    assert len(BAD_SPECS) >= 25
    assert len({case[0] for case in BAD_SPECS}) == len(BAD_SPECS)


def test_every_error_is_reported_at_once(demo_dict: dict[str, Any]) -> None:
    changes = {
        "name": "a/b",
        "priority": 500,
        "resources.cpus": 0,
        "bogus": True,
        "params.depth": 3,
        "params.features": DROP,
        "space.features": {"grid": [4, 8, -4]},
        "metric.name": "bleu",
    }
    errors = errors_of(mutate(demo_dict, changes))
    expected = [
        "name: may hold only letters",
        "priority: must be less than or equal to 100, got 500",
        "resources.cpus: must be greater than 0, got 0",
        "bogus: unknown key",
        "params.depth: unknown parameter",
        "space.features.grid[2]: must be a positive integer, got -4",
        "metric.name: task tversky.xor reports",
    ]
    for prefix in expected:
        assert sum(e.startswith(prefix) for e in errors) == 1, (prefix, errors)
    assert len(errors) == len(expected), errors


def test_the_error_message_lists_every_error(demo_dict: dict[str, Any]) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(mutate(demo_dict, {"priority": 101, "resources.cpus": -1}))
    assert str(info.value) == (
        "invalid sweep spec:\n"
        "  resources.cpus: must be greater than 0, got -1\n"
        "  priority: must be less than or equal to 100, got 101"
    )


@pytest.mark.parametrize(
    "text",
    ["a: &x 1\nb: *x\n", "lol: &l [x, x]\nlol2: [*l, *l, *l]\n"],
    ids=["scalar", "billion-laughs"],
)
def test_yaml_aliases_are_rejected(text: str) -> None:
    errors = errors_of(text)
    assert len(errors) == 1 and errors[0].startswith("<document>: not valid YAML"), errors
    assert "YAML aliases (*" in errors[0] and "are not allowed in a sweep spec" in errors[0]


def test_an_anchored_value_in_a_valid_spec_is_rejected(demo_yaml: str) -> None:
    text = demo_yaml.replace("steps: 1000", "steps: &n 1000") + "time_budget_s: *n\n"
    assert errors_of(text) == [
        "<document>: not valid YAML: YAML aliases (*n) are not allowed in a sweep spec; write values out"
    ]


def test_non_utf8_bytes_are_rejected(demo_yaml: str) -> None:
    body = demo_yaml.encode().replace(b"tversky-xor-demo", b"caf\xe9")
    errors = errors_of(body)
    assert len(errors) == 1 and errors[0].startswith("<document>: not UTF-8 text (byte "), errors
    assert errors[0].endswith("save the file as UTF-8")


@pytest.mark.parametrize(
    "text",
    ["a: " + "[" * 50 + "]" * 50 + "\n", "".join(f"{'  ' * i}k{i}:\n" for i in range(50)) + "  " * 50 + "x: 1\n"],
    ids=["flow", "block"],
)
def test_deeply_nested_documents_are_rejected(text: str) -> None:
    assert errors_of(text) == [f"<document>: not valid YAML: the document nests deeper than {MAX_DEPTH} levels"]


@pytest.mark.parametrize(
    "name",
    [
        "a/b",
        "../../etc/passwd",
        "x; rm -rf ~",
        "$(reboot)",
        "`id`",
        "a|b",
        "a b",
        "a&&b",
        "-rf",
        ".hidden",
        "é",
        "x" * 101,
    ],
)
def test_names_with_slashes_or_shell_characters_are_rejected(demo_dict: dict[str, Any], name: str) -> None:
    errors = errors_of(mutate(demo_dict, {"name": name}))
    assert errors == [
        "name: may hold only letters, digits, '_', '.', '-' (starting with a letter or digit), at most 100 chars, "
        f"got {name!r}"
    ]
    assert errors_of(mutate(demo_dict, {"register.model": name}))[0].startswith("register.model: may hold only")


def test_the_demo_spec_parses(demo_yaml: str, demo_dict: dict[str, Any]) -> None:
    for source in (demo_yaml, demo_yaml.encode(), demo_dict):
        spec = parse_spec(source)
        assert isinstance(spec, SweepSpec)
        assert spec.name == "tversky-xor-demo" and spec.task == "tversky.xor"
        assert spec.trials_total == 24  # 6 intersections x 2 differences x 2 seeds
        assert (spec.metric.name, spec.metric.mode) == ("accuracy", "max")
        assert spec.priority == 50 and not spec.uses_train
        assert spec.register is not None and spec.register.model == "tversky-xor"


def test_metric_mode_defaults_to_the_tasks(demo_dict: dict[str, Any]) -> None:
    spec = parse_spec(mutate(demo_dict, {"metric": {"name": "loss"}}))
    assert spec.metric.mode == "min"


def test_num_samples_repeats_the_grid(demo_dict: dict[str, Any]) -> None:
    assert parse_spec(mutate(demo_dict, {"search.num_samples": 3})).trials_total == 72


# --- `layerlab validate` ------------------------------------------------------------------------


def validate(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LAYERLAB), "validate", str(path)], capture_output=True, text=True, timeout=60)


def test_validate_prints_every_error_and_exits_2(tmp_path: Path, demo_dict: dict[str, Any]) -> None:
    changes = {"priority": 101, "resources.cpus": -1, "bogus": 1, "params.features": DROP}
    changes["space.features"] = {"grid": [4, 8, -4]}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(mutate(demo_dict, changes)))
    expected = errors_of(path.read_bytes())
    assert len(expected) == 4

    proc = validate(path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0] == f"{path}: 4 error(s)"
    assert lines[1:] == [f"  {e}" for e in expected]
    assert "space.features.grid[2]: must be a positive integer, got -4" in proc.stderr


def test_validate_accepts_the_demo_spec() -> None:
    proc = validate(DEMO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"{DEMO}: ok — task tversky.xor, 24 trial(s), metric accuracy (max)"


def test_validate_prints_values_that_look_like_markup(tmp_path: Path, demo_dict: dict[str, Any]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(mutate(demo_dict, {"name": "[/x] [bold]y"})))
    proc = validate(path)
    assert proc.returncode == 2, proc.stderr
    assert "got '[/x] [bold]y'" in proc.stderr


# --- property: mutations of the valid spec never escape as another exception --------------------


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = []
    if isinstance(node, dict):
        for key, child in node.items():
            out += [prefix + (key,), *_paths(child, prefix + (key,))]
    elif isinstance(node, list):
        for i, child in enumerate(node):
            out += [prefix + (i,), *_paths(child, prefix + (i,))]
    return out


_DEMO_DICT = yaml.safe_load(DEMO.read_text())
_DEMO_PATHS = _paths(_DEMO_DICT)
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**12), max_value=10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["", "grid", "product", "accuracy", "tversky.xor", "-1", "1e309", "[/x]"]),
)
_MUTATION = st.tuples(st.sampled_from(_DEMO_PATHS), st.one_of(st.just(DROP), _SCALARS))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutations=st.lists(_MUTATION, min_size=1, max_size=4))
def test_random_mutations_parse_or_name_the_field(mutations: list[tuple[tuple[Any, ...], Any]]) -> None:
    data = copy.deepcopy(_DEMO_DICT)
    for path, value in mutations:
        node: Any = data
        for part in path[:-1]:
            if not isinstance(node, dict | list):
                break
            try:
                node = node[part]
            except (KeyError, IndexError):
                break
        else:
            if isinstance(node, dict) and value is DROP:
                node.pop(path[-1], None)
            elif isinstance(node, dict) or (isinstance(node, list) and path[-1] < len(node)):
                node[path[-1]] = None if value is DROP and isinstance(node, list) else value
    try:
        spec = parse_spec(data)
    except SpecError as exc:
        assert exc.errors
        bad = [e for e in exc.errors if not FIELD_PATH.match(e)]
        assert not bad, bad
    else:
        assert isinstance(spec, SweepSpec) and spec.metric.mode in ("min", "max")


def test_unknown_task_lists_every_registered_task() -> None:
    from jobs.registry import task_names

    (error,) = errors_of("name: x\ntask: nope\nmetric: {name: loss}\n")
    assert error == f"task: unknown task 'nope'; known tasks: {', '.join(task_names())}"
    assert "tversky.xor" in task_names() and "memory.neurons" in task_names()
