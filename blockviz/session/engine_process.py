"""The live engine in a process of its own, for `blockviz run`.

Why a process: on a CPU the engine is largely Python (scheduling, the block manager, its events)
and the TUI is all Python; in one process they take turns holding the GIL, and the engine slows
down with the TUI attached (benchmarks/README.md). In its own process the engine keeps its
interpreter to itself, and the UI process never imports torch.

`ProcessBridge` has the UI-side API of engine_thread.EngineBridge (request_steps, set_free_run,
acknowledge, add_request, fork, preempt, stop, outstanding, in_flight) and the same
`run(listener)`, which the app calls on a worker thread: it starts the child, then turns what the
child sends into the listener's callbacks (the app posts them as messages). The child runs an
ordinary EngineBridge over the engine and sends its listener calls back through a pipe; the UI's
calls travel the other way. Backpressure is the EngineBridge's own: the UI's acknowledgements
reach the child, which stops stepping while too many events wait unacknowledged.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import tempfile
import threading
from multiprocessing import resource_tracker
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

from blockviz.session.engine_driver import Listener
from blockviz.session.engine_thread import EngineBridge
from blockviz.session.spec import EngineSpec, one_line

STARTING = "starting the engine process…"  # then the child says what it loads (_child_main)
# What the child may be asked to call on its EngineBridge.
_CALLS = frozenset({"request_steps", "set_free_run", "acknowledge", "add_request", "fork", "preempt"})
# A free-running engine sends a batch of events (and digests the K/V blocks it wrote) this often:
# the app draws a frame a second then (THROUGHPUT_FPS), and every batch wakes both processes.
FLUSH_INTERVAL = 0.5
# An engine process asked to stop (SIGTERM) that has not exited after this long is killed
# (SIGKILL): a stopped or hung child must never keep the UI from quitting.
TERMINATE_GRACE_S = 2.0


class ProcessBridge:
    """Runs an EngineBridge in a child process; UI-thread methods send it messages."""

    def __init__(self, spec: EngineSpec | None = None, *, max_in_flight: int = 4096,
                 flush_interval: float = FLUSH_INTERVAL, start_method: str = "spawn",
                 leave_cores_once_ready: bool = False) -> None:
        self.spec = spec or EngineSpec()
        # SCHED_IDLE for this (the UI's) process once the engine is running, not while it loads:
        # the loading screen needs the CPU the child's torch import takes (leave_cores_to_engine)
        self.leave_cores_once_ready = leave_cores_once_ready
        self.ui_idle = False  # whether leave_cores_to_engine was applied
        self.max_in_flight = max_in_flight
        self.flush_interval = flush_interval
        self._context = multiprocessing.get_context(start_method)
        self._to_child_recv, self._to_child = self._context.Pipe(duplex=False)
        self._from_child: Any = None
        self._process: Any = None
        # spawn's helper process starts on first use and hands on sys.stderr's descriptor, which a
        # running Textual app has replaced: start it now, from wherever the bridge is made.
        resource_tracker.ensure_running()
        self._lock = threading.Lock()
        self._requested = 0  # steps asked for, ever
        self._served = 0  # steps the child reports finished or dropped, ever
        self._in_flight = 0
        self._unsent_acks = 0  # acknowledged here, not yet told to the child
        self._free_run: bool | None = None
        self._stopped = threading.Event()
        # stop() writes here, waking run()'s wait with nothing from the child (no polling)
        self._wake_recv, self._wake_send = multiprocessing.Pipe(duplex=False)
        self._terminated = False
        self.header: dict[str, Any] | None = None
        self.log_path: Path | None = None
        self.exitcode: int | None = None

    # ------------------------------------------------------------------ UI side

    def _send(self, name: str, *args: Any) -> None:
        with self._lock:
            if self._stopped.is_set():
                return
            try:
                self._to_child.send((name, args))
            except (OSError, ValueError):  # the child is gone; run() reports why
                pass

    def request_steps(self, count: int = 1) -> None:
        with self._lock:
            self._requested += count
        self._send("request_steps", count)

    @property
    def outstanding(self) -> int:
        """Steps asked for and not reported finished yet."""
        with self._lock:
            return self._requested - self._served

    @property
    def in_flight(self) -> int:
        with self._lock:
            return self._in_flight

    def set_free_run(self, free_run: bool) -> None:
        with self._lock:
            if free_run == self._free_run:
                return  # the UI says this many times a second; the child hears changes
            self._free_run = free_run
        self._send("set_free_run", free_run)

    def acknowledge(self, count: int) -> None:
        """The UI took `count` events. The child hears of it once a quarter of `max_in_flight`
        has gathered (every message wakes the engine process): holding back fewer than that can
        stall the engine only while the UI still has three quarters to take, and taking them
        sends the acknowledgement."""
        with self._lock:
            self._in_flight = max(0, self._in_flight - count)
            self._unsent_acks += count
            if self._unsent_acks < max(1, self.max_in_flight // 4):
                return
            count, self._unsent_acks = self._unsent_acks, 0
        self._send("acknowledge", count)

    def add_request(self, prompt: str, n: int | None = None) -> None:
        self._send("add_request", prompt, n)

    def fork(self, seq_id: int) -> None:
        self._send("fork", seq_id)

    def preempt(self, request_id: str) -> None:
        self._send("preempt", request_id)

    def stop(self) -> None:
        with self._lock:
            if self._stopped.is_set():
                return
            self._stopped.set()
            for message, connection in ((("stop", ()), self._to_child), (None, self._wake_send)):
                try:
                    connection.send(message)
                except (OSError, ValueError):
                    pass

    def start(self) -> None:
        """Start the engine process (it begins loading the model at once). Call it before the app
        runs: a Textual app replaces sys.stderr, which multiprocessing's spawn cannot hand on.
        `run` starts it if this was not called."""
        if self._process is not None:
            return
        self._from_child, child_end = self._context.Pipe(duplex=False)
        log = tempfile.NamedTemporaryFile(prefix="blockviz-engine-", suffix=".log", delete=False)
        log.close()
        self.log_path = Path(log.name)
        self._process = self._context.Process(
            target=_child_main, name="blockviz-engine", daemon=True,
            args=(self.spec, self._to_child_recv, child_end, str(self.log_path), self.max_in_flight,
                  self.flush_interval))
        self._process.start()
        child_end.close()  # the child holds its own copies now
        self._to_child_recv.close()

    # ------------------------------------------------------------------ the app's worker thread

    def run(self, listener: Listener) -> None:
        """Relay what the engine process sends until it ends or the UI stops it."""
        listener.loading(STARTING)
        try:
            self.start()
        except (OSError, ValueError) as exc:
            listener.failed(f"could not start the engine process: {one_line(exc)}")
            return
        process, from_child = self._process, self._from_child
        ready = closed = False
        try:
            while True:
                try:
                    if from_child not in wait([from_child, self._wake_recv]) and not from_child.poll(0.1):
                        break  # stopped and quiet: the UI is quitting, no need to wait for a model still loading
                    name, args = from_child.recv()
                except (EOFError, OSError):
                    closed = True  # the child is exiting
                    break
                if name == "ready":
                    ready = True
                    self.header = args[0]
                    if self.leave_cores_once_ready:
                        self.ui_idle = leave_cores_to_engine()
                elif name == "events":
                    with self._lock:
                        self._in_flight += len(args[0])
                elif name == "served":
                    with self._lock:
                        self._served = args[0]
                    continue
                getattr(listener, name)(*args)
        finally:
            self.stop()
            # A child that closed its end is on its way out; one still loading the model has
            # nothing to lose when the UI quits; one that was running may finish its step.
            process.join(timeout=5 if closed else 2 if ready else 0.2)
            if process.is_alive():  # still loading, or stuck in a model call: we end it
                self._terminated = True
                process.terminate()
                process.join(timeout=TERMINATE_GRACE_S)
            if process.is_alive():  # stopped (SIGSTOP) or deaf to SIGTERM: SIGKILL ends it whatever its state
                process.kill()
                process.join(timeout=5)
            from_child.close()
            self._wake_recv.close()
            self._wake_send.close()
            self.exitcode = process.exitcode
        crashed = self.exitcode not in (0, None) and not self._quiet_exit()
        log_line = self._last_log_line() if crashed else ""
        if crashed:
            why = f"the engine process exited with code {self.exitcode}{log_line}"
            (listener.died if ready else listener.failed)(f"engine stopped: {why}" if ready else why)
        if not log_line:  # the log is kept only when a crash message points at it
            self.log_path.unlink(missing_ok=True)

    def _quiet_exit(self) -> bool:
        """Terminated by us on the way out, not a crash."""
        return self._terminated and self.exitcode in (-signal.SIGTERM, -signal.SIGKILL)

    def _last_log_line(self) -> str:
        try:
            lines = [line for line in self.log_path.read_text(errors="replace").splitlines() if line.strip()]
        except OSError:
            return ""
        return f": {lines[-1].strip()} (log: {self.log_path})" if lines else ""


def leave_cores_to_engine() -> bool:
    """Schedule this process (the UI's) on CPU time nobody else wants: SCHED_IDLE, on Linux, for
    each of its threads (threads it starts later inherit it). Call it once the engine process is
    running (ProcessBridge(leave_cores_once_ready=True) does, on its `ready`), which keeps the
    normal policy: applied while the child still imports torch, it starved the loading screen of
    the CPU it needed to draw at all. Returns whether it was applied.

    Why: on a CPU the engine keeps the cores busy through its torch threads, which wait on one
    another at each parallel operation, so a UI thread taking a core from one stalls them all.
    Scheduled idle, the app pre-empts the engine about as often as no app at all, while its event
    loop still answers within milliseconds: it needs a few percent of a core, and gets it in the
    moments the engine's threads wait (benchmarks/tui.py measures it; benchmarks/README.md).
    Nothing unprivileged can leave SCHED_IDLE again, hence a choice for the whole UI process;
    `blockviz run --ui-priority normal` skips it."""
    idle = getattr(os, "SCHED_IDLE", None)
    if idle is None:
        return False  # not Linux
    try:
        threads = [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]  # the calling thread
    for thread in threads:
        try:
            os.sched_setscheduler(thread, idle, os.sched_param(0))
        except ProcessLookupError:
            continue  # a thread that ended meanwhile
        except OSError:  # not permitted here (a sandbox's policy): the UI runs as it was
            return False
    return True


def _child_main(spec: EngineSpec, commands, out, log_path: str, max_in_flight: int,
                flush_interval: float) -> None:
    """The engine process: an EngineBridge whose listener writes to `out`, fed by `commands`."""
    log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND)
    for fd in (1, 2):  # the TUI owns the terminal: anything the libraries print goes to the log
        os.dup2(log_fd, fd)
    os.close(log_fd)

    def make_engine():
        engine = spec.make_engine()
        # The model, torch and transformers (hundreds of thousands of objects) live as long as
        # this process: leave them out of garbage collections, each full one of which would stall
        # every engine thread whenever enough events had outlived a young collection (they wait up
        # to flush_interval in the bridge's buffer). Figures: benchmarks/README.md.
        gc.collect()
        gc.freeze()
        return engine

    bridge = EngineBridge(spec, make_engine=make_engine, max_in_flight=max_in_flight,
                          flush_interval=flush_interval, share_cores=False)
    lock = threading.Lock()

    def send(name: str, *args: Any) -> None:
        with lock:
            try:
                out.send((name, args))
            except (OSError, ValueError):  # the UI is gone
                bridge.stop()

    def serve_commands() -> None:
        while True:
            try:
                name, args = commands.recv()
            except (EOFError, OSError):
                break
            if name == "stop":
                break
            if name in _CALLS:
                getattr(bridge, name)(*args)
        bridge.stop()

    threading.Thread(target=serve_commands, name="blockviz-commands", daemon=True).start()
    send("loading", "importing torch…")
    import torch  # noqa: F401 - seconds on a CPU; the loading screen says so meanwhile

    bridge.run(Listener(
        loading=lambda text: send("loading", text),
        ready=lambda header: send("ready", header),
        failed=lambda error: send("failed", error),
        events=lambda events: send("events", events),
        notice=lambda text: send("notice", text),
        died=lambda error: send("died", error),
        idle=lambda: send("idle"),
        served=lambda steps: send("served", steps),
    ))
    out.close()

