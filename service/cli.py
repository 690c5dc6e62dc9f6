"""`layerlab`: operator and researcher commands (Typer + rich)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console, RenderableType
from rich.markup import escape
from rich.table import Table

from service import cli_views as views
from service.cli_claims import claims_app
from service.cli_webhooks import webhooks_app
from service.client import ApiError, Client
from service.errors import SpecError
from service.schemas import SweepPublic
from service.settings import Settings, get_settings
from service.states import TERMINAL

if TYPE_CHECKING:  # the CLI imports SQLAlchemy only for the commands that need it
    from service.tokens import TokenStore

app = typer.Typer(help="layerlab: sweeps of new neural-network primitives on Ray Tune, tracked in MLflow.")
token_app = typer.Typer(help="API tokens (operators; talks to the queue database directly).")
app.add_typer(token_app, name="token")
app.add_typer(claims_app, name="claims")
app.add_typer(webhooks_app, name="webhooks")

# Environment variables the commands read beyond Settings' LAYERLAB_* fields (checked by tests/infra).
ENV_VARS = (
    "RAY_ADDRESS",
    "LAYERLAB_TUNE_STORAGE",
    "MLFLOW_TRACKING_USERNAME",
    "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_S3_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_DEFAULT_REGION",
)
log = logging.getLogger(__name__)
out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


def _setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _fail(message: str, code: int = 1) -> typer.Exit:
    err.print(f"[red]error:[/red] {escape(message)}", highlight=False)
    return typer.Exit(code)


def _api(method: str, path: str, **kwargs: Any) -> Any:
    """The API's answer through the Python client (layerlab.Client: the one HTTP layer, reads retried); an
    error it answers ends the command with its message (a rejected spec: its problems one per line)."""
    try:
        return _client().request(method, path, **kwargs)
    except ApiError as exc:
        raise _api_failure(exc) from None


def _client() -> Client:
    settings = get_settings()
    return Client(settings.api_url, settings.resolved_api_token() or "")


def _api_failure(exc: ApiError) -> typer.Exit:
    if exc.status == 422 and exc.errors:
        for e in exc.errors:
            err.print(f"  {e}", highlight=False, markup=False)
        return _fail("the sweep spec is invalid; fix the fields above", 2)
    return _fail(exc.message)


# --- researcher commands --------------------------------------------------------------------


@app.command()
def validate(file: Annotated[Path, typer.Argument(help="Sweep YAML file.")]) -> None:
    """Check a sweep spec and print every error at once (exit 2 if any)."""
    spec, packed = _checked_locally(file)
    code = f", code {spec.code} ({len(packed.files)} files, sha256 {packed.sha256[:12]})" if packed else ""
    out.print(
        f"{file}: ok — task {spec.task}, {spec.trials_total} trial(s), metric {spec.metric.name} ({spec.metric.mode})"
        f"{code}"
    )


def _checked_locally(file: Path) -> tuple[Any, Any]:
    """The spec checked here (and the packed code of a spec that brings some); exit 2 listing every error."""
    from service.cli_code import check_local

    if not file.is_file():
        raise _fail(f"{file}: no such file", 2)
    try:
        return check_local(file)
    except SpecError as exc:
        err.print(f"{file}: {len(exc.errors)} error(s)", highlight=False, markup=False)
        for e in exc.errors:
            err.print(f"  {e}", highlight=False, markup=False)
        raise typer.Exit(2) from None


@app.command()
def submit(
    file: Annotated[Path, typer.Argument(help="Sweep YAML file.")],
    wait: Annotated[bool, typer.Option("--wait", help="Show progress until the sweep ends.")] = False,
) -> None:
    """Submit a sweep; prints its id. A spec that brings `code` is checked here against that code, which is
    packed and uploaded first (stored once per content)."""
    if not file.is_file():
        raise _fail(f"{file}: no such file", 2)
    body = _api(
        "POST",
        "/sweeps",
        content=file.read_bytes(),
        headers={"content-type": "application/yaml"},
        params=_upload_code(file),
    )
    _submitted(body, f"{body['trials']['total']} trials", wait)


def _upload_code(file: Path) -> dict[str, str] | None:
    """For a spec that brings `code`: check it here against that code, upload the packed folder (the API keeps
    one copy per content) and return the query that names it; None for a built-in task (the API checks it)."""
    from service.cli_code import brings_code

    if not brings_code(file):
        return None
    _, packed = _checked_locally(file)
    stored = _api("POST", "/code", content=packed.data, headers={"content-type": "application/gzip"})
    again = "uploaded" if stored["new"] else "already stored, nothing uploaded"
    out.print(f"code: {len(packed.files)} files, sha256 {stored['sha256'][:12]} ({again})")
    return {"code_sha256": stored["sha256"]}


def _submitted(body: dict[str, Any], what: str, wait: bool) -> None:
    """Say which sweep was queued (warning if no live worker can run it); with `wait`, watch it end."""
    out.print(f"submitted sweep [bold]{body['id']}[/bold] ({body['name']}, {what})")
    warning = views.submit_warning(body)
    if warning:
        err.print(warning, markup=False, highlight=False)
    if wait:
        watch(body["id"])


@app.command("list")
def list_sweeps(
    state: Annotated[str | None, typer.Option(help="queued|running|succeeded|failed|cancelled")] = None,
) -> None:
    """List sweeps, newest first."""
    body = _api("GET", "/sweeps", params={"state": state} if state else None)
    table = Table("id", "name", "task", "owner", "state", "prio", "trials", "best")
    for s in body["sweeps"]:
        t = s["trials"]
        best = "" if s["best_metric"] is None else f"{s['metric']['name']}={s['best_metric']:.4g}"
        owner = s.get("owner") or "-"
        if s.get("waiting"):  # fair share: among equal priorities, the owner with the fewest running goes first
            owner += f" ({s['waiting'].get('owner_running', 0)} running)"
        table.add_row(
            str(s["id"]), s["name"], views.task_label(s), owner, s["state"], str(s["priority"]),
            f"{t['finished']}/{t['total']}", best,
        )  # fmt: skip
    out.print(table)


@app.command()
def show(
    sweep_id: int,
    as_json: Annotated[bool, typer.Option("--json", help="The API's JSON (GET /sweeps/{id}), for scripts.")] = False,
    every: Annotated[bool, typer.Option("--all", help="Every trial, not only the best 20 by the metric.")] = False,
) -> None:
    """One sweep: state, attempts, best so far, MLflow link, registered model, and its best 20 trials."""
    sweep = _api("GET", f"/sweeps/{sweep_id}")
    if as_json:
        out.print_json(json.dumps(sweep))
        return
    _print_wide(views.show_view(sweep, _api("GET", f"/sweeps/{sweep_id}/trials"), every))


def _print_wide(renderable: RenderableType) -> None:
    """Tables whole when the output is a file or a pipe (no width there): rich would squeeze them into 80
    columns and cut names and params short."""
    (out if out.is_terminal else Console(width=views.WIDE, soft_wrap=True)).print(renderable)


@app.command()
def compare(sweep_ids: Annotated[list[int], typer.Argument(help="Two or more sweep ids.")]) -> None:
    """Sweeps side by side: task, state, metric, best value and config, trials, each one's top 3 trials."""
    if len(sweep_ids) < 2:
        raise _fail(f"compare needs two or more sweep ids, got {len(sweep_ids)}: `layerlab compare 3 5`", 2)
    pairs = [(_api("GET", f"/sweeps/{i}"), _api("GET", f"/sweeps/{i}/trials")) for i in sweep_ids]
    _print_wide(views.compare_view(pairs))


