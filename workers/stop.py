"""Why a running attempt of a sweep should stop before its trials are done."""

from __future__ import annotations

import threading
import time
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
    rule: str | None = None
    """Why the spec's stop rules ended the sweep (workers.stop_rules): fit() then ends as Tune ends it, not
    through the callback, and the sweep ends with this as its reason."""
    reached: str | None = None
    """The trial whose metric reached stop.target: the experiment ends once its end is recorded."""
    started: float = field(default_factory=time.monotonic)
    """When this attempt began (stop.max_minutes counts from here)."""

    def any(self) -> bool:
        return self.cancel.is_set() or self.lease_lost.is_set() or self.shutdown.is_set()
