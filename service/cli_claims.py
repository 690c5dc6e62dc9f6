"""`layerlab claims`: a sweep's judged claims, from its parent run into a document's tables.

    layerlab claims pull RUN_ID [--into docs/claims]      summary/claims.json of a parent run -> <sweep>.json
    layerlab claims doc docs/fidelity.md [--check]         fill the doc's claims blocks from those files
    layerlab claims rejudge docs/claims/*.json [--sweeps sweeps]   judge kept files again under today's rule

A block in the document is `<!-- claims:NAME -->` ... `<!-- /claims:NAME -->`, NAME the sweep's name; its
file is `<claims dir>/NAME.json` (default: `claims/` beside the document). `--pull RUN_ID` (repeatable) reads
parent runs of the tracking server first, and keeps their files in the claims folder, so the doc's tables are
always the output of this command over files exported from runs.
"""

from __future__ import annotations

import difflib
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from service.claims import CODE_TAGS, read_claims, rejudge, render_doc
from service.settings import get_settings

claims_app = typer.Typer(help="Paper claims judged by sweeps: export them from runs, write a document's tables.")
out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)
CLAIMS_FILE = "summary/claims.json"


def _fail(message: str, code: int = 1) -> typer.Exit:
    err.print(f"[red]error:[/red] {escape(message)}", highlight=False)
    return typer.Exit(code)


def fetch_claims(run_id: str, tracking_uri: str) -> dict[str, Any]:
    """The checked claims file of a parent run (MLflow's public artifact download), its sweep.code filled from
    the run's provenance tags (service.claims.CODE_TAGS) where the file does not carry them."""
    import mlflow

    with tempfile.TemporaryDirectory() as d:
        try:
            path = mlflow.artifacts.download_artifacts(
                run_id=run_id, artifact_path=CLAIMS_FILE, dst_path=d, tracking_uri=tracking_uri
            )
        except Exception as exc:
            raise ValueError(
                f"run {run_id} at {tracking_uri} has no {CLAIMS_FILE} ({type(exc).__name__}); it must be the parent "
                "run of a sweep whose YAML lists claims, finished by a worker of this version"
            ) from None
        doc = read_claims(Path(path).read_bytes(), source=f"run {run_id}: {CLAIMS_FILE}")
    tags = mlflow.MlflowClient(tracking_uri).get_run(run_id).data.tags
    code = {k: tags[k] for k in CODE_TAGS if k in tags}
    if code and "code" not in doc["sweep"]:
        doc["sweep"]["code"] = code  # the run's provenance, so the file kept beside a doc names its code
    return doc


def save_claims(doc: dict[str, Any], folder: Path) -> Path:
    import json

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{doc['sweep']['name']}.json"
    path.write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n")
    return path


def load_folder(folder: Path) -> dict[str, dict[str, Any]]:
    """Every claims file of `folder`, by sweep name (the file's name must be the sweep's)."""
    files: dict[str, dict[str, Any]] = {}
    for path in sorted(folder.glob("*.json")):
        doc = read_claims(path.read_bytes(), source=str(path))
        name = doc["sweep"].get("name")
        if name != path.stem:
            raise ValueError(f"{path}: holds the claims of sweep {name!r}; name the file {name}.json")
        files[name] = doc
    return files


@claims_app.command("pull")
def pull(
    run_ids: Annotated[list[str], typer.Argument(help="Parent run ids of finished sweeps.")],
    into: Annotated[Path, typer.Option(help="Folder of the claims files.")] = Path("docs/claims"),
    tracking_uri: Annotated[
        str | None, typer.Option(help="MLflow tracking URI; LAYERLAB_TRACKING_URI's when unset.")
    ] = None,
) -> None:
    """Save each parent run's summary/claims.json as FOLDER/<sweep name>.json."""
    uri = tracking_uri or get_settings().tracking_uri
    for run_id in run_ids:
        try:
            path = save_claims(fetch_claims(run_id, uri), into)
        except ValueError as exc:
            raise _fail(str(exc)) from None
        out.print(f"run {run_id}: {path}", highlight=False)


