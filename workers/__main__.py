"""`python -m workers`: a queue worker (what `layerlab worker` runs; the embedded stack and the production
stack's worker containers start it as a process, so the service never imports the workers).

    python -m workers [--once] [--exit-when-idle] [--worker-id ID] [--supervise]
"""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer

from service.settings import get_settings
from workers.supervisor import STANDBY_FLAG


def main(
    once: Annotated[bool, typer.Option("--once", help="Run one sweep, then exit.")] = False,
    exit_when_idle: Annotated[bool, typer.Option("--exit-when-idle", help="Exit when the queue is empty.")] = False,
    worker_id: Annotated[str | None, typer.Option(help="Defaults to host:boot-id:pid:random.")] = None,
    supervise: Annotated[
        bool,
        typer.Option(
            "--supervise",
            help="Run the worker as a child process and start a new one whenever it dies (`layerlab up` does); "
            "the new one takes over the dead one's sweep at once. Its pid is in <home>/worker.pid.",
        ),
    ] = False,
    standby: Annotated[
        bool, typer.Option(STANDBY_FLAG, hidden=True, help="Load everything, then wait for 'go' on stdin.")
    ] = False,
) -> None:
    """Claim sweeps and run them on Ray (local Ray unless RAY_ADDRESS is set)."""
    from workers.worker import Worker

    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if standby:  # the supervisor's spare worker (workers/supervisor.py)
        from workers.supervisor import wait_for_go
        from workers.worker import warm_up

        warm_up(get_settings())
        if not wait_for_go():
            return
    if supervise:
        from workers.supervisor import supervise as run_supervised

        if worker_id:
            typer.echo("error: --supervise starts workers with their own ids; leave out --worker-id", err=True)
            raise typer.Exit(1)
        command = [sys.executable, "-m", "workers"]
        command += ["--once"] if once else []
        command += ["--exit-when-idle"] if exit_when_idle else []
        get_settings().home_abs.mkdir(parents=True, exist_ok=True)
        raise typer.Exit(run_supervised(command, get_settings().home_abs / "worker.pid"))
    w = Worker(get_settings(), worker_id=worker_id)
    w.install_signal_handlers()
    w.run(once=once, exit_when_idle=exit_when_idle)


if __name__ == "__main__":
    typer.run(main)
