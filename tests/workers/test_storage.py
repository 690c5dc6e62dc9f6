"""Tune's storage filesystem (workers/storage.py): every file is written beside its place and renamed in, so a
write cut short leaves the old file whole, and a JSON or pickle state file that arrives torn is dropped."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from workers.storage import tune_storage


def test_a_storage_write_cut_short_leaves_the_old_file_whole(tmp_path: Path) -> None:
    """What a kill -9 in the middle of Tune's copy of a state file leaves at the storage path: the file
    as it was (the new bytes wait under a temporary name that no reader opens)."""
    _, fs = tune_storage(str(tmp_path))
    assert fs is not None
    state = tmp_path / "experiment_state-x.json"
    state.write_text('{"whole": "old"}')
    out = fs.open_output_stream(str(state))
    out.write(b'{"whole": "n')  # the writer dies here: no close()
    assert json.loads(state.read_text()) == {"whole": "old"}
    del out  # (pyarrow closes a stream it collects; a killed process never gets that far)
    with fs.open_output_stream(str(state)) as whole:
        whole.write(b'{"whole": "new"}')
    assert json.loads(state.read_text()) == {"whole": "new"}


@pytest.mark.parametrize("torn", [b"", b'{"trial_data": [', pickle.dumps({"searcher": 1})[:-3]])
def test_a_torn_copy_of_a_state_file_never_replaces_a_whole_one(tmp_path: Path, torn: bytes) -> None:
    """Tune rewrites its state files in place while its background copy may be reading them: a copy that
    read one half-written arrives whole but torn. It is dropped, old file or none."""
    _, fs = tune_storage(str(tmp_path))
    assert fs is not None
    state, new_session = tmp_path / "experiment_state-a.json", tmp_path / "experiment_state-b.json"
    state.write_text('{"whole": "old"}')
    for target in (state, new_session):
        with fs.open_output_stream(str(target)) as out:
            out.write(torn)
    assert json.loads(state.read_text()) == {"whole": "old"}
    assert not new_session.exists()
    searcher = tmp_path / "basic-variant-state-a.json"  # a pickle, whatever its suffix
    with fs.open_output_stream(str(searcher)) as out:
        out.write(pickle.dumps({"searcher": 2}))
    assert pickle.loads(searcher.read_bytes()) == {"searcher": 2}
    results = tmp_path / "result.json"  # Tune's JSON lines: whole if every line is
    with fs.open_output_stream(str(results)) as out:
        out.write(b'{"training_iteration": 1}\n{"training_iteration": 2}\n')
    assert len(results.read_text().splitlines()) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [searcher.name, state.name, results.name]  # no temp file


def test_an_empty_first_copy_is_dropped_quietly_and_an_empty_overwrite_is_not(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Tune makes a trial's result.json empty at the trial's start and the copy runs every few seconds: no
    warning for that. An empty copy over a whole file is a torn one, and says so."""
    _, fs = tune_storage(str(tmp_path))
    assert fs is not None
    results = tmp_path / "result.json"
    with caplog.at_level("WARNING", logger="workers.storage"):
        with fs.open_output_stream(str(results)) as out:
            out.write(b"")
        assert not results.exists() and not caplog.records
        results.write_text('{"training_iteration": 1}\n')
        with fs.open_output_stream(str(results)) as out:
            out.write(b"")
    assert results.read_text() == '{"training_iteration": 1}\n'
    assert [r.getMessage() for r in caplog.records] == [
        f"{results}: a torn copy arrived (its source was being rewritten); kept the previous one"
    ]


def test_the_atomic_storage_travels_to_trial_processes_and_copies_folders(tmp_path: Path) -> None:
    import pyarrow.fs as pafs

    _, fs = tune_storage(str(tmp_path / "store"))
    assert fs is not None
    again = pickle.loads(pickle.dumps(fs))  # Tune ships its storage context (with the filesystem) to trials
    source = tmp_path / "staging"
    (source / "trial").mkdir(parents=True)
    (source / "trial" / "result.json").write_text("{}")
    (source / "experiment_state-x.json").write_text("[]")
    pafs.copy_files(str(source), str(tmp_path / "store" / "exp"), destination_filesystem=again)
    copied = sorted(p.relative_to(tmp_path / "store").as_posix() for p in (tmp_path / "store").rglob("*"))
    assert copied == ["exp", "exp/experiment_state-x.json", "exp/trial", "exp/trial/result.json"]
    assert tune_storage("s3://bucket/tune") == ("s3://bucket/tune", None)
