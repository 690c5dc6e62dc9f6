"""Hostile request bodies through the API on PostgreSQL: each is refused within a time bound with a message
that says what is wrong, and nothing is queued. Then the places where a sweep's name or params could reach
a shell or a file path, checked with real values through the code that builds those paths."""

from __future__ import annotations

import ast
import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from jobs.registry import get_task
from service.settings import Settings
from service.spec import NAME_RE, SweepSpec, parse_spec
from service.spec_loading import MAX_DEPTH

from .conftest import LIMIT, Api

ROOT = Path(__file__).resolve().parents[2]
DEMO_TEXT = (ROOT / "sweeps" / "tversky_xor_demo.yaml").read_text()
DEMO = yaml.safe_load(DEMO_TEXT)
YAML = {"content-type": "application/yaml"}
SECONDS = 2.0
"""Each refusal, measured in the test process; parsing a 64 KiB spec takes milliseconds, not seconds."""


@pytest.fixture
def api(shared_api: Api) -> Api:
    """One database for the module: every test here asserts that it queued nothing."""
    return shared_api


@pytest.fixture(autouse=True, scope="module")
def _tasks_imported() -> None:
    # The first spec of a task imports its module (torch: seconds); the time bound is for the refusal.
    for task in ("tversky.xor", "tversky.image"):
        get_task(task)


def refused(api: Api, body: bytes, ctype: str = "application/yaml", status: int = 422) -> list[str]:
    """POST the body; assert it is refused with `status` in time and nothing is queued; return the errors."""
    before = api.sweep_count()
    started = time.monotonic()
    resp = api.client.post("/sweeps", content=body, headers={"content-type": ctype})
    took = time.monotonic() - started
    assert resp.status_code == status, resp.text[:2000]
    assert took < SECONDS, f"took {took:.2f}s"
    assert api.sweep_count() == before
    detail = resp.json()["detail"]
    errors: list[str] = [detail] if isinstance(detail, str) else detail["errors"]
    assert all("\n" not in e and len(e) < 2000 for e in errors), errors  # one short line each
    return errors


def json_body(**changes: Any) -> bytes:
    return json.dumps({**DEMO, **changes}, allow_nan=True).encode()


# --- oversized bodies ------------------------------------------------------------------------------


def test_a_declared_size_over_the_limit_is_refused_before_reading(api: Api) -> None:
    body = DEMO_TEXT.encode() + b"#" * (2 * LIMIT)
    assert refused(api, body, status=413) == [f"request body is {len(body)} bytes; the limit is {LIMIT} bytes"]


def test_a_streamed_body_stops_being_read_at_the_limit(api: Api) -> None:
    # Chunked, no content-length: 64 MiB offered, the API must stop pulling chunks once past the limit.
    # httpx's ASGI transport hands the app one chunk per receive(), as a server would.
    chunk, offered, pulled = b"#" * 4096, 16 * 1024, 0

    async def endless() -> AsyncIterator[bytes]:
        nonlocal pulled
        for _ in range(offered):
            pulled += 1
            yield chunk

    async def post() -> httpx.Response:
        transport = httpx.ASGITransport(app=api.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            headers = {"Authorization": f"Bearer {api.token}", **YAML}
            return await client.post("/sweeps", content=endless(), headers=headers)

    started = time.monotonic()
    resp = asyncio.run(post())
    assert time.monotonic() - started < SECONDS
    assert resp.status_code == 413
    assert resp.json() == {"detail": f"request body is over the limit of {LIMIT} bytes"}
    assert pulled <= LIMIT // len(chunk) + 2, f"read {pulled} chunks of {offered}"
    assert api.sweep_count() == 0


# --- YAML bombs, bytes, nesting, numbers ----------------------------------------------------------

BILLION_LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8)
)


