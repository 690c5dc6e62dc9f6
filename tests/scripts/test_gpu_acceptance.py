"""scripts/gpu-acceptance.sh --dry-run: every GPU check at toy sizes on the CPU, one table, exit 0 only when
every check passed (the sweep check validates its spec without starting the service)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_dry_run_prints_every_check_in_one_table() -> None:
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu-acceptance.sh"), "--dry-run"],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    assert table[0].split("|")[1].strip() == "check"
    rows = {cells[0]: cells[1:] for cells in ([c.strip() for c in line.split("|")[1:-1]] for line in table[1:])}
    names = list(rows)
    expected = [
        "head fwd+bwd, GEMMs alone", "head fwd+bwd, ours, bf16", "head fwd+bwd, official, autocast",
        "GPT-2 step", "GPT-2 step", "GPT-2 step", "official vs ours, fp32", "bf16 vs fp32, our Tversky layer",
        "bf16 autocast vs fp32, GPT-2", "sweep through the service", "whole run",
    ]  # fmt: skip
    assert len(names) == len(expected) and all(n.startswith(e) for n, e in zip(names, expected, strict=True)), names
    steps = [r for n, r in rows.items() if n.startswith("GPT-2 step")]
    assert [n.split(", ")[-1].split(" (")[0] for n in names if n.startswith("GPT-2 step")] == [
        "linear head", "our Tversky head", "official Tversky head",
    ]  # fmt: skip
    assert all(float(r[0].split(" tok/s")[0].replace(",", "")) > 0 for r in steps), steps
    statuses = {n: r[-1] for n, r in rows.items()}
    assert all(s == "ok" for n, s in statuses.items() if not n.startswith("sweep")), statuses
    assert rows[names[-2]][0].startswith("not run (dry run): the spec validates"), rows[names[-2]]