@claims_app.command("doc")
def doc(
    document: Annotated[Path, typer.Argument(help="A Markdown file with <!-- claims:NAME --> blocks.")],
    claims_dir: Annotated[
        Path | None, typer.Option(help="Folder of the claims files; `claims/` beside the document when unset.")
    ] = None,
    pull_runs: Annotated[
        list[str] | None, typer.Option("--pull", help="Pull this parent run's claims first (repeatable).")
    ] = None,
    tracking_uri: Annotated[str | None, typer.Option(help="MLflow tracking URI, for --pull.")] = None,
    check: Annotated[
        bool, typer.Option("--check", help="Change nothing; exit 1 with a diff when the tables are stale.")
    ] = False,
) -> None:
    """Write the claims tables of DOCUMENT from the claims files (every table is this command's output)."""
    folder = claims_dir or document.parent / "claims"
    try:
        if pull_runs:
            uri = tracking_uri or get_settings().tracking_uri
            for run_id in pull_runs:
                save_claims(fetch_claims(run_id, uri), folder)
        text = document.read_text()
        new, missing = render_doc(text, load_folder(folder) if folder.is_dir() else {})
    except (OSError, ValueError) as exc:
        raise _fail(str(exc)) from None
    if missing:
        raise _fail(
            f"{document}: no claims file for block(s) {', '.join(missing)} in {folder}; "
            "export them with `layerlab claims pull RUN_ID`"
        )
    if check:
        if new != text:
            sys.stdout.writelines(
                difflib.unified_diff(text.splitlines(True), new.splitlines(True), str(document), "regenerated")
            )
            raise _fail(f"{document}: its claims tables differ from {folder}; run `layerlab claims doc {document}`")
        out.print(f"{document}: claims tables match {folder}", highlight=False)
        return
    if new != text:
        document.write_text(new)
    out.print(f"{document}: claims tables written from {folder}", highlight=False)


def spec_of(name: str, sweeps: Path) -> Any:
    """The sweep YAML under `sweeps` whose name is `name` (parsed and checked, as `layerlab validate` would)."""
    import yaml

    from service.errors import SpecError
    from service.spec import parse_spec

    for path in sorted(sweeps.rglob("*.yaml")):
        text = path.read_text()
        if (yaml.safe_load(text) or {}).get("name") == name:
            try:
                return parse_spec(text)
            except SpecError as exc:
                raise ValueError(f"{path} is not a valid sweep: {'; '.join(exc.errors)}") from None
    raise ValueError(f"no sweep YAML named {name!r} under {sweeps}; give its folder with --sweeps")


@claims_app.command("rejudge")
def rejudge_files(
    files: Annotated[list[Path], typer.Argument(help="Claims files (format 1 or 2), rewritten in place.")],
    sweeps: Annotated[Path, typer.Option(help="Where the sweeps' YAML files are (their claims' bands).")] = Path(
        "sweeps"
    ),
) -> None:
    """Judge kept claims files again under today's rule, from the values they store (no rerun): the band,
    unit and replicates of each claim from its sweep YAML, the baselines from its task. A baseline a file did
    not store makes a verdict that would rest on it `inconclusive`: rerun that sweep."""
    import json

    from jobs.registry import get_task
    from service.spec import pooled_settings

    for path in files:
        try:
            doc = read_claims(path.read_bytes(), source=str(path), formats=(1, 2))
            spec = spec_of(doc["sweep"]["name"], sweeps)
            claims = [c.model_dump(mode="json") for c in spec.claims]
            pooled = {
                c.id: sorted({*pooled_settings(spec, c.where, c.replicates),
                              *(pooled_settings(spec, c.versus, c.replicates) if c.versus else [])})
                for c in spec.claims
            }  # fmt: skip
            new = rejudge(doc, claims, get_task(spec.task).baselines, pooled)
        except (OSError, ValueError) as exc:
            raise _fail(str(exc)) from None
        path.write_text(json.dumps(new, indent=2, allow_nan=False) + "\n")
        verdicts = ", ".join(f"{c['id']} {c['verdict']}" for c in new["claims"])
        out.print(f"{path}: {verdicts}", highlight=False)
