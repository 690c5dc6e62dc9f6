"""How `layerlab show`, `compare`, `watch` and `logs` lay out what the API answers.

Pure functions from the JSON bodies of GET /sweeps/{id} and GET /sweeps/{id}/trials to rich
renderables and plain lines, so that service/cli.py keeps only the commands and the tests check the
layout without a server.
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Callable, Iterable
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

Body = dict[str, Any]
WIDE = 1000
"""Width to lay tables out in when the output is not a terminal: a file or a pipe gets whole rows (rich would
squeeze them into 80 columns, cutting names and params short); tables are only as wide as their content."""
TOP = 3
"""Trials per sweep that `layerlab compare` lists."""
# The API's trial counts say finished/errored for Tune's terminated/error (service/schemas.py).
TRIAL_STATES = {"terminated": "finished", "error": "errored"}


def fmt(value: Any) -> str:
    """A config or metric value in a cell: floats to 4 significant digits, lists and dicts as JSON."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int | str):
        return str(value)
    return json.dumps(value, sort_keys=True)


def metric_of(trial: Body, name: str) -> float | None:
    """The trial's latest value of the metric (None before its first report)."""
    value = (trial.get("metrics") or {}).get(name)
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def ranked(trials: Body) -> list[Body]:
    """The trials that reported the sweep's metric, best first (by their latest value)."""
    name, mode = trials["metric"]["name"], trials["metric"]["mode"]
    scored = [t for t in trials["trials"] if metric_of(t, name) is not None]
    return sorted(scored, key=lambda t: metric_of(t, name) or 0.0, reverse=mode == "max")


def params(config: Body | None, keys: Iterable[str]) -> str:
    """`key=value ...` for the searched keys; every key when the sweep searches none."""
    if not config:
        return "-"
    keys = list(keys) or sorted(config)
    return " ".join(f"{k}={fmt(config.get(k))}" for k in keys)


