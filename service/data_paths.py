"""Where task params may point: a config field typed `jobs.data.paths.DataPath` names a file or folder on
the worker (a data set it reads, a cache it writes). Its value must lie in a folder the operator allows,
`LAYERLAB_DATA_ROOTS` (folders separated by ':'; by default ~/.cache/layerlab), after `~` and symbolic
links are resolved. `parse_spec` checks this when a sweep is submitted; the worker checks again before it
runs one (its machine and its roots may differ from the API's)."""

from __future__ import annotations

import os
import typing
from collections.abc import Mapping
from typing import Any

from jobs.data.paths import DATA_PATH


def data_path_fields(config: type) -> list[str]:
    """The fields of a task's config dataclass typed DataPath (or DataPath | None)."""
    hints = typing.get_type_hints(config, include_extras=True)
    return sorted(name for name, hint in hints.items() if _marked(hint))


def _marked(hint: Any) -> bool:
    if typing.get_origin(hint) is typing.Annotated:
        base, *metadata = typing.get_args(hint)
        return any(m is DATA_PATH for m in metadata) or _marked(base)
    return any(_marked(arg) for arg in typing.get_args(hint))


def data_path_errors(config: type, params: Mapping[str, Any], space: Mapping[str, Any], roots: str) -> list[str]:
    """One message per fixed param or searched value (grid/choice) of a DataPath field that lies outside
    `roots`; each names its field, the folders allowed and how to fix it."""
    allowed = [os.path.realpath(os.path.expanduser(r.strip())) for r in roots.split(os.pathsep) if r.strip()]
    errors = []
    for key in data_path_fields(config):
        values = [(f"params.{key}", params[key])] if key in params else []
        domain = space.get(key)
        for kind in ("grid", "choice"):
            listed = getattr(domain, kind, None)  # a service.spec.Domain, or None
            values += [(f"space.{key}.{kind}[{i}]", v) for i, v in enumerate(listed or ())]
        for where, value in values:
            if isinstance(value, str) and (problem := _outside(value, allowed, roots)):
                errors.append(f"{where}: {problem}, got {value!r}")
    return errors


def _outside(value: str, allowed: list[str], roots: str) -> str | None:
    if not value.startswith(("/", "~")):
        return "must be an absolute path or start with ~ (it is opened on the worker, not where you are)"
    path = os.path.realpath(os.path.expanduser(value))
    if any(path == root or path.startswith(root.rstrip(os.sep) + os.sep) for root in allowed):
        return None
    return (
        f"must lie in a folder the service keeps task data in (LAYERLAB_DATA_ROOTS={roots}); put the data "
        "there, or ask the operator to add its folder"
    )
