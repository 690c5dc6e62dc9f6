"""A trial's checkpoint files, and the one rule that chooses among them.

A checkpoint file is named by what it holds (`checkpoint-000006-a3.pt`): the iteration it was reported with (a
trial resumed from it numbers its reports on from there) and the attempt of the sweep that wrote it. Never by
where it lies: Tune names a trial's checkpoint folders by a counter kept in its experiment state, and a state
restored from a save older than the trial's newest checkpoint counts again from there, so a later attempt writes
into a folder that already holds an earlier attempt's checkpoint (tests/workers/test_trainable_checkpoints.py).
Tune copies a checkpoint's files into the folder without emptying it, so files named apart all stay.

The rule (`usable`, `newest_usable`), the same for resume, the best trial and model registration (pruning, after a
sweep succeeded, keeps the folder of the trial's last checkpoint, which then holds the newest usable one): a
trial's checkpoint is the newest file that the reading attempt wrote itself, or whose iteration the ledger has
committed (the trial row's `logged_iteration`, the highest step in the metric outbox). A file of an earlier
attempt past that iteration was written before its step reached the outbox (Tune and Ray Train persist a
checkpoint before the driver hears of it): resumed from it, the trial would never report that step again.

Imported inside trial processes: keep its top level free of the service and of MLflow.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

CHECKPOINT_NAME = re.compile(r"checkpoint-(\d+)(?:-a(\d+))?\.pt")


@dataclass(frozen=True)
class StoredCheckpoint:
    path: Path
    iteration: int
    attempt: int | None
    """The attempt of the sweep that wrote it; None outside a worker (no fence)."""


def checkpoint_file_name(iteration: int, attempt: int | None) -> str:
    return f"checkpoint-{iteration:06d}.pt" if attempt is None else f"checkpoint-{iteration:06d}-a{attempt}.pt"


def stored_checkpoints(folder: str | Path) -> list[StoredCheckpoint]:
    """The checkpoints a checkpoint folder holds, oldest iteration first."""
    found = []
    for path in Path(folder).glob("checkpoint-*.pt"):
        if m := CHECKPOINT_NAME.fullmatch(path.name):
            found.append(StoredCheckpoint(path, int(m[1]), int(m[2]) if m[2] else None))
    return sorted(found, key=lambda c: (c.iteration, c.attempt or 0))


def usable(checkpoint: StoredCheckpoint, attempt: int | None, committed: int | None) -> bool:
    """Whether a reader may use it: `attempt`, the reader's attempt of the sweep (None: it wrote none, e.g. model
    registration); `committed`, the ledger's iteration (None: no ledger to consult, outside a worker)."""
    if committed is None:
        return True
    return (attempt is not None and checkpoint.attempt == attempt) or checkpoint.iteration <= committed


def newest_usable(folders: Iterable[str | Path], attempt: int | None, committed: int | None) -> StoredCheckpoint | None:
    """The newest usable checkpoint over a trial's checkpoint folders (Tune's, Ray Train's, the ledger's)."""
    candidates = [c for folder in folders for c in stored_checkpoints(folder) if usable(c, attempt, committed)]
    return max(candidates, key=lambda c: (c.iteration, c.attempt or 0), default=None)


def load(checkpoint: StoredCheckpoint) -> dict[str, Any]:
    state: dict[str, Any] = torch.load(checkpoint.path, map_location="cpu", weights_only=False)
    return state


def save(folder: str | Path, state: dict[str, Any], iteration: int, attempt: int | None) -> None:
    torch.save(state, Path(folder) / checkpoint_file_name(iteration, attempt))
