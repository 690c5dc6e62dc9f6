"""Webhooks and their deliveries in the queue database; part of service.queue.QueueStore.

A delivery row is made for each (webhook, sweep end) by `enqueue_ended`, from the sweeps' own rows: every
sweep of the webhook's owner in an end state whose `finished_at` is after the webhook was registered. So no
code path that ends a sweep has to remember the webhooks, and an API that was down when a sweep ended makes
its rows when it comes back. The unique key (webhook, sweep, finished_at) makes each end one event, however
many deliverers look at once; a resumed sweep that ends again is a new event.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import and_, or_, select, update
from sqlalchemy.exc import IntegrityError

from service.models import TERMINAL, Sweep, Webhook, WebhookAttempt, WebhookDelivery, utcnow
from service.store_base import StoreBase
from service.webhooks import MAX_ATTEMPTS, backoff_seconds, payload


@dataclass(frozen=True)
class Due:
    """A delivery a deliverer holds now: what to send where."""

    id: int
    event_id: str
    url: str
    secret: str
    payload: str
    attempts: int


class WebhookRows(StoreBase):
    def add_webhook(self, owner: str, url: str, secret: str) -> Webhook:
        with self.session() as s, s.begin():
            hook = Webhook(owner=owner, url=url, secret=secret, created_at=utcnow())
            s.add(hook)
            s.flush()
            s.expunge(hook)
            return hook

    def webhooks(self, owner: str | None) -> list[Webhook]:
        """The webhooks in use, of `owner` (None: everyone's, for an admin)."""
        q = select(Webhook).where(Webhook.removed_at.is_(None))
        if owner is not None:
            q = q.where(Webhook.owner == owner)
        with self.session() as s:
            return list(s.scalars(q.order_by(Webhook.id)))

    def webhook(self, webhook_id: int) -> Webhook | None:
        with self.session() as s:
            hook = s.get(Webhook, webhook_id)
            return hook if hook is not None and hook.removed_at is None else None

    def remove_webhook(self, webhook_id: int) -> None:
        """No new events for it; deliveries not yet sent are dropped (marked failed), the history kept."""
        now = utcnow()
        with self.session() as s, s.begin():
            s.execute(update(Webhook).where(Webhook.id == webhook_id).values(removed_at=now))
            s.execute(
                update(WebhookDelivery)
                .where(WebhookDelivery.webhook_id == webhook_id, WebhookDelivery.state == "pending")
                .values(state="failed", claimed_until=None)
            )

    def deliveries(self, webhook_ids: list[int], limit: int = 20) -> list[tuple[WebhookDelivery, list[WebhookAttempt]]]:
        """The newest deliveries of these webhooks, each with its attempts in order."""
        with self.session() as s:
            rows = list(
                s.scalars(
                    select(WebhookDelivery)
                    .where(WebhookDelivery.webhook_id.in_(webhook_ids))
                    .order_by(WebhookDelivery.id.desc())
                    .limit(limit)
                )
            )
            ids = [r.id for r in rows]
            attempts = list(
                s.scalars(select(WebhookAttempt).where(WebhookAttempt.delivery_id.in_(ids)).order_by(WebhookAttempt.id))
            )
        by_delivery: dict[int, list[WebhookAttempt]] = {i: [] for i in ids}
        for a in attempts:
            by_delivery[a.delivery_id].append(a)
        return [(r, by_delivery[r.id]) for r in rows]

    def enqueue_ended(self, api_url: str, mlflow_ui_url: str) -> int:
        """Make the delivery rows of sweep ends that have none yet; returns how many were made."""
        made = 0
        q = (
            select(Webhook, Sweep)
            .join(Sweep, Sweep.owner == Webhook.owner)
            .where(
                Webhook.removed_at.is_(None),
                Sweep.state.in_([s.value for s in TERMINAL]),
                Sweep.finished_at.is_not(None),
                Sweep.finished_at >= Webhook.created_at,
                ~select(WebhookDelivery.id)
                .where(
                    WebhookDelivery.webhook_id == Webhook.id,
                    WebhookDelivery.sweep_id == Sweep.id,
                    WebhookDelivery.ended_at == Sweep.finished_at,
                )
                .exists(),
            )
            .order_by(Sweep.finished_at)
            .limit(500)
        )
        with self.session() as s:
            pairs = [(hook.id, sweep) for hook, sweep in s.execute(q).all()]
            for sweep in {id(sw): sw for _, sw in pairs}.values():
                s.expunge(sweep)
        for hook_id, sweep in pairs:
            assert sweep.finished_at is not None
            event_id = str(uuid.uuid4())
            row = WebhookDelivery(
                webhook_id=hook_id,
                sweep_id=sweep.id,
                ended_at=sweep.finished_at,
                event_id=event_id,
                payload=payload(sweep, sweep.finished_at, event_id, api_url, mlflow_ui_url),
                state="pending",
                attempts=0,
                next_attempt_at=utcnow(),
                created_at=utcnow(),
            )
            try:
                with self.session() as s, s.begin():
                    s.add(row)
                made += 1
            except IntegrityError:  # another deliverer made it first
                continue
        return made

    def claim_due(self, holder_seconds: float, limit: int = 20) -> list[Due]:
        """Deliveries due now, each held for `holder_seconds` by this caller (a conditional update: two
        deliverers never hold the same row at once; one that died lets it go when the time is up)."""
        now = utcnow()
        free = or_(WebhookDelivery.claimed_until.is_(None), WebhookDelivery.claimed_until < now)
        due = and_(WebhookDelivery.state == "pending", WebhookDelivery.next_attempt_at <= now, free)
        with self.session() as s:
            ids = list(
                s.scalars(select(WebhookDelivery.id).where(due).order_by(WebhookDelivery.next_attempt_at).limit(limit))
            )
        held: list[Due] = []
        until = now + timedelta(seconds=holder_seconds)
        for delivery_id in ids:
            with self.session() as s, s.begin():
                took = s.execute(
                    update(WebhookDelivery).where(WebhookDelivery.id == delivery_id, due).values(claimed_until=until)
                ).rowcount  # type: ignore[attr-defined]
                if took != 1:
                    continue
                row = s.get(WebhookDelivery, delivery_id)
                hook = s.get(Webhook, row.webhook_id) if row is not None else None
                if row is None or hook is None:
                    continue
                held.append(Due(row.id, row.event_id, hook.url, hook.secret, row.payload, row.attempts))
        return held

    def record_attempt(
        self, delivery_id: int, status_code: int | None, error: str | None, seconds: float, backoff_base: float
    ) -> str:
        """Record one try (2xx: delivered); the delivery's state after it: delivered, pending or failed."""
        now = utcnow()
        ok = status_code is not None and 200 <= status_code < 300
        with self.session() as s, s.begin():
            row = s.get(WebhookDelivery, delivery_id)
            assert row is not None
            s.add(
                WebhookAttempt(delivery_id=delivery_id, at=now, status_code=status_code, error=error, seconds=seconds)
            )
            row.attempts += 1
            row.claimed_until = None
            if ok:
                row.state, row.delivered_at = "delivered", now
            elif row.attempts >= MAX_ATTEMPTS or row.state != "pending":
                row.state = "failed"
            else:
                row.next_attempt_at = now + timedelta(seconds=backoff_seconds(row.attempts, backoff_base))
            return row.state

    def due_soonest(self) -> datetime | None:
        """When the next pending delivery is due (the deliverer sleeps until then, or its poll interval)."""
        with self.session() as s:
            return s.scalar(
                select(WebhookDelivery.next_attempt_at)
                .where(WebhookDelivery.state == "pending")
                .order_by(WebhookDelivery.next_attempt_at)
                .limit(1)
            )
