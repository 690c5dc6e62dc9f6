"""Service errors. Each docstring is the default message; the API maps them to HTTP codes in one place."""

from __future__ import annotations

import re


class LayerlabError(Exception):
    """Something went wrong in layerlab."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class SpecError(LayerlabError):
    """The sweep spec is not valid."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__("invalid sweep spec:\n" + "\n".join(f"  {e}" for e in errors))


class SweepNotFound(LayerlabError):
    """No sweep with this id."""

    def __init__(self, sweep_id: int) -> None:
        self.sweep_id = sweep_id
        super().__init__(f"sweep {sweep_id} does not exist; `layerlab list` shows the sweeps")


class InvalidTransition(LayerlabError):
    """The sweep is not in a state that allows this."""

    def __init__(self, sweep_id: int, state: str, action: str, hint: str = "") -> None:
        self.sweep_id, self.state, self.action = sweep_id, state, action
        super().__init__(f"sweep {sweep_id} is {state}; cannot {action} it" + (f" ({hint})" if hint else ""))


class LeaseLost(LayerlabError):
    """This worker no longer holds the sweep's lease (it expired and the sweep was given to another worker)."""

    def __init__(self, sweep_id: int, worker_id: str, attempt: int) -> None:
        self.sweep_id = sweep_id
        super().__init__(
            f"worker {worker_id} lost the lease on sweep {sweep_id} (attempt {attempt}); another worker owns it now"
        )


def failure_reason(exc: BaseException) -> str:
    """What failed, in one plain line (no terminal colour codes, no traceback: that goes to the log)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).strip()
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return f"{type(exc).__name__}: {first}"[:500] if first else type(exc).__name__
