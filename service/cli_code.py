"""The CLI's side of a sweep that brings code: find the folder, pack it, import its task here to check params.

Only the researcher's own machine imports their code before it runs (`layerlab validate` / `submit`); the API
stores the archive without importing it, and the worker imports it to run it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jobs.brought_code import imported_from, load_task
from jobs.registry import Task
from service.code_archive import CodeArchiveError, Packed, pack
from service.errors import SpecError
from service.spec import CODE_TASK, SweepSpec, parse_spec
from service.spec_loading import load_yaml


def code_source(yaml_file: Path, code: str) -> Path:
    """`code` of a spec, relative to the YAML file that names it (or absolute)."""
    path = Path(code).expanduser()
    return path if path.is_absolute() else (yaml_file.parent / path).resolve()


def local_task(source: Path, ref: str) -> Task:
    """Import `ref` (module:attribute) from the researcher's folder or .py file, as a trial will."""
    root = source if source.is_dir() else source.parent
    if source.is_file() and ref.split(":")[0] != source.stem:
        raise CodeArchiveError(
            f"task: {ref} is not in {source.name}; with a single file the task is {source.stem}:NAME"
        )
    with imported_from(root):
        return load_task(root, ref)


def brings_code(yaml_file: Path) -> bool:
    """Whether the spec names `code` (a malformed file: False, and the API's answer names what is wrong)."""
    try:
        data = load_yaml(yaml_file.read_bytes())
    except SpecError:
        return False
    return isinstance(data, dict) and data.get("code") is not None


def check_local(yaml_file: Path) -> tuple[SweepSpec, Packed | None]:
    """The spec, checked as the API checks it and, where it brings code, against that code's task imported
    here; with the packed archive. SpecError lists every problem (the code's as `code:` lines)."""
    text = yaml_file.read_bytes()
    data: Any = load_yaml(text)
    code, ref = (data.get("code"), data.get("task")) if isinstance(data, dict) else (None, None)
    if not (isinstance(code, str) and isinstance(ref, str) and CODE_TASK.fullmatch(ref)):
        return parse_spec(text), None  # no code, or a malformed spec: parse_spec names what is wrong
    source = code_source(yaml_file, code)
    try:
        packed = pack(source)
        task = local_task(source, ref)
    except CodeArchiveError as exc:
        raise SpecError([str(exc) if str(exc).startswith(("code:", "task:")) else f"code: {exc}"]) from None
    except Exception as exc:  # BroughtCodeError: the researcher's file and line
        raise SpecError([f"code: {exc}"]) from None
    return parse_spec(text, code_task=task), packed