@pytest.mark.parametrize(
    ("text", "alias"),
    [
        (BILLION_LAUGHS, "a"),  # 9 levels of 9 aliases: 387 million strings if expanded
        ("base: &b {" + ", ".join(f"k{i}: {'x' * 100}" for i in range(300)) + "}\n" + "c: [*b]\n" * 1, "b"),
        (DEMO_TEXT.replace("params:", "params: &p") + "extra: {<<: *p}\n", "p"),  # a merge key is an alias too
    ],
    ids=["billion-laughs", "big-anchor", "merge-key"],
)
def test_yaml_alias_bombs_are_refused(api: Api, text: str, alias: str) -> None:
    assert refused(api, text.encode()) == [
        f"<document>: not valid YAML: YAML aliases (*{alias}) are not allowed in a sweep spec; write values out"
    ]


@pytest.mark.parametrize(
    ("body", "byte"),
    [
        ("name: café\n".encode("latin-1"), 9),  # Latin-1
        (b"name: \xc0\x80\n", 6),  # an overlong NUL
        (b"name: \xed\xa0\x80x\n", 6),  # an encoded surrogate
        (b"name: x\x80\n", 7),  # a lone continuation byte
        ("name: x\n".encode("utf-16"), 0),  # UTF-16 with its byte-order mark
    ],
    ids=["latin-1", "overlong", "surrogate", "continuation", "utf-16"],
)
@pytest.mark.parametrize("ctype", ["application/yaml", "application/json"])
def test_bytes_that_are_not_utf8_are_refused(api: Api, body: bytes, byte: int, ctype: str) -> None:
    assert refused(api, body, ctype) == [f"<document>: not UTF-8 text (byte {byte}); save the file as UTF-8"]


def test_a_nul_or_control_character_in_yaml_names_its_place(api: Api) -> None:
    text = DEMO_TEXT.replace("name: tversky-xor-demo", "name: tversky\x00demo")
    line = 1 + text[: text.index("\x00")].count("\n")
    column = text.index("\x00") - text.rfind("\n", 0, text.index("\x00"))
    assert refused(api, text.encode()) == [
        f"<document>: not valid YAML at line {line}, column {column}: the character U+0000 is not allowed "
        "(special characters are not allowed); remove it or quote it as an escape"
    ]


DEPTH = 10_000
DEEP = {
    "yaml-flow-lists": "params: {lr: " + "[" * DEPTH + "]" * DEPTH + "}\n",
    "yaml-flow-maps": "params: " + "{a: " * DEPTH + "1" + "}" * DEPTH + "\n",
    # Block style indents one more space per level: 600 levels is already 180 KB.
    "yaml-block-maps": "".join(f"{' ' * i}k{i}:\n" for i in range(600)) + " " * 600 + "x: 1\n",
    "json-arrays": '{"params": {"lr": ' + "[" * DEPTH + "]" * DEPTH + "}}",
    "json-objects": '{"params": ' + '{"a": ' * DEPTH + "1" + "}" * DEPTH + "}",
    "json-just-past-the-limit": '{"params": ' + '{"a": ' * MAX_DEPTH + "1" + "}" * MAX_DEPTH + "}",
}


@pytest.mark.parametrize("kind", sorted(DEEP))
def test_deep_nesting_is_refused(api: Api, kind: str) -> None:
    ctype = "application/json" if kind.startswith("json") else "application/yaml"
    fmt = "JSON" if ctype.endswith("json") else "YAML"
    assert refused(api, DEEP[kind].encode(), ctype) == [
        f"<document>: not valid {fmt}: the document nests deeper than {MAX_DEPTH} levels"
    ]


