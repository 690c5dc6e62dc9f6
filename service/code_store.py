"""The code archives sweeps bring (service.code_archive), stored in the queue database once per content;
part of service.queue.QueueStore."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, cast

from sqlalchemy import CursorResult, select
from sqlalchemy.dialects import postgresql, sqlite

from service.code_archive import check, sha256, unpack
from service.models import CodeArchive, utcnow
from service.store_base import StoreBase, waits_out_outages


class CodeArchives(StoreBase):
    def put_code(self, data: bytes, uploaded_by: str | None = None) -> tuple[str, int, bool]:
        """Store a checked archive (CodeArchiveError, nothing stored, where `check` refuses it); returns its
        sha256, its number of files and whether it was new. The same bytes twice store one row."""
        files = check(data)
        digest = sha256(data)
        dialect = postgresql if self.is_postgres else sqlite
        stmt = dialect.insert(CodeArchive).values(
            sha256=digest, data=data, files=len(files), uploaded_by=uploaded_by, uploaded_at=utcnow()
        )
        with self.session() as s, s.begin():
            result = s.execute(stmt.on_conflict_do_nothing(index_elements=[CodeArchive.sha256]))
            created = cast(CursorResult[Any], result).rowcount
        return digest, len(files), bool(created)

    def has_code(self, digest: str) -> bool:
        with self.session() as s:
            return s.scalar(select(CodeArchive.sha256).where(CodeArchive.sha256 == digest)) is not None

    @waits_out_outages
    def code(self, digest: str) -> bytes:
        """The archive's bytes; KeyError where no archive has this hash."""
        with self.session() as s:
            data = s.scalar(select(CodeArchive.data).where(CodeArchive.sha256 == digest))
        if data is None:
            raise KeyError(f"no code archive {digest}")
        return bytes(data)

    def unpacked(self, digest: str, under: Path) -> Path:
        """The archive unpacked as `under/<sha256>` on this machine (for a worker: Ray's runtime_env working_dir).
        A folder that exists is whole: it is unpacked beside it and renamed into place."""
        dest = (under / digest).resolve()
        if dest.is_dir():
            return dest
        part = dest.with_name(f"{digest}.{os.getpid()}.part")
        shutil.rmtree(part, ignore_errors=True)
        unpack(self.code(digest), part)
        try:
            part.rename(dest)
        except OSError:  # another worker on this machine put it there first
            shutil.rmtree(part, ignore_errors=True)
        return dest
