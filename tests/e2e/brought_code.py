"""Checks shared by the brought-code tests on the embedded stack and on the two-node production stack:
what a succeeded sweep of examples/own_psi.yaml leaves in MLflow, and its model loading elsewhere."""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import site
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import httpx
from mlflow.tracking import MlflowClient

from tests.support import LAYERLAB

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "own_psi.yaml"

# Only site-packages (no .pth files, so no editable install), from another folder: neither this repository
# nor the researcher's folder is importable; the model must bring its code.
LOAD_SCRIPT = """
import sys
sys.path.extend({sites!r})
import importlib.util, json
for name in ("jobs", "service", "workers", "softmin_tversky", "xor_task"):
    assert importlib.util.find_spec(name) is None, f"{{name}} is importable: the check would prove nothing"
import mlflow, torch
model = mlflow.pytorch.load_model("models:/{model}@champion")
x = torch.tensor([[0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
with torch.no_grad():
    pred = model(x).argmax(1).tolist()
print(json.dumps({{"cls": type(model).__module__ + "." + type(model).__name__, "pred": pred}}))
"""


def cli_submit(env: dict[str, str], spec: Path) -> tuple[int, str]:
    """`layerlab submit` as a researcher runs it: the sweep's id and the CLI's output."""
    out = subprocess.run([LAYERLAB, "submit", str(spec)], env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    found = re.search(r"submitted sweep (\d+)", out.stdout)
    assert found, out.stdout
    return int(found.group(1)), out.stdout


def check_runs_name_the_code(
    client: MlflowClient, sweep: dict[str, Any], api: tuple[str, dict[str, str]], tmp_path: Path, download: bool = True
) -> None:
    """The parent run and every child run carry the code's sha256; the parent holds the archive itself, the
    one the API gives its owner (GET /sweeps/{id}/code). `download=False`: the archive is only listed (the
    compose stack's MLflow hands this file's download to MinIO by its in-network name, which the host
    cannot resolve)."""
    digest = sweep["code_sha256"]
    assert digest and sweep["code"]["layerlab.code_sha256"] == digest, sweep
    url, headers = api
    stored = httpx.get(f"{url}/sweeps/{sweep['id']}/code", headers=headers, timeout=30)
    assert stored.status_code == 200 and hashlib.sha256(stored.content).hexdigest() == digest
    parent = client.get_run(sweep["mlflow"]["parent_run_id"])
    assert parent.data.tags["layerlab.code_sha256"] == digest
    children = client.search_runs(
        [sweep["mlflow"]["experiment_id"]], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'"
    )
    assert len(children) == sweep["trials"]["total"]
    assert {c.data.tags.get("layerlab.code_sha256") for c in children} == {digest}
    # The Task's own name (the worker read it from the code) names the sweep and its runs, the module:attribute beside.
    named = {"layerlab.task": "own_psi.xor", "layerlab.task_ref": sweep["task"]}
    assert sweep["task_name"] == "own_psi.xor", sweep
    for run in (parent, *children):
        assert {k: run.data.tags.get(k) for k in named} == named, run.data.tags
    listed = [a.path for a in client.list_artifacts(parent.info.run_id, "code")]
    assert listed == [f"code/{digest}.tar.gz"], listed
    if not download:
        return
    logged = Path(client.download_artifacts(parent.info.run_id, f"code/{digest}.tar.gz", str(tmp_path))).read_bytes()
    # Through the MLflow server a .gz artifact arrives decompressed (served gzip-encoded, decoded by the
    # client): the tar inside is the same either way.
    assert (gzip.decompress(logged) if logged[:2] == b"\x1f\x8b" else logged) == gzip.decompress(stored.content)


def check_model_loads_alone(model: str, env: dict[str, str], tmp_path: Path) -> None:
    """The registered model loads, and solves XOR, where neither layerlab nor the researcher's code is."""
    sites = [p for p in sys.path if p.endswith("site-packages")] or site.getsitepackages()[:1]
    out = subprocess.run(
        [sys.executable, "-S", "-c", textwrap.dedent(LOAD_SCRIPT).format(sites=sites, model=model)],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **env},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded == {"cls": "softmin_tversky.SoftminTversky", "pred": [0, 1, 1, 0]}, loaded
