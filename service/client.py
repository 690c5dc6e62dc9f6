"""The Python client of the layerlab API (`from layerlab import Client`): what a notebook or a script needs, and
what `layerlab`'s CLI is built on.

    from layerlab import Client

    client = Client()                                    # LAYERLAB_API_URL / LAYERLAB_API_TOKEN, as the CLI
    sweep = client.submit("sweeps/tversky_xor_demo.yaml")  # a path, YAML text or a dict
    done = client.wait(sweep.id, progress=True)          # or callback=lambda s: print(s.trials.finished)
    print(done.state, done.best_metric, client.best_config(sweep.id))
    model = client.load_model(sweep.id)                  # the registered model, as a torch module

Every HTTP call goes through `Client.request`, the only HTTP code on the client side: reads (GET) are tried
again after a dropped connection, a timeout or a 503 (the API or its database restarting), with backoff; a
write is sent once (the API is not told twice to queue a sweep). An error the API answers is an `ApiError`
whose message says what was wrong and how to fix it, with the spec's problems one per line in `errors`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx

from service.schemas import SweepList, SweepPublic, TrialList, WebhookCreated, WebhookList
from service.settings import get_settings
from service.states import TERMINAL

READ_TIMEOUT = 90.0
"""Outlasts the longest long poll (GET /sweeps/{id}?wait=, 60 s)."""
RETRIES = 4
"""Tries of a read after the first, 1, 2, 4 and 8 s apart."""


class ApiError(Exception):
    """The API said no (status >= 400), or could not be reached (status None)."""

    def __init__(self, message: str, status: int | None = None, errors: list[str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.errors = errors or []
        """A rejected spec's problems, each `field.path: what is wrong, got <value>`."""


