"""Helpers shared by unit and stack tests alike: a free port, a wait with a deadline, the `layerlab` CLI of this
venv and a private PostgreSQL server. A plain module, not a conftest: importing it starts nothing and brings in
no fixture (the stack fixtures live in tests/e2e/conftest.py, which re-imports these for its modules)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from service.local_ray import free_port

__all__ = ["LAYERLAB", "PG_BIN", "PrivatePostgres", "Receiver", "free_port", "private_postgres", "wait_until"]

LAYERLAB = str(Path(sys.executable).with_name("layerlab"))
PG_BIN = Path("/usr/lib/postgresql/15/bin")


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


@dataclass
class PrivatePostgres:
    """A PostgreSQL cluster of our own (initdb in a temp dir) that a test may stop and start at will;
    the machine's shared server on 5432 serves other tests and is never touched."""

    data: Path
    port: int

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _pg_ctl(self, *args: str) -> None:
        cmd = ["runuser", "-u", "postgres", "--", str(PG_BIN / "pg_ctl"), "-D", str(self.data / "db"), *args]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{' '.join(cmd)}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1"
        self._pg_ctl("-o", opts, "-l", str(self.data / "postgres.log"), "-w", "start")

    def stop(self) -> None:
        # fast: what `docker stop` or a failover does to the server: sessions are cut, nothing is lost
        self._pg_ctl("-m", "fast", "-w", "stop")

    def running(self) -> bool:
        return (self.data / "db" / "postmaster.pid").exists()


@contextmanager
def private_postgres() -> Iterator[PrivatePostgres]:
    # Not under pytest's tmp_path: the postgres user must be able to reach it.
    data = Path(tempfile.mkdtemp(prefix="pgfault-", dir="/tmp"))
    shutil.chown(data, "postgres", "postgres")
    pg = PrivatePostgres(data=data, port=free_port())
    init = [str(PG_BIN / "initdb"), "-D", str(data / "db"), "-U", "postgres", "-A", "trust", "--no-sync"]
    done = subprocess.run(["runuser", "-u", "postgres", "--", *init], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    pg.start()
    try:
        yield pg
    finally:
        from service import db

        db.dispose_all()
        if pg.running():
            pg.stop()
        shutil.rmtree(data, ignore_errors=True)


class Receiver:
    """An HTTP server on loopback that keeps every POST and answers `status`."""

    def __init__(self, port: int | None = None, status: int = 200) -> None:
        self.port = port or free_port()
        self.status = status
        self.got: list[tuple[dict[str, str], bytes]] = []
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> Receiver:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.got.append(({k: v for k, v in self.headers.items()}, body))
                self.send_response(outer.status)
                if 300 <= outer.status < 400:
                    self.send_header("Location", "http://127.0.0.1:1/elsewhere")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
