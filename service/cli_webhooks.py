"""`layerlab webhooks`: URLs that hear when your sweeps end (service/webhooks.py: the event, its signature).

layerlab webhooks                         yours, with each delivery's tries
layerlab webhooks add URL [--secret S]    register one; prints the signing secret (shown only this once)
layerlab webhooks remove ID               stop sending to it
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from service.cli_views import WIDE
from service.client import ApiError, Client
from service.schemas import WebhookList
from service.settings import get_settings

webhooks_app = typer.Typer(
    help="Webhooks: a signed POST to your URL when each of your sweeps ends.", invoke_without_command=True
)
out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


def _client() -> Client:
    settings = get_settings()
    return Client(settings.api_url, settings.resolved_api_token() or "")


def _failed(exc: ApiError) -> typer.Exit:
    for e in exc.errors:
        err.print(f"  {e}", highlight=False, markup=False)
    err.print(f"[red]error:[/red] {escape(exc.message)}", highlight=False)
    return typer.Exit(2 if exc.status == 422 else 1)


@webhooks_app.callback()
def webhooks(ctx: typer.Context) -> None:
    """Your webhooks and their newest deliveries (every try: when, the receiver's status or the error)."""
    if ctx.invoked_subcommand is not None:
        return
    try:
        hooks = _client().webhooks()
    except ApiError as exc:
        raise _failed(exc) from None
    # Not a terminal (a pipe, a log): whole rows however wide, as `layerlab show` prints them.
    (out if out.is_terminal else Console(width=WIDE, soft_wrap=True)).print(deliveries_view(hooks))


def deliveries_view(hooks: WebhookList) -> Table | str:
    if not hooks.webhooks:
        return "no webhooks; add one with `layerlab webhooks add URL`"
    table = Table("webhook", "url", "sweep", "event", "state", "tries")
    for hook in hooks.webhooks:
        if not hook.deliveries:
            table.add_row(str(hook.id), hook.url, "-", "-", "no sweep ended yet", "")
        for d in hook.deliveries:
            tries = "; ".join(
                f"{t.at:%H:%M:%S} "
                + (f"HTTP {t.status_code}" if t.status_code is not None else "no answer")
                + (f" ({t.error})" if t.error and t.status_code is None else "")
                for t in d.tries
            )
            state = d.state if d.state != "pending" else f"pending, next try {d.next_attempt_at:%H:%M:%S}"
            table.add_row(str(hook.id), hook.url, str(d.sweep_id), d.event_id[:8], state, tries)
    return table


@webhooks_app.command()
def add(
    url: Annotated[str, typer.Argument(help="http(s) URL that receives a JSON POST per sweep end.")],
    secret: Annotated[
        str | None, typer.Option(help="Signing secret (16+ characters); a random one if left out.")
    ] = None,
) -> None:
    """Register URL for your sweeps' ends; prints the secret that signs them (shown only now)."""
    try:
        hook = _client().add_webhook(url, secret)
    except ApiError as exc:
        raise _failed(exc) from None
    out.print(f"webhook {hook.id}: {hook.url}", highlight=False, markup=False)
    out.print(f"secret: {hook.secret}", highlight=False, markup=False)
    out.print('keep the secret with the receiver: it checks X-Layerlab-Signature (README "Webhooks")')


@webhooks_app.command()
def remove(webhook_id: Annotated[int, typer.Argument(help="The webhook's id (`layerlab webhooks`).")]) -> None:
    """Stop sending to a webhook; deliveries not yet made are dropped."""
    try:
        _client().remove_webhook(webhook_id)
    except ApiError as exc:
        raise _failed(exc) from None
    out.print(f"webhook {webhook_id} removed")