@app.command()
def logs(
    sweep_id: int,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new lines until the sweep ends.")
    ] = False,
    tail: Annotated[int | None, typer.Option(min=1, help="Only the last N lines so far.")] = None,
) -> None:
    """The worker's log of a sweep, from <LAYERLAB_HOME>/logs/sweeps/sweep-ID.log on this machine."""
    path = views.sweep_log_path(get_settings().home_abs, sweep_id)
    if not path.is_file():
        sweep = _api("GET", f"/sweeps/{sweep_id}")  # a 404 says the sweep does not exist
        if not (follow and sweep["state"] == "queued"):
            raise _fail(views.missing_log_message(path, sweep))
        err.print(f"sweep {sweep_id} is queued; waiting for a worker to start it (log: {path})", markup=False)
        while not path.is_file():
            sweep = _api("GET", f"/sweeps/{sweep_id}", params={"wait": 2})
            if sweep["state"] != "queued" and not path.is_file():
                time.sleep(5)  # the worker opens the log as it starts the sweep: give it a moment
                if not path.is_file():
                    raise _fail(views.missing_log_message(path, sweep))
    with path.open(errors="replace") as f:
        sys.stdout.write(views.read_log(f, tail))
        sys.stdout.flush()
        if not follow:
            return

        def write(chunk: str) -> None:
            sys.stdout.write(chunk)
            sys.stdout.flush()

        def ended() -> bool:
            return _api("GET", f"/sweeps/{sweep_id}")["state"] in TERMINAL

        try:
            views.follow(f, write, ended, time.sleep)
        except KeyboardInterrupt:
            pass


