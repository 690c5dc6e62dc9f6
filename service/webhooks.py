"""Word to a user's URL when their sweep ends: what is sent, how it is signed, and which URLs are allowed.

An event is a JSON object POSTed to each webhook of the sweep's owner (service.webhook_delivery sends it,
from rows of the queue database: service.webhook_store). Its headers:

- `X-Layerlab-Event: sweep.ended`, `X-Layerlab-Delivery: <uuid>` (the same on every retry: drop repeats);
- `X-Layerlab-Timestamp: <unix seconds>` of this attempt;
- `X-Layerlab-Signature: sha256=<hex>`, the HMAC-SHA256 of `<timestamp>.<body>` under the webhook's secret
  (`verify` below is the receiver's check; refuse a timestamp older than a few minutes to stop replays).

URLs: http or https only, no user:password part (it would be logged with the URL), and, unless the operator
allows it (LAYERLAB_WEBHOOK_ALLOW_PRIVATE), no host that resolves to a loopback, private, link-local or otherwise
non-public address: a webhook must not make the service a proxy into its own network. The check runs at
registration and again before every attempt (a name may resolve elsewhere later); redirects are not followed.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import math
import socket
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from service.models import Sweep

EVENT = "sweep.ended"
SIGNATURE_HEADER = "X-Layerlab-Signature"
TIMESTAMP_HEADER = "X-Layerlab-Timestamp"
DELIVERY_HEADER = "X-Layerlab-Delivery"
EVENT_HEADER = "X-Layerlab-Event"

MAX_ATTEMPTS = 12
"""Tries of one delivery before it is marked failed: with BACKOFF_BASE_SECONDS 2, about 45 minutes in all."""
BACKOFF_BASE_SECONDS = 2.0
BACKOFF_CAP_SECONDS = 15 * 60.0


class WebhookUrlError(ValueError):
    """A URL the service will not send to; the message says why and what to do."""


def check_url(url: str, allow_private: bool) -> None:
    """Raise WebhookUrlError unless `url` is one the service may POST to (see the module's doc)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise WebhookUrlError(f"url: only http:// and https:// URLs receive events, got {parts.scheme or 'none'!r}")
    if not parts.hostname:
        raise WebhookUrlError("url: names no host; give one, e.g. https://hooks.example.org/layerlab")
    if parts.username is not None or parts.password is not None:
        raise WebhookUrlError("url: holds a user or password; authenticate the events by their signature instead")
    if allow_private:
        return
    for address in resolve(parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)):
        if not ipaddress.ip_address(address).is_global:
            raise WebhookUrlError(
                f"url: {parts.hostname} resolves to {address}, not a public address; this deployment sends events "
                "to public addresses only (an operator allows private ones with LAYERLAB_WEBHOOK_ALLOW_PRIVATE=true)"
            )


def resolve(host: str, port: int) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError) as exc:
        raise WebhookUrlError(f"url: the host {host} does not resolve ({exc}); check its spelling") from None
    return sorted({str(info[4][0]).split("%")[0] for info in infos})


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The X-Layerlab-Signature header's value for `body` sent at `timestamp`."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"sha256={mac.hexdigest()}"


def verify(secret: str, timestamp: str, body: bytes, signature: str) -> bool:
    """The receiver's check of an event: the signature matches the body and timestamp under the secret."""
    try:
        expected = sign(secret, int(timestamp), body)
    except ValueError:
        return False
    return hmac.compare_digest(expected, signature)


def payload(sweep: Sweep, ended_at: datetime, event_id: str, api_url: str, mlflow_ui_url: str) -> str:
    """The event's body for a sweep that ended at `ended_at` (fixed when the delivery row is made)."""
    exp, run = sweep.mlflow_experiment_id, sweep.mlflow_parent_run_id
    ui = mlflow_ui_url.rstrip("/")
    model = None
    if sweep.model_name and sweep.model_version:
        model = {"name": sweep.model_name, "version": sweep.model_version, "alias": sweep.model_alias}
    body: dict[str, Any] = {
        "event": EVENT,
        "delivery": event_id,
        "sweep": {
            "id": sweep.id,
            "name": sweep.name,
            "task": sweep.task,
            "owner": sweep.owner,
            "state": sweep.state,
            "reason": sweep.reason,
            "metric": {"name": sweep.metric_name, "mode": sweep.metric_mode},
            "best_metric": sweep.best_metric if sweep.best_metric is None or math.isfinite(sweep.best_metric) else None,
            "best_trial_id": sweep.best_trial_id,
            "ended_at": ended_at.isoformat() + "Z",
            "model": model,
        },
        "links": {
            "sweep": f"{api_url.rstrip('/')}/sweeps/{sweep.id}",
            "experiment": f"{ui}/#/experiments/{exp}/runs?workflowType=machine_learning" if exp else None,
            "parent_run": f"{ui}/#/experiments/{exp}/runs/{run}" if exp and run else None,
        },
    }
    return json.dumps(body, sort_keys=True, allow_nan=False, default=str)


def backoff_seconds(attempts: int, base: float = BACKOFF_BASE_SECONDS) -> float:
    """The wait after the `attempts`-th failed try: base, 2 base, 4 base, ... up to BACKOFF_CAP_SECONDS."""
    return float(min(base * 2 ** max(attempts - 1, 0), BACKOFF_CAP_SECONDS))
