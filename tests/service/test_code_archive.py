"""service.code_archive: what `layerlab submit` packs and what the API agrees to store."""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

import pytest

from service import code_archive
from service.code_archive import CodeArchiveError, check, pack, unpack


def _folder(tmp_path: Path) -> Path:
    root = tmp_path / "mine"
    (root / "pkg").mkdir(parents=True)
    (root / "layer.py").write_text("X = 1\n")
    (root / "pkg" / "__init__.py").write_text("")
    for left_out in (".git", "__pycache__", ".venv", "pkg/__pycache__", ".pytest_cache"):
        (root / left_out).mkdir(parents=True, exist_ok=True)
        (root / left_out / "junk.py").write_text("junk\n")
    (root / "layer.pyc").write_bytes(b"\0")
    return root


def _tar(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return raw.getvalue()


def _file(name: str, data: bytes = b"x = 1\n") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _special(name: str, kind: bytes, link: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info, None


def test_a_folder_packs_its_code_and_leaves_out_caches_vcs_and_venvs(tmp_path: Path) -> None:
    packed = pack(_folder(tmp_path))
    assert packed.files == ["layer.py", "pkg/__init__.py"]
    assert check(packed.data) == ["layer.py", "pkg/__init__.py"]
    assert packed.sha256 == code_archive.sha256(packed.data)


def test_the_same_code_packs_to_the_same_hash_and_a_change_to_another(tmp_path: Path) -> None:
    root = _folder(tmp_path)
    first = pack(root)
    (root / "layer.py").touch()  # a new mtime, same content
    assert pack(root).sha256 == first.sha256
    (root / "layer.py").write_text("X = 2\n")
    assert pack(root).sha256 != first.sha256


def test_a_single_file_packs_alone(tmp_path: Path) -> None:
    root = _folder(tmp_path)
    assert pack(root / "layer.py").files == ["layer.py"]
    with pytest.raises(CodeArchiveError, match="not a .py file"):
        pack(root / "layer.pyc")
    with pytest.raises(CodeArchiveError, match="does not exist"):
        pack(root / "missing")


def test_a_link_out_of_the_folder_is_refused_when_packing(tmp_path: Path) -> None:
    root = _folder(tmp_path)
    (tmp_path / "secret.txt").write_text("token\n")
    (root / "secret.txt").symlink_to(tmp_path / "secret.txt")
    with pytest.raises(CodeArchiveError, match="a link to .*outside"):
        pack(root)


def test_too_much_code_is_refused_when_packing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(code_archive, "MAX_UNPACKED_BYTES", 5)  # layer.py alone is 6 bytes
    with pytest.raises(CodeArchiveError, match="the limit is 5"):
        pack(_folder(tmp_path))


@pytest.mark.parametrize(
    ("members", "why"),
    [
        ([_file("../evil.py")], "a path outside its folder"),
        ([_file("/etc/evil.py")], "a path outside its folder"),
        ([_file("a/../../evil.py")], "a path outside its folder"),
        ([_file("ok.py"), _special("link.py", tarfile.SYMTYPE, "/etc/passwd")], "a link"),
        ([_file("ok.py"), _special("hard.py", tarfile.LNKTYPE, "ok.py")], "a link"),
        ([_special("dev", tarfile.CHRTYPE)], "neither a file nor a folder"),
        ([_special("fifo", tarfile.FIFOTYPE)], "neither a file nor a folder"),
        ([_special("only-a-folder", tarfile.DIRTYPE)], "holds no file"),
    ],
    ids=["dotdot", "absolute", "climbs", "symlink", "hardlink", "device", "fifo", "empty"],
)
def test_a_hostile_archive_is_refused_saying_why(members: list[tuple[tarfile.TarInfo, bytes | None]], why: str) -> None:
    with pytest.raises(CodeArchiveError, match=why):
        check(_tar(*members))


@pytest.mark.parametrize(
    "data",
    [b"", b"not an archive", gzip.compress(b"gzip but not a tar" * 100), _tar(_file("a.py"))[:-30]],
    ids=["empty", "text", "gzip-not-tar", "truncated"],
)
def test_what_is_not_a_gzipped_tar_is_refused(data: bytes) -> None:
    with pytest.raises(CodeArchiveError, match="not a gzipped tar"):
        check(data)


def test_an_archive_that_unpacks_too_large_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(code_archive, "MAX_UNPACKED_BYTES", 100)
    with pytest.raises(CodeArchiveError, match="unpacks to more than 100 bytes"):
        check(_tar(_file("big.py", b"#" * 101)))


def test_an_archive_over_the_packed_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(code_archive, "MAX_PACKED_BYTES", 10)
    with pytest.raises(CodeArchiveError, match="the limit is 10"):
        check(_tar(_file("a.py")))


def test_unpack_gives_back_the_files(tmp_path: Path) -> None:
    dest = unpack(pack(_folder(tmp_path)).data, tmp_path / "out")
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()) == ["layer.py", "pkg/__init__.py"]
    assert (dest / "layer.py").read_text() == "X = 1\n"