@app.command()
def watch(
    sweep_id: int,
    interval: Annotated[float, typer.Option(min=0.1, max=60, help="Seconds between progress updates.")] = 1.0,
) -> None:
    """A live progress bar until the sweep ends: trials finished/total, best metric so far. When the output
    is not a terminal (a log file, a CI job), a plain line each time the state changes or a trial ends."""
    shown: list[Any] = [None]

    def line(s: SweepPublic) -> None:
        body = s.model_dump(mode="json")
        if views.watch_key(body) != shown[0]:
            shown[0] = views.watch_key(body)
            out.print(views.watch_line(body), highlight=False, markup=False)

    try:
        ended = _client().wait(sweep_id, interval=interval, progress=out.is_terminal,
                              callback=None if out.is_terminal else line)  # fmt: skip
    except ApiError as exc:
        raise _api_failure(exc) from None
    s = ended.model_dump(mode="json")
    _print_outcome(s)
    if s["state"] != "succeeded":
        raise typer.Exit(1)


def _print_outcome(s: dict[str, Any]) -> None:
    colour = {"succeeded": "green", "failed": "red", "cancelled": "yellow"}.get(s["state"], "white")
    out.print(f"sweep {s['id']} [{colour}]{s['state']}[/{colour}]" + (f": {s['reason']}" if s["reason"] else ""))
    if s["best_metric"] is not None:
        out.print(f"best {s['metric']['name']} = {s['best_metric']:.6g} (trial {s['best_trial_id']})")
        out.print(f"best config: {json.dumps(s['best_config'], sort_keys=True)}", highlight=False, markup=False)
    if s["mlflow"]["parent_run_url"]:
        out.print(f"MLflow run:  {s['mlflow']['parent_run_url']}", highlight=False, markup=False)
    if s["model"]["uri"]:
        out.print(f"registered:  {s['model']['uri']} (version {s['model']['version']})", highlight=False, markup=False)


@app.command()
def cancel(sweep_id: int) -> None:
    """Cancel a sweep: running trials stop within seconds, finished ones are kept."""
    s = _api("POST", f"/sweeps/{sweep_id}/cancel")
    out.print(f"sweep {sweep_id}: {'cancel requested' if s['state'] == 'running' else s['state']}")


@app.command()
def rerun(
    sweep_id: int,
    wait: Annotated[bool, typer.Option("--wait", help="Show progress until the new sweep ends.")] = False,
) -> None:
    """Submit a new sweep with the same spec as sweep ID, owned by you; `show` and `compare` name the code
    each ran."""
    _submitted(_api("POST", f"/sweeps/{sweep_id}/rerun"), f"rerun of sweep {sweep_id}", wait)