def _duration(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _ts(at: str) -> str:
    """An API date-time (RFC 3339, UTC) to the second: `2026-03-01 14:05:09 UTC`."""
    return datetime.fromisoformat(at).strftime("%Y-%m-%d %H:%M:%S UTC")


def _when(sweep: Body) -> str:
    started, finished = sweep.get("started_at"), sweep.get("finished_at")
    text = f"submitted {_ts(sweep['submitted_at'])}"
    if started:
        text += f", started {_ts(started)}"
    if started and finished:
        took = datetime.fromisoformat(finished) - datetime.fromisoformat(started)
        text += f", took {_duration(took.total_seconds())}"
    return text


def counts_line(sweep: Body) -> str:
    t = sweep["trials"]
    return (
        f"{t['finished']}/{t['total']} finished, {t['running']} running, {t['errored']} errored, {t['pending']} pending"
    )


def best_line(sweep: Body) -> str:
    if sweep["best_metric"] is None:
        return "-"
    return f"{sweep['metric']['name']} = {sweep['best_metric']:.6g} (trial {sweep['best_trial_id']})"


def task_label(sweep: Body) -> str:
    """A built-in task's name; a brought Task's own name with its module:attribute beside it once a worker has
    imported it (`mine.lowrank (my_layer:TASK)`), the module:attribute alone before."""
    name = sweep.get("task_name")
    return f"{name} ({sweep['task']})" if name and name != sweep["task"] else sweep["task"]


def summary(sweep: Body, trials: Body) -> Text:
    """The sweep at a glance: one `field  value` line each (plain text: no markup read from names or configs)."""
    reason = f": {sweep['reason']}" if sweep["reason"] else ""
    metric = sweep["metric"]
    model = sweep["model"]
    rows = [
        ("sweep", f"{sweep['id']}  {sweep['name']} (task {task_label(sweep)}, owner {sweep['owner'] or '-'})"),
        ("state", f"{sweep['state']}{reason}"),
        *([("waiting", sweep["waiting"]["message"])] if sweep.get("waiting") else []),
        ("attempts", f"{sweep['attempts']} of {sweep['max_attempts']}" + _worker(sweep)),
        ("when", _when(sweep)),
        ("trials", counts_line(sweep)),
        ("metric", f"{metric['name']} ({metric['mode']})"),
        ("best", best_line(sweep)),
        ("best config", params(sweep["best_config"], trials["space"])),
        ("MLflow", sweep["mlflow"]["parent_run_url"] or sweep["mlflow"]["experiment_url"] or "-"),
        ("model", f"{model['uri']} (version {model['version']})" if model["uri"] else "-"),
        ("code", code_line(sweep)),
        *([("rerun of", f"sweep {sweep['rerun_of']}")] if sweep.get("rerun_of") else []),
        *([("importance", importance_line(sweep["importances"]))] if sweep.get("importances") else []),
    ]
    text = Text()
    for i, (field, value) in enumerate(rows):
        text.append(("\n" if i else "") + f"{field:<13}", style="bold")
        text.append(value)
    return text


def importance_line(importances: dict[str, float]) -> str:
    """`lr 0.81, width 0.12, seed 0.07`: each searched parameter's share of the final metric's variance
    (fANOVA over the finished trials), largest first."""
    ranked = sorted(importances.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{name} {share:.2f}" for name, share in ranked) + " (share of variance, fANOVA)"


def code_line(sweep: Body) -> str:
    """The code the sweep's latest attempt ran: "layerlab 0.1.0, commit 3195a6a6 (modified)", and the code it
    brought (spec `code`): "; brought code 5f2c0e9a1b3d"."""
    brought = f"; brought code {sweep['code_sha256'][:12]}" if sweep.get("code_sha256") else ""
    code = sweep.get("code")
    if not code:
        return f"- (no worker has started it){brought}"
    line = f"layerlab {code.get('layerlab.version', '?')}"
    if code.get("layerlab.git_commit"):
        modified = " (modified)" if code.get("layerlab.git_modified") == "true" else ""
        line += f", commit {code['layerlab.git_commit'][:12]}{modified}"
    return line + brought


def different_code(sweeps: list[Body]) -> str | None:
    """`layerlab compare`'s note when the sweeps ran different code (or code that cannot be told apart: a
    modified checkout), None when every one ran the same known code."""
    started = [s for s in sweeps if s.get("code")]
    lines = {code_line(s) for s in started}
    modified = [s["id"] for s in started if s["code"].get("layerlab.git_modified") == "true"]
    if len(lines) > 1:
        return "note: these sweeps ran different code (see the `code` row): their numbers may differ for that reason"
    if modified:
        ids = ", ".join(map(str, modified))
        return f"note: sweep(s) {ids} ran from a modified checkout: the same commit need not mean the same code"
    return None


def submit_warning(sweep: Body) -> str | None:
    """`layerlab submit`'s warning when no live worker can run the sweep (it is queued all the same)."""
    waiting = sweep.get("waiting")
    if not waiting or waiting["workers_able"]:
        return None
    return (
        f"warning: no live worker can run sweep {sweep['id']} now; it stays queued until one can. "
        f"It is {waiting['message']}"
    )


def _worker(sweep: Body) -> str:
    return f", worker {sweep['worker_id']}" if sweep.get("worker_id") else ""


SHOWN = 20
"""Trials `layerlab show` lists by default: the best by the sweep's metric (`--all`: every one)."""


def shown_trials(trials: Body, every: bool) -> list[Body]:
    """The trials `show` lists: every one in the API's order with `every`, or when there are at most SHOWN;
    else the SHOWN best by the metric, then, if fewer reported it, the running ones in the API's order."""
    rows: list[Body] = trials["trials"]
    if every or len(rows) <= SHOWN:
        return rows
    best = ranked(trials)[:SHOWN]
    return best + [t for t in rows if t not in best and t["state"] == "running"][: SHOWN - len(best)]


def trial_table(sweep: Body, trials: Body, every: bool = False) -> Table:
    """One row per trial (the best SHOWN unless `every`): id, state, the searched params, the metric's latest
    value, iteration, starts."""
    name = trials["metric"]["name"]
    table = Table("trial", "state", *trials["space"], name, "iter", "starts")
    rows = shown_trials(trials, every)
    for t in rows:
        best = " *" if t["trial_id"] == sweep["best_trial_id"] else ""
        cells = [fmt(t["config"].get(k)) for k in trials["space"]]
        table.add_row(
            Text(t["trial_id"] + best),
            TRIAL_STATES.get(t["state"], t["state"]),
            *map(Text, cells),
            fmt(metric_of(t, name)),
            str(t["iteration"]),
            str(t["starts"]),
        )
    notes = []
    if sweep["best_trial_id"]:
        notes.append(f"* the best {name} so far; the column shows each trial's latest value")
    if len(rows) < len(trials["trials"]):
        notes.append(f"the best {len(rows)} of {len(trials['trials'])} trials by {name}; `--all` lists every one")
    table.caption = "\n".join(notes) or None
    return table


def show_view(sweep: Body, trials: Body, every: bool = False) -> RenderableType:
    if not trials["trials"]:
        return Group(summary(sweep, trials), Text("\nno trial has started yet"))
    return Group(summary(sweep, trials), trial_table(sweep, trials, every))


def compare_view(pairs: list[tuple[Body, Body]]) -> Table:
    """Sweeps side by side, one column each: what they ran, how far they got, the best and the top trials."""
    table = Table("", *(f"sweep {s['id']}" for s, _ in pairs))
    rows: list[tuple[str, list[str]]] = [
        ("name", [s["name"] for s, _ in pairs]),
        ("task", [task_label(s) for s, _ in pairs]),
        ("state", [s["state"] + (f": {s['reason']}" if s["reason"] else "") for s, _ in pairs]),
        ("metric", [f"{s['metric']['name']} ({s['metric']['mode']})" for s, _ in pairs]),
        ("best", [fmt(s["best_metric"]) for s, _ in pairs]),
        ("best config", [params(s["best_config"], t["space"]) for s, t in pairs]),
        ("trials", [f"{s['trials']['finished']}/{s['trials']['total']} finished" + _errored(s) for s, _ in pairs]),
        ("code", [code_line(s) for s, _ in pairs]),
    ]
    for i in range(TOP):
        rows.append((f"top {i + 1}", [_top(t, i) for _, t in pairs]))
    for field, values in rows:
        table.add_row(field, *map(Text, values))
    table.caption = different_code([s for s, _ in pairs])
    return table


def _errored(sweep: Body) -> str:
    n = sweep["trials"]["errored"]
    return f", {n} errored" if n else ""


def _top(trials: Body, i: int) -> str:
    best = ranked(trials)
    if i >= len(best):
        return "-"
    t = best[i]
    value = fmt(metric_of(t, trials["metric"]["name"]))
    return f"{value}  {t['trial_id']}\n{params(t['config'], trials['space'])}"


def watch_line(sweep: Body) -> str:
    """`layerlab watch`'s line when its output is not a terminal (a log, a CI job): no live bar."""
    best = "-" if sweep["best_metric"] is None else f"{sweep['metric']['name']}={sweep['best_metric']:.4g}"
    return f"sweep {sweep['id']} {sweep['state']}: {counts_line(sweep)}; best {best}"


def watch_key(sweep: Body) -> tuple[Any, ...]:
    """A new plain line is printed when this changes: the sweep's state, or a trial ending."""
    t = sweep["trials"]
    return sweep["state"], t["finished"], t["errored"]


# --- logs -------------------------------------------------------------------------------------


def sweep_log_path(home: Path, sweep_id: int) -> Path:
    """Where a worker writes the log of the sweep it runs: <LAYERLAB_HOME>/logs/sweeps/sweep-<ID>.log."""
    return home / "logs" / "sweeps" / f"sweep-{sweep_id}.log"


def missing_log_message(path: Path, sweep: Body) -> str:
    """Why there is no log file here for the sweep, and where to look instead."""
    sid = sweep["id"]
    if sweep["state"] == "queued" and not sweep["attempts"]:
        return (
            f"no log for sweep {sid} at {path} yet: it is queued and no worker has started it; "
            f"`layerlab logs {sid} --follow` waits for it (is a worker running? `layerlab up` starts one)"
        )
    who = f"worker {sweep['worker_id']}" if sweep.get("worker_id") else "a worker"
    return (
        f"no log for sweep {sid} at {path}: sweep {sid} is {sweep['state']} and {who} ran it, which writes "
        "the log under its own LAYERLAB_HOME. If that worker runs on another machine or in a container, read "
        f"logs/sweeps/sweep-{sid}.log there or that worker's own output (`docker compose logs worker`, "
        "`kubectl logs POD`); if it runs here with another LAYERLAB_HOME, set LAYERLAB_HOME to that folder"
    )


def read_log(f: IO[str], tail: int | None) -> str:
    """The log so far; only its last `tail` lines when given."""
    if tail is None:
        return f.read()
    return "".join(deque(f, maxlen=tail))


def follow(
    f: IO[str],
    write: Callable[[str], None],
    ended: Callable[[], bool],
    sleep: Callable[[float], None],
    poll: float = 0.5,
    check_every: int = 4,
) -> None:
    """Write what is appended to `f` until `ended()` says the sweep is over (asked every `check_every`
    quiet polls), then what the worker wrote last."""
    quiet = 0
    while True:
        chunk = f.read()
        if chunk:
            write(chunk)
            quiet = 0
            continue
        quiet += 1
        if quiet % check_every == 0 and ended():
            sleep(poll)  # the worker's last lines about the end come just after it
            write(f.read())
            return
        sleep(poll)


def _age(seconds: float) -> str:
    seconds = max(int(seconds), 0)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def stack_table(state: Any, now: float) -> Table:
    """`layerlab status`: the keeper and each part of the embedded stack (service.embedded_stack.StackState)."""
    alive = state.alive()
    table = Table("part", "state", "pid", "port", "since", "restarts")
    table.add_row("keeper", "alive" if alive["keeper"] else "stopped", fmt(state.keeper), "-", "-", "-")
    for name, part in state.parts.items():
        since = datetime.fromtimestamp(part.since).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
        table.add_row(
            name, "alive" if alive[name] else "stopped", str(part.pid), fmt(part.port),
            f"{since} ({_age(now - part.since)} ago)", str(part.restarts),
        )  # fmt: skip
    return table
