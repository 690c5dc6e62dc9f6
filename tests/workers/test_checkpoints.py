"""The one rule that chooses a trial's checkpoint (workers.checkpoints), as resume, registration and the best trial
use it: the newest file that the reader's attempt wrote, or whose iteration the ledger has committed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from jobs.registry import get_task
from workers.checkpoints import StoredCheckpoint, load, newest_usable, save, stored_checkpoints, usable
from workers.registration import load_best_model


def at(iteration: int, attempt: int | None) -> StoredCheckpoint:
    return StoredCheckpoint(Path("unused"), iteration, attempt)


def test_an_earlier_attempts_checkpoint_is_usable_only_up_to_the_committed_iteration() -> None:
    assert usable(at(9, 3), attempt=3, committed=0)  # a retry within this attempt
    assert usable(at(6, 2), attempt=3, committed=6)  # its step's row is in the outbox
    assert not usable(at(7, 2), attempt=3, committed=6)  # written before step 7 reached the outbox
    assert not usable(at(7, None), attempt=3, committed=0)  # written outside a worker: not this attempt's
    assert usable(at(7, None), attempt=None, committed=None)  # outside a worker: no ledger to consult
    assert not usable(at(7, 2), attempt=None, committed=6)  # registration: no own attempt, the ledger decides


def test_files_are_read_by_what_their_names_say(tmp_path: Path) -> None:
    save(tmp_path, {"at": 4}, 4, 2)
    save(tmp_path, {"at": 6}, 6, 3)
    save(tmp_path, {"at": 5}, 5, None)  # written outside a worker: no attempt
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    (tmp_path / "checkpoint.pt").write_bytes(b"not named by what it holds")
    assert [(c.iteration, c.attempt) for c in stored_checkpoints(tmp_path)] == [(4, 2), (5, None), (6, 3)]
    other = tmp_path / "other"
    other.mkdir()
    save(other, {"at": 5.5}, 5, 3)
    chosen = newest_usable([tmp_path, other], attempt=None, committed=5)
    assert chosen is not None and load(chosen) == {"at": 5.5}  # iteration 5: attempt 3's before the unstamped one
    assert newest_usable([tmp_path], attempt=4, committed=3) is None


def test_registration_loads_the_model_of_the_committed_checkpoint(tmp_path: Path) -> None:
    task = get_task("tversky.xor")
    config = {"features": 4, "seed": 0}
    model = task.build_model(task.make_config(config))
    committed_state = {k: v.clone() for k, v in model.state_dict().items()}
    save(tmp_path, {"model": committed_state}, 3, 1)
    later = {k: torch.zeros_like(v) for k, v in committed_state.items()}
    save(tmp_path, {"model": later}, 4, 1)  # written before step 4 reached the outbox, then the worker died
    loaded = load_best_model(task, config, tmp_path, committed=3)
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in committed_state.items())
    with pytest.raises(FileNotFoundError, match="no checkpoint up to iteration 2 in"):
        load_best_model(task, config, tmp_path, committed=2)