@app.command()
def resume(sweep_id: int) -> None:
    """Put a failed or cancelled sweep back in the queue: it continues where it stopped (finished trials kept)."""
    s = _api("POST", f"/sweeps/{sweep_id}/resume")
    out.print(f"sweep {sweep_id}: {s['state']} again, {s['max_attempts'] - s['attempts']} attempts left")


@app.command()
def extend(
    sweep_id: int,
    samples: Annotated[int, typer.Option("--samples", min=1, max=10_000, help="How many trials to add.")],
    wait: Annotated[bool, typer.Option("--wait", help="Show the progress bar until it ends.")] = False,
) -> None:
    """Add trials to a succeeded or failed sweep of random or optuna search (the searcher sees every earlier
    trial; summary and claims are rebuilt over all of them)."""
    s = _api("POST", f"/sweeps/{sweep_id}/extend", params={"samples": samples})
    out.print(f"sweep {sweep_id}: {s['state']} again, {samples} more trials ({s['trials']['total']} in all)")
    if wait:
        watch(sweep_id)


@app.command()
def pull(
    model: Annotated[str, typer.Argument(help="NAME, NAME@ALIAS or NAME/VERSION from the Model Registry.")],
    dest: Annotated[Path, typer.Argument(help="Folder to download the model into.")],
) -> None:
    """Download a registered model (load it with mlflow.pytorch.load_model(DEST))."""
    import mlflow

    uri = f"models:/{model}" if ("@" in model or "/" in model) else f"models:/{model}/latest"
    dest.mkdir(parents=True, exist_ok=True)
    # models:/ URIs resolve through the registry URI, which does not follow a tracking_uri argument.
    mlflow.set_tracking_uri(get_settings().tracking_uri)
    mlflow.set_registry_uri(get_settings().tracking_uri)
    if not (sys.stdout.isatty() and sys.stderr.isatty()):
        # MLflow's download bars (tqdm, on stderr) would fill a log or a CI job with carriage returns. MLflow
        # reads this variable at each download (mlflow/utils/file_utils.py); set it to true to keep the bars.
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    # MLflow servers with S3 artifacts advertise presigned downloads, whose URLs name the S3 endpoint the
    # server sees (http://minio:9000 in infra/docker-compose.yml), which a researcher's machine cannot reach:
    # each file then waits out its retries. Download through the server, as uploads go.
    os.environ.setdefault("MLFLOW_ENABLE_PROXY_MULTIPART_DOWNLOAD", "false")
    try:
        path = mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(dest))
    except Exception as exc:
        raise _fail(f"cannot download {uri}: {exc}") from None
    out.print(
        f"downloaded {uri} to {path}\nload it with: mlflow.pytorch.load_model({str(path)!r})",
        highlight=False,
        markup=False,
    )


# --- operator commands ----------------------------------------------------------------------


@app.command()
def serve(
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    port: Annotated[int, typer.Option()] = 8000,
    workers: Annotated[
        int | None, typer.Option(min=1, max=64, help="Processes; LAYERLAB_API_WORKERS (1) when unset.")
    ] = None,
) -> None:
    """Run the HTTP API (OpenAPI docs at /docs)."""
    import uvicorn

    from service.app import create_served_app

    _setup_logging()
    workers = workers or get_settings().api_workers
    if workers == 1:
        uvicorn.run(create_served_app(), host=host, port=port, log_level="info")
    else:  # uvicorn starts each process from the import path; each builds its own app (and pool)
        uvicorn.run(
            "service.app:create_served_app", factory=True, workers=workers, host=host, port=port, log_level="info"
        )


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
    add_help_option=False,
)
def worker(ctx: typer.Context) -> None:
    """Claim sweeps and run them on Ray (local Ray unless RAY_ADDRESS is set): `python -m workers`, with the
    same options (--once, --exit-when-idle, --worker-id ID, --supervise; `layerlab worker --help` lists them).
    The process becomes the worker (exec: the same pid), so the service never imports the workers."""
    os.execv(sys.executable, [sys.executable, "-m", "workers", *ctx.args])