@pytest.mark.parametrize("ctype", ["application/yaml", "application/json"])
def test_nesting_at_the_limit_reaches_field_validation(api: Api, ctype: str) -> None:
    # The top mapping is level 0 and params.lr level 2: MAX_DEPTH - 1 nested lists end at level MAX_DEPTH.
    def body(lists: int) -> bytes:
        lr = json.loads("[" * lists + "]" * lists)
        data = {**DEMO, "params": {**DEMO["params"], "lr": lr}}
        return json.dumps(data).encode() if ctype.endswith("json") else yaml.safe_dump(data).encode()

    assert refused(api, body(MAX_DEPTH - 1), ctype) == ["params.lr: must be a valid number"]
    fmt = "JSON" if ctype.endswith("json") else "YAML"
    assert refused(api, body(MAX_DEPTH), ctype) == [
        f"<document>: not valid {fmt}: the document nests deeper than {MAX_DEPTH} levels"
    ]


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"priority": "NaN"}, "priority: must be a finite number, got nan"),
        ({"time_budget_s": "Infinity"}, "time_budget_s: must be less than or equal to 2592000, got inf"),
        ({"params": {**DEMO["params"], "lr": "NaN"}}, "params.lr: must be a finite number, got nan"),
        ({"params": {**DEMO["params"], "lr": "-Infinity"}}, "params.lr: must be a finite number, got -inf"),
        ({"params": {**DEMO["params"], "lr": "Infinity"}}, "params.lr: must be a finite number, got inf"),
        (
            {"space": {**DEMO["space"], "seed": {"grid": [0, "NaN"]}}},
            "space.seed.grid[1]: must be a finite number, got nan",
        ),
        ({"params": {**DEMO["params"], "lr": 1e400}}, "params.lr: must be a finite number, got inf"),
        ({"params": {**DEMO["params"], "steps": 2**63}}, "params.steps: must be an integer of at most 64 bits"),
        ({"search": {"seed": 2**32}}, "search.seed: must be less than or equal to 4294967295, got 4294967296"),
        ({"priority": 10**4000}, "priority: must be less than or equal to 100, got 1000000000"),
    ],
    ids=["nan-priority", "inf-budget", "nan", "-inf", "inf", "nan-grid", "1e400", "2**63", "seed-2**32", "10**4000"],
)
def test_non_finite_and_huge_numbers_name_their_field(api: Api, changes: dict[str, Any], error: str) -> None:
    # NaN/Infinity as JSON writes them (Python's json reads them); 1e400 overflows to inf when parsed.
    body = json.dumps({**DEMO, **changes}).replace('"NaN"', "NaN").replace('"-Infinity"', "-Infinity")
    body = body.replace('"Infinity"', "Infinity")
    errors = refused(api, body.encode(), "application/json")
    assert len(errors) == 1 and errors[0].startswith(error), errors
    assert len(errors[0]) < 500  # a 4000-digit number is shown cut short


def test_more_digits_than_python_parses_are_refused(api: Api) -> None:
    for ctype, body in [
        ("application/json", json_body()[:-1] + b', "x": ' + b"9" * 5000 + b"}"),
        ("application/yaml", DEMO_TEXT.encode() + b"x: " + b"9" * 5000 + b"\n"),
    ]:
        fmt = "JSON" if ctype.endswith("json") else "YAML"
        assert refused(api, body, ctype) == [
            f"<document>: not valid {fmt}: a number has more than 4300 digits; no task parameter needs that many"
        ]


# --- names and strings ------------------------------------------------------------------------------

NAME_ERROR = "may hold only letters, digits, '_', '.', '-' (starting with a letter or digit), at most 100 chars"


def shown(value: str) -> str:
    """How an error message shows a value: its repr, cut to 200 characters with the full length after."""
    text = repr(value)
    return text if len(text) <= 200 else f"{text[:200]}... ({len(text)} chars)"


HOSTILE_NAMES = [
    "a/../../b",
    "..",
    "a\\b",
    "/etc/passwd",
    "$(touch x)",
    "`touch x`",
    "x;touch y",
    "x|y",
    "x&y",
    "x>y",
    "-rf",
    "x\x00y",
    "x\ny",
    "x\r",
    "x\t",
    "x ",
    "\u202ex",
    "x" * 101,
    "x" * 60_000,
]


@pytest.mark.parametrize("field", ["name", "register.model"])
@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=[repr(n)[:20] for n in HOSTILE_NAMES])
def test_hostile_names_are_refused_naming_the_field(api: Api, field: str, name: str) -> None:
    data = json.loads(json_body())
    if field == "name":
        data["name"] = name
    else:
        data["register"]["model"] = name
    errors = refused(api, json.dumps(data).encode(), "application/json")
    assert errors == [f"{field}: {NAME_ERROR}, got {shown(name)}"]


