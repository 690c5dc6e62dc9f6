"""Writes that run in order on one background thread, and the points where the caller waits for them.

SweepTracker sends its per-trial MLflow writes here when it logs to a tracking server: each is a round
trip that Tune's loop would otherwise wait out. Jobs are numbered as they are submitted; `settle` waits
for the last one marked `before_saves` (or for all of them) and raises the first failure there, on the
caller's thread. After a failure the later jobs are skipped: the sweep fails at that settle anyway.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable


class WriteQueue:
    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._submitted = self._finished = self._must = 0  # _must: the last job a state save waits for
        self._failure: BaseException | None = None
        self._progress = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], None], before_saves: bool) -> None:
        with self._progress:
            self._submitted += 1
            if before_saves:
                self._must = self._submitted
        self._jobs.put(job)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                if self._failure is None:
                    job()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread by settle
                self._failure = exc
            with self._progress:
                self._finished += 1
                self._progress.notify_all()

    def settle(self, everything: bool = False) -> None:
        """Wait for the jobs submitted with `before_saves` (every job, with `everything`); raise the
        first failure."""
        with self._progress:
            target = self._submitted if everything else self._must
            self._progress.wait_for(lambda: self._finished >= target)
        if self._failure is not None:
            raise self._failure

    def close(self) -> None:
        """Wait for every job, then stop the thread (a failure is not raised here)."""
        with self._progress:
            self._progress.wait_for(lambda: self._finished >= self._submitted)
        self._jobs.put(None)
        self._thread.join()
