"""scripts/symbolic-baselines.py scores the rules that learn nothing on a symbolic sweep's own split: here a
small one (name=value overrides), each baseline a share in [0, 1], the per-formula constant oracle at least
each constant, and bad arguments refused with a reason."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "symbolic-baselines.py"


def run(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={"PATH": "/usr/bin:/bin", "HOME": str(home)},
    )  # fmt: skip


def test_it_scores_each_baseline_on_the_sweeps_split(tmp_path: Path) -> None:
    small = ("train_examples=300", "test_examples=60", f"cache_dir={tmp_path}")
    out = run("sweeps/symbolic_prop.yaml", *small, home=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("symbolic.prop: 60 test formulas (300 train)"), out.stdout
    scores = dict(line.strip().split(": ") for line in out.stdout.splitlines()[1:])
    shares = {name: float(value) for name, value in scores.items()}
    assert set(shares) == {f"baseline/{k}" for k in ("all_false", "all_true", "constant_best", "polarity")}
    assert all(0.0 <= v <= 1.0 for v in shares.values())
    assert shares["baseline/constant_best"] >= max(shares["baseline/all_false"], shares["baseline/all_true"])


def test_bad_arguments_are_refused_with_a_reason(tmp_path: Path) -> None:
    out = run("sweeps/tversky_xor_demo.yaml", home=tmp_path)
    assert out.returncode == 2 and "give a symbolic.prop or symbolic.ltl one" in out.stderr
    out = run("sweeps/symbolic_prop.yaml", "derived", home=tmp_path)
    assert out.returncode == 2 and "overrides are name=value" in out.stderr
