"""A hypothesis fuzzer over sweep YAML, through the API on PostgreSQL.

Each example starts from one of the valid specs in sweeps/ and applies random mutations: drop, rename or
retype a field, out-of-range and non-finite numbers, wrong nesting, random unicode, truncation, duplicated
keys, YAML tags, sent as YAML or JSON. Whatever comes out:

- the answer is 201 or a 4xx, never a 5xx, and the app keeps answering;
- a rejection queues nothing (sweeps counted in SQL before and after), and every error in a 422 names a
  field (NAMES_A_FIELD below says exactly what that means);
- an accepted spec is queued exactly once, and every trial config it can produce builds the task's config
  the way the worker will (`Task.make_config`), so it cannot fail for a reason validation should have caught.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.registry import get_task, task_names
from service.spec import SweepSpec

from .conftest import Api

ROOT = Path(__file__).resolve().parents[2]
SPEC_FILES = sorted(ROOT.glob("sweeps/**/*.yaml"))
SPECS = {p.relative_to(ROOT).as_posix(): p.read_text() for p in SPEC_FILES}
EXAMPLES = 150

# --- what "names a field" means --------------------------------------------------------------------
#
# An error names a field when it is one line `<path>: <message>` and either
#   1. <path> is `<document>` and the message says why the body as a whole is unreadable (not UTF-8,
#      not YAML/JSON by the service's rules, or not a mapping); such an error is then the only one; or
#   2. <path> is a field path that resolves in the submitted document: each segment `.name`, `[index]`
#      or `[<JSON scalar>]` (a key that is not a plain identifier) matches a key or list index, walking
#      down from the top mapping. pydantic writes some non-string keys by their str() (`[1]` for the key
#      true, `None` for the key null), so a segment matches a key k when seg == k or seg == str(k). The
#      walk may leave the document only at a name the schema knows (a missing required field, or a
#      default broken by a cross-field rule, e.g. `params.report_every` when only steps was given), and
#      may end at `.[key]`, pydantic's mark for "the key itself is wrong".
DOCUMENT_REASONS = (
    "not UTF-8 text",
    "not valid YAML",
    "not valid JSON",
    "a sweep spec is a mapping of keys",
    "a sweep spec is a JSON object",
)
SEGMENT = re.compile(
    r"""\.(?P<name>\[key\]|[A-Za-z_0-9]\w*)"""  # .name, .1 (an integer key), .[key]
    r"""|\[(?P<bracket>-?\d+|"(?:[^"\\]|\\.)*"|true|false|null|-?\d[\d.e+-]*|-?Infinity|NaN)\]"""
)


def _schema_names() -> set[str]:
    names: set[str] = {"grid", "choice", "uniform", "loguniform", "randint"}
    stack: list[Any] = [SweepSpec]
    while stack:
        model = stack.pop()
        for name, field in model.model_fields.items():
            names.add(name)
            for arg in (field.annotation, *getattr(field.annotation, "__args__", ())):
                if isinstance(arg, type) and hasattr(arg, "model_fields"):
                    stack.append(arg)
    for task in task_names():
        names |= set(get_task(task).defaults())
    return names


SCHEMA_NAMES = _schema_names()


def parse_path(path: str) -> list[Any] | None:
    """`space.lr.grid[0]` -> ["space", "lr", "grid", 0]; None if the text is not a field path."""
    text, parts = "." + path if not path.startswith("[") else path, []
    while text:
        m = SEGMENT.match(text)
        if m is None:
            return None
        if m["name"] is not None:
            parts.append(int(m["name"]) if m["name"].isdigit() else m["name"])
        else:
            parts.append(json.loads(m["bracket"]))
        text = text[m.end() :]
    return parts


def _matches(key: Any, segment: Any) -> bool:
    return bool(key == segment) or str(key) == str(segment)


def resolves(document: Any, parts: list[Any]) -> bool:
    node = document
    for i, segment in enumerate(parts):
        if segment == "[key]":
            return i == len(parts) - 1
        if isinstance(node, dict):
            keys = [k for k in node if _matches(k, segment)]
            if not keys:
                return isinstance(segment, str) and segment in SCHEMA_NAMES
            node = node[keys[0]]
        elif isinstance(node, list) and type(segment) is int and 0 <= segment < len(node):
            node = node[segment]
        else:
            return False
    return True


