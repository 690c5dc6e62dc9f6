"""Tune's storage on a local or shared filesystem, with every file written whole or not at all.

Tune (2.60) writes its experiment state into a staging folder, then copies the folder to the storage path
in a background thread; trial workers upload their checkpoints the same way. On a plain filesystem a
kill -9 during a copy leaves a file cut short at the storage path, and a restore from a cut experiment
state silently starts the experiment over under new trial ids (found by tests/faults). An object store
(S3) never shows half an object. This filesystem gives a local path the same property through pyarrow's
public `PyFileSystem` / `FileSystemHandler` API, handed to Tune as `RunConfig(storage_filesystem=...)`:
a file is written beside its place and renamed into it when closed, so a reader sees the old file or the
new one. (It also travels to trial workers inside Tune's storage context: it must pickle.)

Whole writes are not enough for Tune's state files: Tune rewrites them in place in its staging folder
while its background copy of that folder may still be running (a save does not wait for the previous
copy), so a copy can read a file Tune has just truncated, and carry it whole to the storage path. Seen in
tests/faults under load: an empty experiment state, after which Tune restored nothing and started the
sweep over. So a JSON or pickle file (Tune's state files, its tuner and trainable pickles) replaces its
previous version only if what arrived parses: a torn copy is dropped, and the next save's copy brings
the state forward.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

log = logging.getLogger(__name__)
CHECKED_SUFFIXES = (".json", ".pkl")


def parses(data: bytes) -> bool:
    """Whether `data` is one whole JSON document, JSON lines, or one whole pickle (protocol 2 or later: it
    starts with the PROTO opcode and ends with STOP). Tune writes its state files as one or the other, whatever
    their suffix. A torn file is dropped even where no previous version exists: a new session's first
    state file, cut short, would otherwise be the newest and the one a restore reads."""
    if data[:1] == b"\x80" and data[-1:] == b".":
        return True
    try:
        json.loads(data)
    except ValueError:
        # Tune's result.json holds a JSON document per line: whole if every line is (a copy cut at a line's
        # end is an older, whole version of the file).
        lines = [line for line in data.splitlines() if line.strip()]
        try:
            for line in lines:
                json.loads(line)
        except ValueError:
            return False
        return bool(lines)
    return True


class _RenameOnClose:
    """A binary file written under a temporary name and renamed to `path` by close(); a writer killed
    before close() leaves only the temporary file, which no reader of `path` ever sees."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.partial = f"{path}.{uuid.uuid4().hex[:8]}.partial"
        self._file = open(self.partial, "wb")  # noqa: SIM115 - closed (and renamed) by close()
        self.closed = False

    def write(self, data: Any) -> int:
        return self._file.write(data)

    def flush(self) -> None:
        self._file.flush()

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        return self._file.tell()

    def abort(self) -> None:
        self._file.close()
        os.unlink(self.partial)
        self.closed = True

    def close(self) -> None:
        if self.closed:
            return
        self._file.close()
        self.closed = True
        if self.path.endswith(CHECKED_SUFFIXES):
            with open(self.partial, "rb") as written:
                data = written.read()
            if not parses(data):
                os.unlink(self.partial)
                if not data and not os.path.exists(self.path):
                    # A trial's result.json before its first result: Tune makes it empty. Nothing to keep
                    # or to warn about (it came every sync, 5 s apart, for each trial not yet reporting).
                    log.debug("%s: empty, not written yet", self.path)
                    return
                log.warning(
                    "%s: a torn copy arrived (its source was being rewritten); kept the previous one", self.path
                )
                return
        os.replace(self.partial, self.path)


class AtomicLocalHandler(pafs.FileSystemHandler):  # type: ignore[misc]
    """pyarrow's LocalFileSystem for everything but writes, which go through _RenameOnClose."""

    def __init__(self) -> None:
        self._local = pafs.LocalFileSystem()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AtomicLocalHandler)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __reduce__(self) -> tuple[type, tuple[()]]:
        return (AtomicLocalHandler, ())

    def get_type_name(self) -> str:
        return "layerlab-atomic-local"

    def normalize_path(self, path: str) -> str:
        return str(self._local.normalize_path(path))

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        return list(self._local.get_file_info(paths))

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        return list(self._local.get_file_info(selector))

    def create_dir(self, path: str, recursive: bool) -> None:
        self._local.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        self._local.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self._local.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        raise OSError("layerlab's Tune storage never deletes the filesystem root")

    def delete_file(self, path: str) -> None:
        self._local.delete_file(path)

    def move(self, src: str, dest: str) -> None:
        self._local.move(src, dest)

    def copy_file(self, src: str, dest: str) -> None:
        with self._local.open_input_stream(src) as source:
            out = _RenameOnClose(dest)
            try:
                while chunk := source.read(1 << 20):
                    out.write(chunk)
            except BaseException:
                out.abort()
                raise
            out.close()

    def open_input_stream(self, path: str) -> pa.NativeFile:
        return self._local.open_input_stream(path)

    def open_input_file(self, path: str) -> pa.NativeFile:
        return self._local.open_input_file(path)

    def open_output_stream(self, path: str, metadata: Any) -> pa.NativeFile:
        return pa.PythonFile(_RenameOnClose(path), mode="w")

    def open_append_stream(self, path: str, metadata: Any) -> pa.NativeFile:
        # Appends are never whole-file writes; Tune's storage does not use them.
        return self._local.open_append_stream(path, metadata=metadata)


def is_uri(path: str) -> bool:
    """A storage location on a filesystem named by its scheme (s3://, file://), not a local path."""
    return "://" in path


def tune_storage(storage_path: str) -> tuple[str, pafs.FileSystem | None]:
    """(storage path, filesystem) for Tune's RunConfig and Tuner.restore: the atomic filesystem for a local
    path, Tune's own resolution (None) for a URI such as s3://."""
    if is_uri(storage_path):
        return storage_path, None
    return os.path.abspath(storage_path), pafs.PyFileSystem(AtomicLocalHandler())
