"""`DataPath`: the type of a task config field that names a file or folder on the worker, which the task
reads (a data set) or writes (a cache). A plain `str` to the task; the service checks every such value
against the folders its operator allows (`LAYERLAB_DATA_ROOTS`) when a sweep is submitted, and the
worker checks again before it runs one, so a submitter cannot point a task at any path the worker can
reach (service/data_paths.py)."""

from __future__ import annotations

from typing import Annotated


class _DataPathMarker:
    def __repr__(self) -> str:
        return "DATA_PATH"


DATA_PATH = _DataPathMarker()
DataPath = Annotated[str, DATA_PATH]