@pytest.mark.parametrize("value", ["x\x00y", "x\ny", "\ud800", "a\x1bb"], ids=["nul", "newline", "surrogate", "escape"])
def test_control_characters_in_a_string_param_are_refused(api: Api, value: str) -> None:
    spec = {"name": "img", "task": "tversky.image", "metric": {"name": "test/accuracy"}, "params": {"data_dir": value}}
    (error,) = refused(api, json.dumps(spec).encode(), "application/json")
    assert error.startswith("params.data_dir: must not hold control characters or unpaired surrogates (U+"), error


def test_a_hostile_key_cannot_forge_a_second_error_line(api: Api) -> None:
    body = json_body()[:-1] + b', "x\\nname: is required": 1}'
    assert refused(api, body, "application/json") == [
        '["x\\nname: is required"]: unknown key; allowed keys: claims, code, max_attempts, max_concurrent_trials, '
        "max_failures, metric, name, params, priority, register, resources, scheduler, search, space, stop, task, "
        "time_budget_s"
    ]


# --- where a sweep's name or params could become a path or a command -----------------------------
#
# Read from service/, workers/ and jobs/ (every Path(...), open, mkdir, storage_path, experiment and
# run name, subprocess):
#   sweep name         -> MLflow experiment name and its artifact folder <home>/mlartifacts/<name>
#                         (workers/tracking.py); NAME_RE keeps it one path component
#   register.model     -> MLflow registered model name (workers/registration.py): a database key
#   register.alias     -> MLflow alias: a database key
#   sweep id (integer) -> Tune experiment folder <tune storage>/sweep-<id> (workers/worker.py)
#   trial id (Tune's)  -> Ray Train run folder train-<trial id> (workers/trainable.py)
#   searched values    -> Tune trial folder names (Tune strips them to [A-Za-z0-9_-]) and MLflow params
#   fixed params       -> MLflow params (database values) and the task's config
#   task file names    -> artifact files, cut to their last component (workers/tracking._log_files)
# Task params that are paths on purpose (typed jobs.data.paths.DataPath): tversky.image data_dir (MNIST
# is read, or downloaded, there), tversky.lm / memory.neurons data_files (PTB text files are read there),
# symbolic.* cache_dir (generated data sets are written there). They must lie in LAYERLAB_DATA_ROOTS,
# checked at submit and again by the worker (tests/service/test_data_paths.py).
SHELL_CALLS = {"system", "popen", "create_subprocess_shell", "getoutput", "getstatusoutput"}
"""Calls that hand a command line to /bin/sh (os.exec*/spawn* and subprocess without shell=True take argv)."""
SUBPROCESS = {"run", "Popen", "call", "check_call", "check_output"}


def test_no_code_runs_a_shell() -> None:
    files = sorted(f for d in ("service", "workers", "jobs") for f in (ROOT / d).rglob("*.py"))
    assert len(files) > 50
    offenders = []
    for file in files:
        for node in ast.walk(ast.parse(file.read_text())):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            where, name = f"{file.relative_to(ROOT)}:{node.lineno}", node.func.attr
            if name in SHELL_CALLS:
                offenders.append(f"{where}: {name}")
            owner = node.func.value
            if name in SUBPROCESS and isinstance(owner, ast.Name) and owner.id == "subprocess":
                if any(k.arg == "shell" for k in node.keywords):
                    offenders.append(f"{where}: subprocess.{name}(shell=...)")
                if node.args and isinstance(node.args[0], ast.Constant | ast.JoinedStr | ast.BinOp):
                    offenders.append(f"{where}: subprocess.{name} with a command string")
    assert offenders == []