class Client:
    def __init__(
        self, url: str | None = None, token: str | None = None, *, retries: int = RETRIES, timeout: float = 30.0
    ) -> None:
        settings = get_settings()
        self.url = (url or settings.api_url).rstrip("/")
        self.token = token if token is not None else settings.resolved_api_token()
        self.retries = retries
        self.timeout = httpx.Timeout(timeout, read=READ_TIMEOUT)

    # --- the one HTTP layer ------------------------------------------------------------------

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """The API's JSON answer to `method path`; ApiError otherwise (see the module docstring)."""
        if self.token:
            kwargs["headers"] = {**kwargs.get("headers", {}), "Authorization": f"Bearer {self.token}"}
        url = self.url + path
        tries = 1 + (self.retries if method == "GET" else 0)
        for attempt in range(tries):
            last = attempt == tries - 1
            try:
                resp = httpx.request(method, url, timeout=self.timeout, **kwargs)
            except httpx.HTTPError as exc:
                if not last:
                    time.sleep(2**attempt)
                    continue
                raise ApiError(
                    f"cannot reach the layerlab API at {url} ({exc}); start it with `layerlab up` "
                    "(or `layerlab serve`), or point LAYERLAB_API_URL at it"
                ) from None
            if resp.status_code == 503 and not last:
                time.sleep(2**attempt)
                continue
            return self._answer(method, path, resp)
        raise AssertionError("unreachable")  # pragma: no cover

    def _answer(self, method: str, path: str, resp: httpx.Response) -> Any:
        if resp.status_code == 204:
            return None
        if resp.status_code < 400:
            return resp.json()
        detail: Any = resp.text
        if "json" in resp.headers.get("content-type", ""):
            detail = resp.json().get("detail")
        if resp.status_code == 422 and isinstance(detail, dict):
            errors = list(detail.get("errors", []))
            if detail.get("message") == "invalid webhook":
                raise ApiError("the webhook was refused; fix what is listed", 422, errors)
            raise ApiError("the sweep spec is invalid; fix the fields listed", 422, errors)
        if resp.status_code == 401 and not self.token:
            raise ApiError(
                f"the API at {self.url} needs a token: set LAYERLAB_API_TOKEN (an operator creates one with "
                "`layerlab token create --user NAME`)",
                401,
            )
        raise ApiError(f"{method} {path} -> {resp.status_code}: {detail}", resp.status_code)

    # --- sweeps ---------------------------------------------------------------------------

    def submit(self, spec: str | Path | Mapping[str, Any], *, code_sha256: str | None = None) -> SweepPublic:
        """Queue a sweep. `spec`: a YAML file's path, YAML text, or the spec as a dict. A spec that brings `code`
        (a folder relative to its file) is checked here against that code, which is packed and uploaded first."""
        if isinstance(spec, Mapping):
            if spec.get("code") is not None:
                raise ApiError("a spec that brings `code` names a folder relative to its file: submit the file's path")
            body, ctype = json.dumps(dict(spec)).encode(), "application/json"
        elif isinstance(spec, Path) or (
            isinstance(spec, str) and "\n" not in spec and spec.endswith((".yaml", ".yml"))
        ):
            path = Path(spec)
            if not path.is_file():
                raise ApiError(f"{path}: no such file")
            if code_sha256 is None:
                code_sha256 = self._upload_code_of(path)
            body, ctype = path.read_bytes(), "application/yaml"
        else:
            body, ctype = spec.encode(), "application/yaml"
        params = {"code_sha256": code_sha256} if code_sha256 else None
        answer = self.request("POST", "/sweeps", content=body, headers={"content-type": ctype}, params=params)
        return SweepPublic.model_validate(answer)

    def _upload_code_of(self, path: Path) -> str | None:
        from service.cli_code import brings_code, check_local
        from service.errors import SpecError

        if not brings_code(path):
            return None
        try:
            _, packed = check_local(path)
        except SpecError as exc:
            raise ApiError("the sweep spec is invalid; fix the fields listed", 422, list(exc.errors)) from None
        assert packed is not None
        return str(self.upload_code(packed.data)["sha256"])

    def upload_code(self, archive: bytes) -> dict[str, Any]:
        """Store a packed code archive (service.code_archive.pack): {"sha256": ..., "new": bool}."""
        return dict(self.request("POST", "/code", content=archive, headers={"content-type": "application/gzip"}))

    def sweep(self, sweep_id: int, *, wait: float | None = None) -> SweepPublic:
        """The sweep now; with `wait` (s, <= 60) the API answers when it ends or after that long."""
        params = {"wait": wait} if wait is not None else None
        return SweepPublic.model_validate(self.request("GET", f"/sweeps/{sweep_id}", params=params))

    def sweeps(self, state: str | None = None) -> list[SweepPublic]:
        body = self.request("GET", "/sweeps", params={"state": state} if state else None)
        return SweepList.model_validate(body).sweeps

    def trials(self, sweep_id: int) -> TrialList:
        return TrialList.model_validate(self.request("GET", f"/sweeps/{sweep_id}/trials"))

    def polls(self, sweep_id: int, interval: float = 1.0) -> Iterator[SweepPublic]:
        """The sweep every `interval` seconds (a long poll: at once when it ends), until and with its end."""
        while True:
            asked = time.monotonic()
            s = self.sweep(sweep_id, wait=interval)
            yield s
            if s.state in TERMINAL:
                return
            time.sleep(max(0.0, interval - (time.monotonic() - asked)))  # an API that answered early

    def wait(
        self,
        sweep_id: int,
        *,
        callback: Callable[[SweepPublic], None] | None = None,
        progress: bool = False,
        interval: float = 1.0,
        timeout: float | None = None,
    ) -> SweepPublic:
        """Block until the sweep ends and return it; `callback(sweep)` after every poll, `progress` draws a bar
        (rich: a terminal or a notebook). TimeoutError after `timeout` seconds, the sweep left running."""
        deadline = None if timeout is None else time.monotonic() + timeout
        bar = _Bar(sweep_id) if progress else None
        try:
            for s in self.polls(sweep_id, interval):
                if callback is not None:
                    callback(s)
                if bar is not None:
                    bar.update(s)
                if s.state in TERMINAL:
                    return s
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"sweep {sweep_id} still {s.state} after {timeout} s")
        finally:
            if bar is not None:
                bar.close()
        raise AssertionError("unreachable")  # pragma: no cover

    def cancel(self, sweep_id: int) -> SweepPublic:
        return SweepPublic.model_validate(self.request("POST", f"/sweeps/{sweep_id}/cancel"))

    def rerun(self, sweep_id: int) -> SweepPublic:
        return SweepPublic.model_validate(self.request("POST", f"/sweeps/{sweep_id}/rerun"))

    def resume(self, sweep_id: int) -> SweepPublic:
        return SweepPublic.model_validate(self.request("POST", f"/sweeps/{sweep_id}/resume"))

    def extend(self, sweep_id: int, samples: int) -> SweepPublic:
        """Queue `samples` more trials of a succeeded or failed random / optuna sweep (README: `layerlab extend`)."""
        answer = self.request("POST", f"/sweeps/{sweep_id}/extend", params={"samples": samples})
        return SweepPublic.model_validate(answer)

    def compare(self, sweep_ids: list[int]) -> list[tuple[SweepPublic, TrialList]]:
        return [(self.sweep(i), self.trials(i)) for i in sweep_ids]

    # --- webhooks (service/webhooks.py: what is sent and how to check its signature) ----------

    def add_webhook(self, url: str, secret: str | None = None) -> WebhookCreated:
        """POST each of your sweeps' ends to `url` from now on; the answer holds the signing secret (only here)."""
        body = {"url": url, **({"secret": secret} if secret is not None else {})}
        return WebhookCreated.model_validate(self.request("POST", "/webhooks", json=body))

    def webhooks(self) -> WebhookList:
        """Your webhooks, each with its newest deliveries and their tries."""
        return WebhookList.model_validate(self.request("GET", "/webhooks"))

    def remove_webhook(self, webhook_id: int) -> None:
        self.request("DELETE", f"/webhooks/{webhook_id}")

    # --- results --------------------------------------------------------------------------

    def best_config(self, sweep_id: int) -> dict[str, Any] | None:
        """The config of the best trial so far (None before any trial reported the metric)."""
        return self.sweep(sweep_id).best_config

    def log(self, sweep_id: int) -> str:
        """The worker's log of the sweep, read from <LAYERLAB_HOME>/logs/sweeps/ on this machine (the worker
        writes it there; on another machine, read it where the worker runs)."""
        path = get_settings().home_abs / "logs" / "sweeps" / f"sweep-{sweep_id}.log"
        if not path.is_file():
            raise ApiError(f"no log of sweep {sweep_id} at {path}: its worker runs on another machine, or not yet")
        return path.read_text(errors="replace")

    def model_uri(self, sweep_id: int) -> str:
        s = self.sweep(sweep_id)
        if not s.model.uri:
            raise ApiError(f"sweep {sweep_id} registered no model (state {s.state}); give its spec `register:`")
        return s.model.uri

    def load_model(self, sweep_id: int) -> Any:
        """The sweep's registered model, loaded (mlflow.pytorch.load_model) from the MLflow the service uses
        (LAYERLAB_TRACKING_URI)."""
        import mlflow

        uri = self.model_uri(sweep_id)
        mlflow.set_tracking_uri(get_settings().tracking_uri)
        mlflow.set_registry_uri(get_settings().tracking_uri)  # models:/ URIs resolve through the registry
        return mlflow.pytorch.load_model(uri)


def _names_a_file(spec: str) -> bool:
    """A one-line string ending in .yaml / .yml is a path; anything else is the spec's YAML text."""
    return "\n" not in spec and spec.endswith((".yaml", ".yml"))


class _Bar:
    """Client.wait's progress bar: trials finished of total, running, errored, the best so far."""

    def __init__(self, sweep_id: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(
            TextColumn("[bold]sweep {task.fields[sid]}[/bold] {task.fields[state]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("running {task.fields[running]}  errored {task.fields[errored]}  best {task.fields[best]}"),
            TimeElapsedColumn(),
        )
        self.progress.start()
        self.task = self.progress.add_task("sweep", total=None, sid=sweep_id, state="", running=0, errored=0, best="-")

    def update(self, s: SweepPublic) -> None:
        t = s.trials
        best = "-" if s.best_metric is None else f"{s.metric['name']}={s.best_metric:.4g}"
        self.progress.update(
            self.task, total=t.total, completed=t.finished + t.errored, state=s.state, running=t.running,
            errored=t.errored, best=best,
        )  # fmt: skip

    def close(self) -> None:
        self.progress.stop()