def names_a_field(error: str, document: Any) -> bool:
    if "\n" in error or ": " not in error:
        return False
    if error.startswith("<document>: "):
        return error.removeprefix("<document>: ").startswith(DOCUMENT_REASONS)
    # The path ends at the first ": " that is not inside a quoted key.
    m = re.match(r"""^((?:[^":\[]|\[(?:"(?:[^"\\]|\\.)*"|[^\]"]*)\])+): \S""", error)
    if m is None:
        return False
    parts = parse_path(m.group(1))
    return parts is not None and bool(parts) and resolves(document, parts)


def test_names_a_field_is_strict_enough() -> None:
    doc = {"name": "x", "params": {"lr": 0.1, "a b": 1, True: 2}, "space": {"seed": {"grid": [0, 1]}}}
    good = [
        "name: may hold only letters",
        "params.lr: must be greater than 0, got -1",
        'params["a b"]: unknown parameter for task tversky.xor',
        "params[1].[key]: must be a valid string, got True",
        "space.seed.grid[1]: must be a positive integer",
        "metric: is required",
        "params.report_every: must be <= steps (10), got 100",
        "<document>: not valid YAML at line 3, column 1: found unhashable key",
    ]
    bad = [
        "name is wrong",
        "params.zzz.x: unknown parameter",  # a name the schema does not know, under a missing key
        "space.seed.grid[7]: out of range index",
        "bogus: unknown key",
        'params["a b"]: two\nlines',
        "<document>: something else",
        "params.a b: unknown parameter",
        ": empty path",
    ]
    assert [e for e in good if not names_a_field(e, doc)] == []
    assert [e for e in bad if names_a_field(e, doc)] == []


# --- mutations -------------------------------------------------------------------------------------

DROP = object()
TAGS = ["!!binary", "!!set", "!!omap", "!!timestamp", "!!python/object:os.system", "!custom", "!!str", "!!float"]
WEIRD_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30) | st.sampled_from(
    ["", " ", "a/../../b", "$(touch x)", "`id`", "x\x00y", "line\nbreak", "é" * 120, "\u202e", "\ufeffname"]
)
NUMBERS = st.sampled_from(
    [0, -1, 1, 101, 2**31, 2**63, -(2**63) - 1, 10**100, 1e308, -1e-308, 0.5, math.nan, math.inf, -math.inf]
) | st.integers(-(10**6), 10**6)
ANY_VALUE = st.recursive(
    st.none() | st.booleans() | NUMBERS | WEIRD_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(WEIRD_TEXT, inner, max_size=3),
    max_leaves=6,
)


def paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = []
    if isinstance(node, dict):
        for key, child in node.items():
            out += [(*prefix, key), *paths(child, (*prefix, key))]
    elif isinstance(node, list):
        for i, child in enumerate(node):
            out += [(*prefix, i), *paths(child, (*prefix, i))]
    return out


def apply(data: Any, path: tuple[Any, ...], op: str, value: Any) -> None:
    parent = data
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if op == "drop":
        del parent[last]
    elif op == "rename" and isinstance(parent, dict):
        parent[value] = parent.pop(last)
    elif op == "nest":  # wrong nesting: one level too deep, or a mapping where a list was
        parent[last] = [parent[last]] if value else {"value": parent[last]}
    elif op == "hoist" and isinstance(parent[last], dict | list) and parent[last]:
        inner = parent[last]
        parent[last] = next(iter(inner.values())) if isinstance(inner, dict) else inner[0]
    else:  # retype / out-of-range / unicode: a new value in place
        parent[last] = value


