"""service.provenance: the git state of a checkout, package versions, the cluster's resources."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

from service.provenance import SOURCE_ROOT, code_tags, git_state, versions


def git(folder: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def make_repo(folder: Path) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    git(folder, "init", "-q")
    (folder / "layer.py").write_text("W = 1\n")
    (folder / ".gitignore").write_text("cache/\n")
    git(folder, "add", ".")
    git(folder, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    return git(folder, "rev-parse", "HEAD")


def test_a_clean_checkout_names_its_commit_unmodified(tmp_path: Path) -> None:
    commit = make_repo(tmp_path / "repo")
    assert git_state(tmp_path / "repo") == {"commit": commit, "modified": "false"}
    (tmp_path / "repo" / "cache").mkdir()
    (tmp_path / "repo" / "cache" / "x.bin").write_bytes(b"ignored")  # ignored files change nothing that runs
    assert git_state(tmp_path / "repo") == {"commit": commit, "modified": "false"}


def test_a_changed_or_new_file_marks_the_checkout_modified(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    commit = make_repo(repo)
    (repo / "layer.py").write_text("W = 2\n")
    assert git_state(repo) == {"commit": commit, "modified": "true"}
    git(repo, "checkout", "-q", "--", "layer.py")
    (repo / "new_layer.py").write_text("V = 3\n")
    assert git_state(repo) == {"commit": commit, "modified": "true"}


def test_a_folder_that_is_no_checkout_or_only_inside_one_has_no_git_state(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    assert git_state(tmp_path / "plain") is None
    make_repo(tmp_path / "repo")
    inner = tmp_path / "repo" / "venv" / "site-packages"  # an installed copy inside some other checkout
    inner.mkdir(parents=True)
    assert git_state(inner) is None
    assert "layerlab.git_commit" not in code_tags(tmp_path / "plain")
    assert code_tags(tmp_path / "plain")["layerlab.version"] == metadata.version("layerlab")


def test_this_checkout_and_the_installed_versions() -> None:
    tags = code_tags()
    assert tags["layerlab.git_commit"] == git(SOURCE_ROOT, "rev-parse", "HEAD")
    found = versions()
    assert set(found) == {"python", "torch", "ray", "mlflow", "numpy"}
    assert found["torch"] == metadata.version("torch") and found["ray"] == metadata.version("ray")


def test_no_cluster_resources_without_a_ray_connection() -> None:
    # In a fresh interpreter: a test process of the suite may have connected to Ray.
    code = "import sys; from service.provenance import cluster_resources as r; print(r(), 'ray' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=SOURCE_ROOT)
    assert done.stdout.split() == ["None", "False"]  # and reading them did not import (or start) Ray
