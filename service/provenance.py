"""Which code and which versions a process runs: recorded on every MLflow run a worker makes.

Two sweeps run a week apart with different code must not look alike in MLflow, and a registered model
must lead back to the code that trained it. So each sweep's parent run carries, for every attempt
(a later attempt may run on another worker with other code), the layerlab version, the git commit
of the checkout the worker runs from and whether it was modified, the versions of the libraries that
decide the numbers, and the Ray cluster's resources when the attempt started; child runs carry the
code's identity (version and commit).

Versions come from installed package metadata (importlib.metadata), so nothing heavy is imported here.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGES = ("torch", "ray", "mlflow", "numpy")
"""The libraries whose versions a run records beside python's: they decide what a trial computes."""

SOURCE_ROOT = Path(__file__).resolve().parents[1]
"""The folder holding service/, workers/ and jobs/: a git checkout in development, site-packages in an image."""


def git_state(folder: Path) -> dict[str, str] | None:
    """{"commit", "modified"} of the git checkout that holds `folder`, or None where it is not one (an
    installed package, a container image) or git is missing. `modified` counts tracked files changed and
    files git does not ignore yet does not track: both change what runs."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=10)
        if done.returncode != 0:
            raise OSError(done.stderr.strip())
        return done.stdout.strip()

    try:
        if Path(git("rev-parse", "--show-toplevel")).resolve() != folder.resolve():
            return None  # an enclosing repository (a venv's site-packages inside a checkout), not this code's
        commit = git("rev-parse", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=normal")
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "modified": "true" if changed else "false"}


def versions() -> dict[str, str]:
    """python and PACKAGES -> installed version ("absent" where a package is not installed)."""
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def layerlab_version() -> str:
    try:
        return metadata.version("layerlab")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def code_tags(source_root: Path = SOURCE_ROOT) -> dict[str, str]:
    """The code's identity as run tags: `layerlab.version`, and from a git checkout `layerlab.git_commit`
    and `layerlab.git_modified`."""
    tags = {"layerlab.version": layerlab_version()}
    state = git_state(source_root)
    if state is not None:
        tags["layerlab.git_commit"] = state["commit"]
        tags["layerlab.git_modified"] = state["modified"]
    return tags


def cluster_resources() -> dict[str, float] | None:
    """The connected Ray cluster's total resources (CPU, GPU, memory, ...), or None where this process has
    not connected to Ray. Ray is read only if already imported: this module never starts it."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    return {k: float(v) for k, v in ray.cluster_resources().items() if not k.startswith("node:")}


def provenance(source_root: Path = SOURCE_ROOT) -> dict[str, Any]:
    """Everything a parent run records about the attempt that runs it (written as JSON and as tags)."""
    return {
        **code_tags(source_root),
        "versions": versions(),
        "cluster_resources": cluster_resources(),
    }


def code_identity(record: dict[str, Any]) -> dict[str, str]:
    """The code's identity (code_tags) out of a provenance record: what a sweep's row and its child runs carry."""
    return {k: str(v) for k, v in record.items() if k.startswith("layerlab.")}


def provenance_tags(record: dict[str, Any]) -> dict[str, str]:
    """A provenance record as a parent run's tags: the code's identity, `layerlab.<package>_version` for python
    and PACKAGES, and `layerlab.cluster_resources` (JSON)."""
    tags = code_identity(record)
    tags.update({f"layerlab.{name}_version": v for name, v in record["versions"].items()})
    tags["layerlab.cluster_resources"] = json.dumps(record["cluster_resources"], sort_keys=True)
    return tags