@app.command()
def migrate() -> None:
    """Create or upgrade the queue database's tables (Alembic) at LAYERLAB_DATABASE_URL."""
    from service.queue import QueueStore

    settings = get_settings()
    QueueStore(settings.queue_url)
    out.print(f"queue schema is up to date ({_safe_url(settings.queue_url)})")


def _safe_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


@app.command("mlflow-server")
def mlflow_server(
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    port: Annotated[int, typer.Option()] = 5000,
    workers: Annotated[int, typer.Option(help="uvicorn workers of the MLflow server.")] = 2,
) -> None:
    """Run the production MLflow server: PostgreSQL backend, S3 artifacts, basic auth (admin password from
    LAYERLAB_MLFLOW_ADMIN_PASSWORD_FILE). The embedded `layerlab up` runs a local one without auth instead."""
    from service.mlflow_server import ServerConfigError, exec_server

    try:
        exec_server(get_settings(), host, port, workers)
    except ServerConfigError as exc:
        raise _fail(str(exc), 2) from None


def _tokens() -> TokenStore:
    """Operators' token commands talk to the queue database directly."""
    from service.queue import QueueStore
    from service.tokens import TokenStore

    return TokenStore(QueueStore(get_settings().queue_url))


@token_app.command("create")
def token_create(
    user: Annotated[str, typer.Option(help="Who the token acts as; sweeps it submits belong to them.")],
    admin: Annotated[bool, typer.Option("--admin", help="May cancel anyone's sweeps.")] = False,
) -> None:
    """Create a token and print it once (only its hash is stored)."""
    try:
        token_id, token = _tokens().create(user, admin=admin)
    except ValueError as exc:
        raise _fail(str(exc), 2) from None
    err.print(f"token {token_id} for {user}{' (admin)' if admin else ''}; it is shown only now:", markup=False)
    print(token)


@token_app.command("revoke")
def token_revoke(token_id: Annotated[int, typer.Argument(help="The id from `layerlab token list`.")]) -> None:
    """Revoke a token: requests with it get 401 from now on."""
    try:
        info = _tokens().revoke(token_id)
    except KeyError as exc:
        raise _fail(str(exc.args[0])) from None
    out.print(f"revoked token {info.id} of {info.user}", markup=False)


@token_app.command("list")
def token_list() -> None:
    """List tokens (id, user, prefix, admin, created, revoked); never the tokens themselves."""
    table = Table("id", "user", "prefix", "admin", "created", "revoked")
    for t in _tokens().list():
        flags = ("yes" if t.admin else "", t.created_at, "yes" if t.revoked else "")
        table.add_row(str(t.id), t.user, t.prefix + "…", *flags)
    out.print(table)


def _local_token(settings: Settings) -> None:
    """The embedded stack's user gets an admin token in <home>/api-token (mode 0600), once."""
    import getpass

    from service.queue import QueueStore
    from service.tokens import TokenStore

    if settings.resolved_api_token():
        return
    _, token = TokenStore(QueueStore(settings.queue_url)).create(getpass.getuser() or "local", admin=True)
    settings.token_file.touch(mode=0o600)
    settings.token_file.write_text(token + "\n")


