"""Stopping on request: SIGTERM (a scheduler) or SIGINT (Ctrl-C) asks the run to stop after the current step, which
then checkpoints and writes its report; a second signal aborts at once (the last checkpoint stays intact)."""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType, TracebackType
from typing import Any

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """While entered, SIGINT and SIGTERM set :attr:`requested` (the signal's name) instead of killing the process.

    Handlers can only be installed in the main thread; elsewhere this does nothing and signals act as usual.
    """

    def __init__(self) -> None:
        self.requested: str | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in _SIGNALS}
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.requested is not None:
            raise KeyboardInterrupt(f"{name} again: aborting at once")
        self.requested = name
        # os.write, not print: the signal may arrive while the main thread holds stdout's or the progress bar's lock
        os.write(2, f"\n{name}: stopping after this step (it finishes, then a checkpoint and the report are "
                    f"written); send it again to abort at once\n".encode())
