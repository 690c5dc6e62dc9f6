"""A researcher's code as a sweep brings it: a gzipped tar, packed by the CLI, checked by the API, unpacked by
the worker (service.code_store.CodeArchives.unpacked) and handed to Ray's `runtime_env` (workers.worker.ensure_ray).

The archive is content-addressed (the sha256 of its bytes) and packed deterministically (sorted names, no
owners, no times), so the same code packs to the same hash and a resubmission stores nothing new. `check`
is the API's whole view of the code: it reads the archive's index, never imports or runs what is inside.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

MAX_PACKED_BYTES = 8 * 1024 * 1024
"""Largest archive the API stores (compressed). Code, not data: datasets go under LAYERLAB_DATA_ROOTS."""
MAX_UNPACKED_BYTES = 64 * 1024 * 1024
MAX_FILES = 2000

LEFT_OUT_DIRS = frozenset(
    {
        ".git", ".hg", ".svn", "__pycache__", ".venv", "venv", "env", ".env", ".tox", ".nox", ".mypy_cache",
        ".pytest_cache", ".ruff_cache", ".hypothesis", ".ipynb_checkpoints", "node_modules", ".idea", ".vscode",
        "mlruns", ".layerlab", "build", "dist", ".eggs",
    }
)  # fmt: skip
"""Folders a researcher would not want shipped: version control, caches, virtual environments, run outputs."""
LEFT_OUT_SUFFIXES = (".pyc", ".pyo", ".so.tmp", ".DS_Store", ".egg-info")


class CodeArchiveError(ValueError):
    """The code cannot be packed, or an archive is not one the service runs; the message says why."""


@dataclass(frozen=True)
class Packed:
    data: bytes
    sha256: str
    files: list[str]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _shipped(root: Path) -> list[Path]:
    """Files under `root` to ship, sorted, with LEFT_OUT_DIRS and LEFT_OUT_SUFFIXES left out."""
    out: list[Path] = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(part in LEFT_OUT_DIRS or part.endswith(".egg-info") for part in rel.parts):
            continue
        if path.name.endswith(LEFT_OUT_SUFFIXES) or path.is_dir():
            continue
        if path.is_symlink():
            target = path.resolve()
            if not target.is_relative_to(root.resolve()):
                raise CodeArchiveError(
                    f"{path} is a link to {target}, outside {root}; copy what it points to into the folder"
                )
        if path.is_file():
            out.append(path)
    return out


def pack(source: str | Path) -> Packed:
    """Pack a folder (its contents become the archive's root) or a single .py file. Links inside the folder
    are stored as the files they point to."""
    source = Path(source)
    if not source.exists():
        raise CodeArchiveError(f"code: {source} does not exist; give a folder or a .py file")
    if source.is_file():
        if source.suffix != ".py":
            raise CodeArchiveError(f"code: {source} is a file but not a .py file; give a folder or a .py file")
        root, files = source.parent, [source]
    else:
        root, files = source, _shipped(source)
    if not files:
        raise CodeArchiveError(f"code: {source} holds no file to ship (caches and virtual environments left out)")
    if len(files) > MAX_FILES:
        raise CodeArchiveError(f"code: {source} holds {len(files)} files to ship; the limit is {MAX_FILES}")
    total = sum(f.stat().st_size for f in files)
    if total > MAX_UNPACKED_BYTES:
        raise CodeArchiveError(
            f"code: {source} holds {total} bytes to ship; the limit is {MAX_UNPACKED_BYTES} "
            "(data belongs under LAYERLAB_DATA_ROOTS, not in the code folder)"
        )
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in files:
            data = path.read_bytes()
            info = tarfile.TarInfo(path.relative_to(root).as_posix())
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    # mtime=0 in the gzip header too: the same files give the same bytes, hence the same hash.
    data = gzip.compress(raw.getvalue(), compresslevel=6, mtime=0)
    if len(data) > MAX_PACKED_BYTES:
        raise CodeArchiveError(f"code: {source} packs to {len(data)} bytes; the limit is {MAX_PACKED_BYTES}")
    return Packed(data, sha256(data), [p.relative_to(root).as_posix() for p in files])


def check(data: bytes) -> list[str]:
    """The archive's file names, or CodeArchiveError saying why the service will not store it: not a gzipped
    tar, too large, a name that is absolute or climbs out with `..`, a link, a device or other special file."""
    if len(data) > MAX_PACKED_BYTES:
        raise CodeArchiveError(f"the code archive is {len(data)} bytes; the limit is {MAX_PACKED_BYTES}")
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            members = _members(tar)
    except (tarfile.TarError, OSError, EOFError, gzip.BadGzipFile) as exc:
        why = f"the code is not a gzipped tar archive ({exc}); pack it with `layerlab submit`"
        raise CodeArchiveError(why) from None
    names: list[str] = []
    total = 0
    for m in members:
        name = PurePosixPath(m.name)
        if name.is_absolute() or ".." in name.parts or m.name.startswith("\\") or ":" in m.name.split("/")[0]:
            raise CodeArchiveError(f"the code archive holds {m.name!r}, a path outside its folder")
        if m.issym() or m.islnk():
            raise CodeArchiveError(f"the code archive holds {m.name!r}, a link (to {m.linkname!r}); ship files")
        if not (m.isfile() or m.isdir()):
            raise CodeArchiveError(f"the code archive holds {m.name!r}, neither a file nor a folder")
        total += m.size
        if total > MAX_UNPACKED_BYTES:
            raise CodeArchiveError(f"the code archive unpacks to more than {MAX_UNPACKED_BYTES} bytes")
        if m.isfile():
            names.append(m.name)
    if not names:
        raise CodeArchiveError("the code archive holds no file")
    return names


def _members(tar: tarfile.TarFile) -> list[tarfile.TarInfo]:
    members = []
    for m in tar:  # reading the index decompresses the whole stream: a truncated one raises here
        members.append(m)
        if len(members) > MAX_FILES:
            raise CodeArchiveError(f"the code archive holds more than {MAX_FILES} entries")
    return members


def unpack(data: bytes, dest: Path) -> Path:
    """Unpack a checked archive into `dest` (made if missing): its folders and regular files only, each path
    checked again to land inside `dest`. By hand rather than `extractall(filter="data")`, which Pythons before
    3.11.4 (the container image's Debian one) do not have."""
    check(data)
    root = dest.resolve()
    root.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for member in tar:
            target = (root / member.name).resolve()
            if not target.is_relative_to(root):
                raise CodeArchiveError(f"the code archive holds {member.name!r}, a path outside its folder")
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            source = tar.extractfile(member)
            assert source is not None  # check() let through only folders and regular files
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read())
    return dest
