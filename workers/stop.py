"""Why a running attempt of a sweep should stop before its trials are done."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class StopRequests:
    """Why this attempt should stop before its trials are done. Set from any thread; acted on by the
    callback on Tune's own thread (`ProgressCallback.on_step_begin`)."""

    cancel: threading.Event = field(default_factory=threading.Event)
    lease_lost: threading.Event = field(default_factory=threading.Event)
    shutdown: threading.Event = field(default_factory=threading.Event)
    ending: threading.Event = field(default_factory=threading.Event)
    """Set once the worker records the sweep's end (or gives it back): the lease then ends by design."""
    interrupted: bool = False
    """Whether the callback has ended fit() early for one of these requests."""

    def any(self) -> bool:
        return self.cancel.is_set() or self.lease_lost.is_set() or self.shutdown.is_set()