@st.composite
def mutated_body(draw: st.DrawFn) -> tuple[str, bytes, str]:
    """(content type, body, what was done), from one of the valid specs."""
    source = draw(st.sampled_from(sorted(SPECS)))
    data = yaml.safe_load(SPECS[source])
    done = [source]
    # A quarter of the examples change only what keeps a spec valid (a fresh name, priority or seed) and stay
    # readable text, so accepted specs are a large share of every run, not a few lucky draws.
    if draw(st.sampled_from(["benign", "mutate", "mutate", "mutate"])) == "benign":
        for _ in range(draw(st.integers(1, 2))):
            path = draw(st.sampled_from([("name",), ("priority",), ("search", "seed")]))
            if path[0] == "search" and not isinstance(data.get("search"), dict):
                continue
            value = draw(
                st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True) if path == ("name",) else st.integers(0, 100)
            )
            apply(data, path, "retype", value)
            done.append(f"benign {path!r} {value!r}")
        as_json = draw(st.booleans())
        body = json.dumps(data).encode() if as_json else yaml.safe_dump(data, sort_keys=False).encode()
        return ("application/json" if as_json else "application/yaml"), body, " | ".join(done)
    for _ in range(draw(st.integers(1, 3))):
        candidates = paths(data)
        if not candidates:
            break
        path = draw(st.sampled_from(candidates))
        op = draw(st.sampled_from(["drop", "rename", "retype", "number", "unicode", "nest", "hoist"]))
        value: Any = None
        if op == "rename":
            value = draw(WEIRD_TEXT | st.sampled_from(["nmae", "Name", "params ", "space.lr", "1"]))
        elif op == "retype":
            value = draw(ANY_VALUE)
        elif op == "number":
            value = draw(NUMBERS)
        elif op == "unicode":
            value = draw(WEIRD_TEXT)
        elif op == "nest":
            value = draw(st.booleans())
        apply(data, path, op, value)
        done.append(f"{op} {path!r} {value!r}"[:200])
    as_json = draw(st.booleans())
    if as_json:
        body = json.dumps(data, allow_nan=True).encode()
    else:
        try:
            body = yaml.safe_dump(data, allow_unicode=True, sort_keys=False).encode("utf-8", "surrogatepass")
        except yaml.YAMLError:
            body = json.dumps(data).encode()  # JSON is YAML
    text_op = draw(st.sampled_from(["none", "none", "truncate", "duplicate", "tag", "bytes"]))
    if text_op == "truncate":
        body = body[: draw(st.integers(0, max(0, len(body) - 1)))]
    elif text_op == "duplicate" and not as_json:
        line = draw(st.sampled_from(body.splitlines() or [b"name: x"]))
        body += b"\n" + line.lstrip() + b"\n"
    elif text_op == "tag" and not as_json:
        lines = body.splitlines()
        i = draw(st.integers(0, max(0, len(lines) - 1)))
        if lines and b": " in lines[i]:
            key, rest = lines[i].split(b": ", 1)
            lines[i] = key + b": " + draw(st.sampled_from(TAGS)).encode() + b" " + rest
        body = b"\n".join(lines) + b"\n"
    elif text_op == "bytes":
        at = draw(st.integers(0, len(body)))
        body = body[:at] + draw(st.binary(min_size=1, max_size=4)) + body[at:]
    done.append(text_op)
    return ("application/json" if as_json else "application/yaml"), body, " | ".join(done)


def _document(ctype: str, body: bytes) -> Any:
    """The submitted document as a plain parser reads it (for resolving error paths), or None."""
    try:
        if ctype == "application/json":
            return json.loads(body)
        return yaml.safe_load(body.decode("utf-8"))
    except Exception:  # unreadable: only `<document>` errors can be right
        return None


