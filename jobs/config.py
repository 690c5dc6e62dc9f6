"""Helpers for science configs (frozen dataclasses whose fields carry `Annotated` constraints).

pydantic enforces the constraints at the edge (`TypeAdapter(XConfig)`); `check_fields` enforces the same
ones when a config is built directly (`XConfig(**params)`, as `Task.make_config` does), so a bad value never
reaches a train loop. Only the stdlib and `annotated_types` are used: jobs/ must not depend on pydantic.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import types
import typing
from typing import Any

import annotated_types as at

_BOUNDS = ((at.Gt, "gt", ">"), (at.Ge, "ge", ">="), (at.Lt, "lt", "<"), (at.Le, "le", "<="))
_OPS = {">": lambda a, b: a > b, ">=": lambda a, b: a >= b, "<": lambda a, b: a < b, "<=": lambda a, b: a <= b}


def _check_value(name: str, value: Any, hint: Any) -> None:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return
        (hint,) = [o for o in options if o is not type(None)]  # only `X | None` is supported
    meta: tuple[Any, ...] = ()
    if typing.get_origin(hint) is typing.Annotated:
        hint, *rest = typing.get_args(hint)
        meta = tuple(rest)
    if typing.get_origin(hint) is typing.Literal:
        allowed = typing.get_args(hint)
        if value not in allowed:
            raise ValueError(f"{name}: must be one of {', '.join(map(repr, allowed))}, got {value!r}")
        return
    numeric = (int, float) if hint is float else (hint,)
    if isinstance(hint, type) and (not isinstance(value, numeric) or (hint is not bool and isinstance(value, bool))):
        raise ValueError(f"{name}: must be {hint.__name__}, got {value!r}")
    for m in meta:
        for cls, attr, op in _BOUNDS:
            if isinstance(m, cls) and not _OPS[op](value, getattr(m, attr)):
                raise ValueError(f"{name}: must be {op} {getattr(m, attr)}, got {value!r}")


def check_fields(cfg: Any) -> None:
    """Raise ValueError('<field>: must be ..., got ...') for the first field that breaks its annotation."""
    hints = typing.get_type_hints(type(cfg), include_extras=True)
    for f in dataclasses.fields(cfg):
        _check_value(f.name, getattr(cfg, f.name), hints[f.name])


def field_docs(cls: type) -> dict[str, str]:
    """Field name -> the docstring written under it (CleanRL/tyro convention), read from the source."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):  # no source (frozen app, REPL)
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for node, nxt in zip(body, body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(nxt.value.value)
    return docs


def check_lm_schedule(cfg: Any, steps: str = "max_steps") -> None:
    """The cross-field rules every GPT-style LM config shares: heads divide the width, warmup ends before
    the last step (`steps` names the config's step-count field) and, where the config evaluates during
    training, the first evaluation comes no later than the last step."""
    if cfg.n_embd % cfg.n_head != 0:
        raise ValueError(
            f"n_embd: must be divisible by n_head ({cfg.n_head}), got {cfg.n_embd}; change n_embd or n_head"
        )
    total = getattr(cfg, steps)
    if hasattr(cfg, "eval_every") and cfg.eval_every > total:
        raise ValueError(f"eval_every: must be <= {steps} ({total}), got {cfg.eval_every}; lower it or raise {steps}")
    if cfg.warmup_steps >= total:
        raise ValueError(f"warmup_steps: must be < {steps} ({total}), got {cfg.warmup_steps}")
