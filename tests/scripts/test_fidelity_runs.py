"""scripts/fidelity-runs.sh refuses what it cannot run before it clones or starts anything (a whole run is a
stack and sweeps of minutes to hours: the closing notes record those)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "fidelity-runs.sh"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_without_sweeps_it_says_how_to_call_it() -> None:
    out = run()
    assert out.returncode == 2 and "usage:" in out.stderr and "--all" in out.stderr


def test_a_missing_sweep_file_is_named_and_nothing_starts() -> None:
    before = set(Path("/tmp").glob("layerlab-fidelity.*"))
    out = run("sweeps/symbolic_prop.yaml", "sweeps/no_such_sweep.yaml")
    assert out.returncode == 2 and "no sweep file sweeps/no_such_sweep.yaml" in out.stderr
    assert set(Path("/tmp").glob("layerlab-fidelity.*")) == before  # no clone was made
