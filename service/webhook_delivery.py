"""The deliverer: a thread of each `layerlab serve` process that sends the webhook events (service.webhooks).

Each pass makes the delivery rows of sweep ends that have none (WebhookRows.enqueue_ended), then sends the
ones that are due, each held by a conditional update so that two API processes never send the same one at
once. A 2xx answer delivers it; anything else (another status, a timeout, a refused connection, a URL that
now resolves to an address the deployment forbids) is recorded as an attempt and tried again after a
doubling wait, up to MAX_ATTEMPTS. Delivery is at least once: a process killed after the receiver answered
but before the answer was recorded sends that event again once its hold expires, under the same
X-Layerlab-Delivery id. Nothing here logs a secret or a signature.
"""

from __future__ import annotations

import logging
import threading
import time
from urllib.parse import urlsplit

import httpx
from sqlalchemy.exc import DBAPIError, OperationalError

from service.queue import QueueStore
from service.settings import Settings
from service.webhook_store import Due
from service.webhooks import (
    DELIVERY_HEADER,
    EVENT,
    EVENT_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    WebhookUrlError,
    check_url,
    sign,
)

log = logging.getLogger(__name__)

SEND_TIMEOUT_SECONDS = 10.0
HOLD_SECONDS = 60.0
"""How long a deliverer holds a row it is sending (longer than one send's timeout)."""


class WebhookDeliverer:
    def __init__(self, store: QueueStore, settings: Settings) -> None:
        self.store, self.settings = store, settings
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._http = httpx.Client(timeout=SEND_TIMEOUT_SECONDS, follow_redirects=False, trust_env=False)

    def run_once(self) -> int:
        """One pass: new events made, due ones sent; returns how many were sent (delivered or not)."""
        self.store.enqueue_ended(self.settings.api_url, self.settings.mlflow_ui_url)
        due = self.store.claim_due(HOLD_SECONDS)
        for delivery in due:
            self._send(delivery)
        return len(due)

    def _send(self, d: Due) -> None:
        host = urlsplit(d.url).hostname
        started = time.monotonic()
        status: int | None = None
        error: str | None = None
        try:
            check_url(d.url, self.settings.webhook_allow_private)  # again: a name may resolve elsewhere now
            body = d.payload.encode()
            stamp = int(time.time())
            headers = {
                "Content-Type": "application/json",
                "User-Agent": "layerlab-webhooks/1",
                EVENT_HEADER: EVENT,
                DELIVERY_HEADER: d.event_id,
                TIMESTAMP_HEADER: str(stamp),
                SIGNATURE_HEADER: sign(d.secret, stamp, body),
            }
            status = self._http.post(d.url, content=body, headers=headers).status_code
            if not 200 <= status < 300:
                error = f"the receiver answered HTTP {status}" + (
                    " (redirects are not followed)" if status < 400 else ""
                )
        except WebhookUrlError as exc:
            error = str(exc)
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"
        seconds = time.monotonic() - started
        state = self.store.record_attempt(d.id, status, error, seconds, self.settings.webhook_backoff_seconds)
        log.info(
            "webhook delivery %s to %s: %s after attempt %d%s",
            d.event_id, host, state, d.attempts + 1, f" ({error})" if error else "",
        )  # fmt: skip

    # --- the thread of `layerlab serve` --------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="webhook-deliverer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=SEND_TIMEOUT_SECONDS + 5)
        self._http.close()

    def _loop(self) -> None:
        away_since: float | None = None
        while not self._stop.is_set():
            try:
                self.run_once()
            except DBAPIError as exc:
                if not (isinstance(exc, OperationalError) or exc.connection_invalidated):
                    log.warning("webhook deliverer: pass failed; trying again", exc_info=True)
                elif away_since is None:  # the queue database away: the rows wait there; one line, not a trace
                    away_since = time.monotonic()
                    log.warning("webhook deliverer: the queue database is unreachable (%s); trying again", exc.orig)
            except Exception:  # anything else is a fault of ours: its traceback, and the next pass tries again
                log.warning("webhook deliverer: pass failed; trying again", exc_info=True)
            else:
                if away_since is not None:
                    log.info("webhook deliverer: the queue database is back after %.0fs", time.monotonic() - away_since)
                    away_since = None
            self._stop.wait(self.settings.webhook_poll_seconds)
