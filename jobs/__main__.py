"""Run a task alone, without the service: `python -m jobs list`, `python -m jobs run TASK --set name=value`.

`--set` values are YAML scalars (`4`, `0.1`, `true`, `null`, `min`) and are validated exactly as the service
validates sweep params: `pydantic.TypeAdapter(task.config)`. A bad value prints one line per problem naming
the field and the fix, and exits 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import types
import typing
from typing import Any

import yaml

from jobs.config import field_docs
from jobs.registry import UnknownTaskError, get_task, task_names

_BOUND_SYMBOLS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}


def _type_name(hint: Any) -> str:
    """`Annotated[int, Gt(0)]` -> 'int > 0'; `Literal['a', 'b']` -> 'a | b'."""
    if typing.get_origin(hint) is typing.Annotated:
        base, *meta = typing.get_args(hint)
        bounds = [f"{sym} {getattr(m, k)}" for m in meta for k, sym in _BOUND_SYMBOLS.items() if hasattr(m, k)]
        return " ".join([_type_name(base), *bounds])
    if typing.get_origin(hint) is typing.Literal:
        return " | ".join(map(str, typing.get_args(hint)))
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(hint))
    if hint is type(None):
        return "null"  # how YAML spells None
    return getattr(hint, "__name__", str(hint))


def cmd_list() -> int:
    for name in task_names():
        task = get_task(name)
        print(f"{name}: {task.description}")
        print(f"  metrics: {', '.join(f'{k} ({v})' for k, v in task.metrics.items())}")
        hints = typing.get_type_hints(task.config, include_extras=True)
        docs = field_docs(task.config)
        for f in dataclasses.fields(task.config):
            print(f"  --set {f.name}={f.default!r}  [{_type_name(hints[f.name])}]")
            if f.name in docs:
                print(f"      {docs[f.name]}")
    return 0


def parse_sets(pairs: list[str]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        if not sep or not name:
            raise ValueError(f"--set {pair!r}: expected NAME=VALUE, e.g. --set features=4")
        try:
            params[name.strip()] = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            params[name.strip()] = raw  # not a scalar YAML understands: let validation judge it as text
    return params


def build_config(task_name: str, params: dict[str, Any]) -> Any:
    """Validate `params` for the task; raise ValueError with one 'field: problem; fix' line per error."""
    from pydantic import TypeAdapter, ValidationError  # the CLI is an edge; the train loop never needs pydantic

    task = get_task(task_name)
    known = [f.name for f in dataclasses.fields(task.config)]
    hints = typing.get_type_hints(task.config, include_extras=True)
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise ValueError(f"{', '.join(unknown)}: unknown parameter(s) for {task_name}; known: {', '.join(known)}")
    try:
        return TypeAdapter(task.config).validate_python(params)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            field = ".".join(map(str, err["loc"]))
            msg = err["msg"].removeprefix("Value error, ")
            if field in hints:  # a per-field error: say the value and what a valid one looks like
                fix = f"--set {field}=<{_type_name(hints[field])}>"
                lines.append(f"{field}: {msg}, got {err['input']!r}; fix: {fix}")
            else:  # a cross-field rule from __post_init__: its message already starts with the field name
                lines.append(msg)
        raise ValueError("\n".join(lines)) from None


def cmd_run(task_name: str, sets: list[str]) -> int:
    from jobs.runtime import LocalSession

    try:
        cfg = build_config(task_name, parse_sets(sets))
    except (ValueError, UnknownTaskError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        print("(`python -m jobs list` shows every task's parameters)", file=sys.stderr)
        return 2
    print(f"{task_name}: {cfg}", flush=True)
    get_task(task_name).train(cfg, LocalSession())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list tasks with their parameters and defaults")
    run = sub.add_parser("run", help="run one task in this process")
    run.add_argument("task", help=f"one of: {', '.join(task_names())}")
    run.add_argument("--set", dest="sets", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args(argv)
    if args.command == "list":
        return cmd_list()
    return cmd_run(args.task, args.sets)


if __name__ == "__main__":
    sys.exit(main())
