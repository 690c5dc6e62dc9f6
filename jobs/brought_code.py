"""A researcher's own code as a sweep brings it: import its Task from a folder, and say where it failed.

The worker unpacks the sweep's code and hands the folder to Ray's runtime_env (working_dir), which puts it on
sys.path of every trial process on every node; the driver imports the same folder with `imported_from` to
validate params, summarize and register. Errors point at the researcher's file and line, not at ours.
"""

from __future__ import annotations

import importlib
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from jobs.registry import Task, get_task


class BroughtCodeError(RuntimeError):
    """The researcher's code failed (to import, or in `train`); the message names their file and line."""


@contextmanager
def imported_from(root: Path) -> Iterator[None]:
    """`root` first on sys.path; on leaving, it and every module imported from it are gone, so the next sweep
    in this process imports its own code even where a module has the same name."""
    root = root.resolve()
    sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    try:
        yield
    finally:
        while str(root) in sys.path:
            sys.path.remove(str(root))
        for name, module in list(sys.modules.items()):
            file = getattr(module, "__file__", None)
            if file and Path(file).resolve().is_relative_to(root):
                del sys.modules[name]


def where(exc: BaseException, root: Path) -> str:
    """`file:line` (relative to `root`) of the deepest place in the researcher's code that `exc` passed, or ''."""
    root = root.resolve()
    if isinstance(exc, SyntaxError) and exc.filename and Path(exc.filename).resolve().is_relative_to(root):
        return f"{Path(exc.filename).resolve().relative_to(root)}:{exc.lineno}"
    found = ""
    for frame in traceback.extract_tb(exc.__traceback__):
        path = Path(frame.filename)
        if path.is_absolute() and path.resolve().is_relative_to(root):
            found = f"{path.resolve().relative_to(root)}:{frame.lineno}"
    return found


def describe(exc: BaseException, root: Path, doing: str) -> str:
    """One line: what failed, where in the researcher's code, and the error."""
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    at = where(exc, root)
    text = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return f"your code failed {doing}{f' at {at}' if at else ''}: {text}"[:500]


def brought_code_line(error: str) -> str:
    """Of a trial's error text (Ray's header, the traceback), the line describe() wrote, where there is one."""
    found = next((line for line in error.splitlines() if "your code failed" in line), None)
    return error if found is None else found[found.index("your code failed") :]


def load_task(root: Path, ref: str) -> Task:
    """Import `ref` (module:attribute) from `root` (a folder on sys.path, see imported_from); BroughtCodeError
    naming the file and line where the import fails or the attribute is not a Task."""
    try:
        return get_task(ref)
    except Exception as exc:
        raise BroughtCodeError(describe(exc, root, f"to import {ref}")) from exc


def code_root(ref: str) -> Path | None:
    """The folder a researcher's task `ref` (module:attribute) was imported from; None for a built-in task's
    name or a module not imported yet."""
    if ":" not in ref:
        return None
    module_name = ref.split(":", 1)[0]
    file = getattr(sys.modules.get(module_name), "__file__", None)
    if file is None:
        return None
    path = Path(file).resolve()
    return path.parents[module_name.count(".") + (1 if path.name == "__init__.py" else 0)]


@contextmanager
def failing_plainly(task_ref: str) -> Iterator[None]:
    """Around a trial's `train`: a researcher's code that raises fails the trial with one line naming their
    file and line (the traceback stays chained for the trial's log); built-in tasks' errors, and the service's
    own exceptions raised through the task's session (workers.*, ray.*), pass unchanged."""
    root = code_root(task_ref)
    if root is None:
        yield
        return
    try:
        yield
    except Exception as exc:
        if type(exc).__module__.startswith(("workers.", "ray.")):
            raise
        raise BroughtCodeError(describe(exc, root, "in train")) from exc


def model_code_paths(task_ref: str) -> list[str]:
    """What a registered model ships as MLflow `code_paths`: jobs/, and for a researcher's task every top-level
    file and package of their folder (MLflow puts the model's code/ folder on sys.path when it loads it)."""
    paths = [str(Path(__file__).resolve().parent)]
    root = code_root(task_ref)
    if root is not None:
        paths += [str(p) for p in sorted(root.iterdir()) if p.name != "__pycache__"]
    return paths