def _trial_values(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Every config the worker will build from the fixed params plus one searched value (bounds for ranges)."""
    fixed, out = dict(spec["params"]), []
    for key, domain in spec["space"].items():
        kind, values = next((k, v) for k, v in domain.items() if v is not None)
        if kind == "randint":
            values = [values[0], values[1] - 1]
        out += [{**fixed, key: v} for v in values]
    return out or [fixed]


def test_every_example_spec_is_valid(api: Api) -> None:
    # The fuzzer's starting points: each is queued once as it is.
    for n, (source, text) in enumerate(sorted(SPECS.items()), 1):
        resp = api.client.post("/sweeps", content=text.encode(), headers={"content-type": "application/yaml"})
        assert resp.status_code == 201, (source, resp.text)
        assert api.sweep_count() == n
    assert len(SPECS) >= 10


def test_mutated_specs_are_queued_once_or_rejected_naming_a_field(api: Api) -> None:
    outcomes: Counter[int] = Counter()

    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(mutation=mutated_body())
    def submit(mutation: tuple[str, bytes, str]) -> None:
        ctype, body, done = mutation
        before = api.sweep_count()
        resp = api.client.post("/sweeps", content=body, headers={"content-type": ctype})
        after = api.sweep_count()
        outcomes[resp.status_code] += 1
        assert resp.status_code in (201, 422), (done, resp.status_code, resp.text)
        if resp.status_code != 201:
            assert after == before, (done, "an invalid spec was queued")
            errors = resp.json()["detail"]["errors"]
            assert errors, done
            unnamed = [e for e in errors if not names_a_field(e, _document(ctype, body))]
            assert not unnamed, (done, unnamed, errors)
            if any(e.startswith("<document>") for e in errors):
                assert len(errors) == 1, (done, errors)
            return
        assert after == before + 1, (done, "queued more or less than once")
        sweep = api.store.get(resp.json()["id"])
        task = get_task(sweep.task)
        for values in _trial_values(sweep.spec):
            task.make_config(values)  # raises as the worker would: validation let a bad value through

    submit()
    assert api.client.get("/healthz").status_code == 200
    # Both outcomes happened: the fuzzer explored valid mutations as well as invalid ones. About a third of the
    # examples are accepted (45-57 of 150 over five seeds), so these floors sit 6 standard deviations below.
    assert outcomes[201] >= EXAMPLES // 10 and outcomes[422] >= EXAMPLES // 3, outcomes


def test_a_duplicated_key_names_its_line(api: Api) -> None:
    text = SPECS["sweeps/tversky_xor_demo.yaml"] + "name: second-name\n"
    resp = api.client.post("/sweeps", content=text.encode(), headers={"content-type": "application/yaml"})
    assert resp.status_code == 422
    line = text.count("\n")
    first = next(i for i, ln in enumerate(text.splitlines(), 1) if ln.startswith("name:"))
    assert resp.json()["detail"]["errors"] == [
        f"<document>: not valid YAML at line {line}, column 1: the key 'name' appears twice in one mapping "
        f"(first at line {first}); keep one"
    ]
    body = b'{"name": "a", "name": "b"}'
    resp = api.client.post("/sweeps", content=body, headers={"content-type": "application/json"})
    assert resp.json()["detail"]["errors"] == [
        "<document>: not valid JSON: the key 'name' appears twice in one object; keep one"
    ]
    assert api.sweep_count() == 0


def test_strings_that_would_fail_every_trial_are_rejected(api: Api) -> None:
    # Found by the fuzzer: validation coerced "16" and 16.0 to an int and queued the sweep, but the
    # worker builds the config without coercion, so every trial failed.
    spec = yaml.safe_load(SPECS["sweeps/tversky_xor_demo.yaml"])
    spec["params"] |= {"features": "16", "lr": "0.1", "steps": 1000.0}
    spec["space"]["seed"] = {"grid": [0, True]}
    resp = api.client.post("/sweeps", json=spec)
    assert resp.status_code == 422
    assert sorted(resp.json()["detail"]["errors"]) == [
        "params.features: must be a valid integer, got '16'",
        "params.lr: must be a valid number, got '0.1'",
        "params.steps: must be a valid integer, got 1000.0",
        "space.seed.grid[1]: must be a valid integer, got True",
    ]
    for field, value in [("features", "16"), ("lr", "0.1"), ("steps", 1000.0), ("seed", True)]:
        with pytest.raises(ValueError, match=f"^{field}: must be"):
            get_task("tversky.xor").make_config({field: value})  # the worker's check, the oracle here
    assert api.sweep_count() == 0


def test_a_tuple_field_takes_a_list_as_the_worker_does(api: Api) -> None:
    spec = yaml.safe_load(SPECS["sweeps/memory_hopfield.yaml"])
    spec["params"]["corruptions"] = [0.1, "0.2"]
    resp = api.client.post("/sweeps", json=spec)
    assert resp.json()["detail"]["errors"] == ["params.corruptions[1]: must be a valid number, got '0.2'"]
    spec["params"]["corruptions"] = [0.1, 0.2]
    assert api.client.post("/sweeps", json=spec).status_code == 201
    assert get_task("memory.hopfield").make_config({"corruptions": [0.1, 0.2]}).corruptions == (0.1, 0.2)
