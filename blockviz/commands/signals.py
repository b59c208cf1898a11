"""SIGINT and SIGTERM for a command that writes a file: the first one raises `Stopped` in the main
thread (so the code writing the file removes its partial copy on the way out, as Ctrl-C's
KeyboardInterrupt does), a second one while that happens is ignored, and from `finishing()` on a
signal no longer interrupts the rename that publishes the file: it is noted in `signum`.

    with StopOnSignals() as stop:
        ...  # except Stopped as exc: one line, exit exc.exit_code

Python runs a signal's handler in the main thread between two bytecodes, whichever thread the
kernel hands the signal to, so a flag the handler reads (`holding`) is what defers it; blocking
the signal (pthread_sigmask) would hold it from the main thread only.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived; `exit_code` is the shell's 128 + the signal's number."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.name = signal.Signals(signum).name
        self.exit_code = 128 + signum


class StopOnSignals:
    """A context in which SIGINT and SIGTERM raise Stopped (the handlers before it are put back on
    exit). `signum` is the first signal that arrived, or None."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.holding = False
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "StopOnSignals":
        if threading.current_thread() is threading.main_thread():  # only the main thread may set handlers
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, frame: object) -> None:
        if self.signum is not None:  # a second signal while the first one is being handled
            return
        self.signum = signum
        if not self.holding:
            raise Stopped(signum)

    @contextlib.contextmanager
    def finishing(self) -> Iterator[None]:
        """From this block on, a signal no longer interrupts: it is noted in `signum` (the file is
        being published, and what follows only reports it)."""
        self.holding = True
        yield