@app.command()
def up(
    detach: Annotated[bool, typer.Option("--detach", help="Start in the background and return.")] = False,
    api_port: Annotated[int, typer.Option()] = 8000,
    mlflow_port: Annotated[int, typer.Option()] = 5000,
    keeper: Annotated[bool, typer.Option("--keeper", hidden=True, help="Be the background keeper.")] = False,
) -> None:
    """Start the embedded stack: MLflow UI, the API, a Ray head and a supervised worker (logs in .layerlab/logs).
    A part that stops is started again; on a stack with stopped parts, `up` starts only those."""
    from service.embedded_stack import Keeper, StackState, state_file

    settings = get_settings()
    home = settings.home_abs
    (home / "logs").mkdir(parents=True, exist_ok=True)
    settings.artifact_root.mkdir(parents=True, exist_ok=True)
    state = StackState.read(state_file(settings))
    if state is not None and state.alive()["keeper"] and not keeper:
        out.print(views.stack_table(state, time.time()))
        out.print(f"the stack is up; its keeper (pid {state.keeper}) starts any part that stops (`layerlab down`)")
        return
    _local_token(settings)
    if detach and not keeper:
        _up_in_background(settings, api_port, mlflow_port)
        return
    _setup_logging()
    kept = Keeper(settings, api_port, mlflow_port)
    signal.signal(signal.SIGTERM, kept.stop)
    signal.signal(signal.SIGINT, kept.stop)
    try:
        started = kept.start_missing()
        kept.wait_ready()
    except (OSError, RuntimeError) as exc:
        from service.embedded_stack import stop_stack

        stop_stack(settings)
        if keeper:  # the parent, waiting on up.json, reports it from the keeper's log
            log.error("%s", exc)
            raise typer.Exit(1) from None
        raise _fail(str(exc)) from None
    log.info("started %s; keeping %s", ", ".join(started) or "nothing (all running)", ", ".join(kept.parts()))
    if not keeper:
        _print_up(settings, kept.state)
        out.print("Ctrl-C stops everything.")
    kept.keep()
    if not keeper:  # Ctrl-C in the foreground: the stack goes with it
        down()


def _print_up(settings: Settings, state: Any) -> None:
    ports = state.ports
    out.print(
        f"layerlab is up: API http://127.0.0.1:{ports['api']} (docs at /docs), "
        f"MLflow UI http://127.0.0.1:{ports['mlflow']}, logs in {settings.home_abs / 'logs'}"
    )


def _up_in_background(settings: Settings, api_port: int, mlflow_port: int) -> None:
    """Start the keeper in a session of its own and wait until it says the stack is ready."""
    from service.embedded_stack import READY_TIMEOUT_S, StackState, state_file

    logs = settings.home_abs / "logs"
    command = [sys.executable, "-m", "service.cli", "up", "--keeper", "--api-port", str(api_port)]
    command += ["--mlflow-port", str(mlflow_port)]
    log_file = open(logs / "keeper.log", "ab")  # noqa: SIM115 - owned by the child
    proc = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + READY_TIMEOUT_S + 60
    while time.monotonic() < deadline:
        state = StackState.read(state_file(settings))
        if state is not None and state.keeper == proc.pid and state.ready:
            _print_up(settings, state)
            return
        if proc.poll() is not None:
            tail = (logs / "keeper.log").read_text(errors="replace").strip().splitlines()[-3:]
            raise _fail(f"the stack did not start: {' / '.join(tail)} (all of it in {logs / 'keeper.log'})")
        time.sleep(0.3)
    raise _fail(f"the stack was not ready within {READY_TIMEOUT_S + 60:.0f}s; see {logs}")


@app.command()
def down() -> None:
    """Stop the stack started by `layerlab up` (its keeper first, so that nothing starts again)."""
    from service.embedded_stack import stop_stack

    out.print("stopped" if stop_stack(get_settings()) else "nothing to stop")


@app.command()
def status() -> None:
    """Each part of the embedded stack: alive or not, pid, port, since when, restarts. Exit code 1 when a
    part is not running."""
    from service.embedded_stack import StackState, state_file

    state = StackState.read(state_file(get_settings()))
    if state is None:
        raise _fail("the embedded stack is not running (no up.json); start it with `layerlab up --detach`")
    out.print(views.stack_table(state, time.time()))
    dead = [name for name, alive in state.alive().items() if not alive]
    if dead:
        raise _fail(f"not running: {', '.join(dead)}; `layerlab up --detach` starts what is missing")


if __name__ == "__main__":
    app()