def test_every_name_the_schema_accepts_is_one_path_component(tmp_path: Path) -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    accepted = []

    @settings(max_examples=300, deadline=None, database=None)
    @given(name=st.from_regex(NAME_RE, fullmatch=True) | st.text(st.characters(codec="ascii"), max_size=12))
    def check(name: str) -> None:
        try:
            parse_spec({**DEMO, "name": name, "register": {"model": name}})
        except Exception:
            return
        accepted.append(name)
        assert "/" not in name and "\\" not in name and name not in (".", "..") and not name.startswith(("-", "."))
        assert (tmp_path / name).resolve().parent == tmp_path.resolve()

    check()
    assert len(accepted) > 50


def test_names_and_files_stay_under_the_artifact_root(tmp_path: Path) -> None:
    # The real MLflow bridge on a SQLite tracking store: the edge of what NAME_RE allows.
    from service.queue import QueueStore
    from workers.tracking import SweepTracker

    settings = Settings(home=tmp_path, database_url=None, mlflow_tracking_uri=None)
    store = QueueStore(settings.queue_url)
    root = settings.artifact_root.resolve()
    for name in ["a..b", "A.", "9-_.", "x" * 100]:
        spec = parse_spec({**DEMO, "name": name, "register": {"model": name}})
        store.submit(spec)
        claim = store.claim("w", 60)
        assert claim is not None
        tracker = SweepTracker(settings, store, claim, spec)
        location = Path(tracker.client.get_experiment(tracker.experiment_id).artifact_location.removeprefix("file://"))
        assert location == root / name, location
        store.trial_started(claim.sweep_id, "t1", {"data_dir": "$(touch pwned) ../../x", "seed": 1})
        files = {"../../escape.txt": b"x", "/abs/olute.txt": b"y", "ok.txt": b"z", "..": b"u", ".": b"v", "": b"w"}
        encoded = {k: base64.b64encode(v).decode() for k, v in files.items()}
        store.trial_result(claim.sweep_id, "t1", 1, {}, files=encoded)
        assert tracker.shipper.drain(wait_seconds=0)
        run = store.trial(claim.sweep_id, "t1").mlflow_run_id
        assert sorted(a.path for a in tracker.client.list_artifacts(run)) == ["escape.txt", "ok.txt", "olute.txt"]
        assert (location / run / "artifacts" / "ok.txt").read_bytes() == b"z"
        assert tracker.client.get_run(run).data.params["data_dir"] == "$(touch pwned) ../../x"  # a value, not a path
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert all(p.resolve().is_relative_to(tmp_path.resolve()) for p in written)
    assert not list(tmp_path.rglob("pwned")) and not (tmp_path.parent / "escape.txt").exists()
    assert sum(p.name == "escape.txt" for p in written) == 4


def test_searched_values_cannot_climb_out_of_the_tune_folder(tmp_path: Path) -> None:
    # Tune's own trial creation (no cluster needed): the folder names it would make for hostile values.
    from ray.tune.search import BasicVariantGenerator

    from workers.sweep import make_trainable, param_space

    hostile = ["../../etc/passwd", "$(touch pwned)", "a/b;rm -rf ~", "`id`", "~/x", "..", "/", "x" * 500]
    # SweepSpec alone: parse_spec refuses these as data paths; Tune must still make safe folders of them.
    spec = SweepSpec.model_validate(
        {
            "name": "hostile",
            "task": "tversky.image",
            "metric": {"name": "test/accuracy", "mode": "max"},
            "space": {"data_dir": {"grid": hostile}},
        }
    )
    experiment = tmp_path / "sweep-1"
    generator = BasicVariantGenerator()
    generator.add_configurations(
        {"sweep-1": {"run": make_trainable(spec, str(tmp_path), {}), "config": param_space(spec), "num_samples": 1}}
    )
    seen = []
    while (trial := generator.next_trial()) is not None:
        seen.append(trial.config["data_dir"])
        folder = trial._generate_dirname()
        assert "/" not in folder and "\x00" not in folder and not folder.startswith("."), folder
        assert (experiment / folder).resolve().parent == experiment.resolve()
        assert len(folder) < 255  # one file name
    assert seen == hostile
