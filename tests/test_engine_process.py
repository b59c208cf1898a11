"""`blockviz run`'s engine process (blockviz/session/engine_process.py): the live app on a REAL engine (a
tiny GPT-2 checkpoint, CPU) running in a child process, driven by keys and checked against the
same run recorded in this process; commands and backpressure across the pipe; a load failure
and a crashed engine process each reported in one line."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import pytest

from blockviz.tui.app import BlockvizApp
from blockviz.commands.record import record_trace
from blockviz.session.engine_process import ProcessBridge
from blockviz.model.player import SPEEDS
from blockviz.session.spec import EngineSpec
from blockviz.session.engine_driver import Listener
from test_tui_app import _until, screen_text

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _spec(model, **kwargs) -> EngineSpec:
    settings = dict(prompts=("To be, or not to be", "The quick brown fox"), n=2, max_tokens=6, block_size=4,
                    num_gpu_blocks=32, num_cpu_blocks=16, device="cpu")
    settings.update(kwargs)
    return EngineSpec.of(model=str(model), **settings)


def _picture(state) -> dict:
    """What the views draw, less what differs between two runs by nature: step wall times, and
    K/V digests (floating-point sums may round differently with another number of threads; and
    an engine free-running under the app digests once per batch it sends, not every step)."""
    return {
        "tables": state.tables,
        "blocks": {device: [(b.ref_count, sorted(b.owners), b.token_ids, b.state, b.block_hash)
                            for b in blocks] for device, blocks in state.pools.items()},
        "seqs": {s: (q.token_ids, q.token_texts, q.status, q.finish_reason) for s, q in state.seqs.items()},
        "counts": {kind: count for kind, count in state.counts.items() if kind != "kv_digest"},
    }


async def test_the_live_app_on_an_engine_process_draws_the_engines_run(tmp_path, tiny_gpt2_dir):
    spec = _spec(tiny_gpt2_dir)
    recorded = record_trace(spec, tmp_path / "same-run.jsonl")  # the same run, in this process
    bridge = ProcessBridge(spec)
    bridge.start()
    app = BlockvizApp(bridge=bridge, deterministic=True, play=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await _until(pilot, lambda: app.player is not None, timeout=60)
        await pilot.press("s")  # one engine step, asked for across the pipe
        await _until(pilot, lambda: app.player.timeline.num_steps_done() == 1, timeout=30)
        await pilot.pause(0.3)
        assert app.player.timeline.num_steps_done() == 1 and bridge.outstanding == 0
        state = app.player.timeline.state
        assert state.step_kind == "prefill" and len(state.seqs) == 4  # n=2 forked after the prefill
        app.player.speed_index = len(SPEEDS) - 1
        await pilot.press("space")
        await _until(pilot, lambda: app.player.finished and app.player.timeline.at_end, timeout=60)
        assert _picture(app.player.timeline.state) == _picture(recorded.state)
        assert app.player.timeline.state.num_tokens_generated == 4 * spec.max_tokens
    deadline = time.monotonic() + 30  # quitting the app stopped it; the app's worker reaps it
    while bridge.exitcode is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert bridge.exitcode == 0
    assert not bridge.log_path.exists()  # a clean run leaves no log behind


async def test_commands_reach_the_engine_process(tiny_gpt2_dir):
    spec = _spec(tiny_gpt2_dir, n=1, max_tokens=20)
    bridge = ProcessBridge(spec)
    bridge.start()
    app = BlockvizApp(bridge=bridge, deterministic=True, play=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await _until(pilot, lambda: app.player is not None, timeout=60)
        await pilot.press("s")
        await _until(pilot, lambda: app.player.timeline.num_steps_done() == 1, timeout=30)
        await pilot.press("n")  # seq 0
        await pilot.press("f")  # fork it: a third sequence sharing its blocks
        await _until(pilot, lambda: len(app.player.timeline.state.seqs) == 3, timeout=30)
        assert "fork" in app.player.timeline.state.counts
        await pilot.press("p")  # swap its request out, between steps
        await _until(pilot, lambda: app.player.timeline.state.num_used("cpu") > 0, timeout=30)
        assert app.player.timeline.state.seqs[0].status == "swapped"


class Recorder:
    """A Listener whose calls are kept, each with its arguments."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []
        self.ready = threading.Event()

    def listener(self, bridge: ProcessBridge) -> Listener:
        def record(name):
            def call(*args):
                self.calls.append((name, args))
                if name == "ready":
                    self.ready.set()
                if name == "events":
                    bridge.acknowledge(len(args[0]))
            return call

        return Listener(**{name: record(name) for name in
                           ("loading", "ready", "failed", "events", "notice", "died", "idle", "served")})

    def named(self, name: str) -> list[tuple]:
        return [args for called, args in self.calls if called == name]


def _run_in_thread(bridge: ProcessBridge, recorder: Recorder) -> threading.Thread:
    thread = threading.Thread(target=bridge.run, args=(recorder.listener(bridge),), daemon=True)
    thread.start()
    return thread


def test_a_model_that_cannot_load_fails_in_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    bridge = ProcessBridge(_spec(tmp_path / "empty"))
    recorder = Recorder()
    _run_in_thread(bridge, recorder).join(timeout=120)
    (error,), = recorder.named("failed")
    assert "\n" not in error and "empty" in error
    assert not recorder.named("ready") and bridge.exitcode == 0


def test_a_killed_engine_process_is_reported_not_hung(tiny_gpt2_dir):
    bridge = ProcessBridge(_spec(tiny_gpt2_dir))
    recorder = Recorder()
    thread = _run_in_thread(bridge, recorder)
    assert recorder.ready.wait(timeout=60)
    os.kill(bridge._process.pid, signal.SIGKILL)
    thread.join(timeout=30)
    assert not thread.is_alive() and bridge.exitcode == -signal.SIGKILL
    (note,), = recorder.named("died")  # the app keeps the picture, says so, and exits 1
    assert note.startswith("engine stopped: the engine process exited with code -9")
    assert ("(log: " in note) == bridge.log_path.exists()  # kept only when it has something to say


def test_steps_asked_for_are_served_once_each(tiny_gpt2_dir):
    bridge = ProcessBridge(_spec(tiny_gpt2_dir, max_tokens=4))
    recorder = Recorder()
    thread = _run_in_thread(bridge, recorder)
    assert recorder.ready.wait(timeout=60)
    bridge.request_steps(2)
    assert bridge.outstanding == 2
    deadline = time.monotonic() + 30
    while bridge.outstanding and time.monotonic() < deadline:
        time.sleep(0.01)
    assert bridge.outstanding == 0
    steps = [e for (batch,) in recorder.named("events") for e in batch if e.type == "step_finished"]
    assert len(steps) == 2  # exactly the two asked for: nothing free-runs
    bridge.stop()
    thread.join(timeout=30)
    assert not thread.is_alive() and bridge.exitcode == 0


async def test_quitting_while_the_model_loads_ends_the_engine_process_at_once(tiny_gpt2_dir):
    bridge = ProcessBridge(_spec(tiny_gpt2_dir))
    bridge.start()
    app = BlockvizApp(bridge=bridge, deterministic=True, play=False)
    notes: list[str] = []
    app.notify = lambda message, **kwargs: notes.append(message)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.2)  # importing torch alone takes the child seconds
        assert app.player is None
        await pilot.press("q")
    deadline = time.monotonic() + 60
    while bridge.exitcode is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert bridge.header is None  # it never got as far as ready
    assert bridge.exitcode == -signal.SIGTERM  # ended by the bridge, not waited for
    assert app.error is None and notes == []  # and that is not reported as a crash


async def test_a_stopped_engine_process_is_said_not_responding_and_q_still_quits(tiny_gpt2_dir, monkeypatch):
    """SIGSTOP on the engine process (issue 30): while playback waits on it the app says the
    engine is not responding, and q ends the app and the process (SIGTERM, then SIGKILL, which a
    stopped process cannot ignore) instead of waiting for it forever."""
    from blockviz.tui import controller

    monkeypatch.setattr(controller, "NOT_RESPONDING_S", 0.5)
    bridge = ProcessBridge(_spec(tiny_gpt2_dir, max_tokens=50))
    bridge.start()
    pid = bridge._process.pid
    watchdog = threading.Timer(120, lambda: os.kill(pid, signal.SIGKILL))  # never hang the suite
    watchdog.start()
    app = BlockvizApp(bridge=bridge, deterministic=True, play=False)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await _until(pilot, lambda: app.player is not None, timeout=60)
            os.kill(pid, signal.SIGSTOP)
            await pilot.press("space")
            await _until(pilot, lambda: "engine not responding" in screen_text(app), timeout=30)
            assert app.screen.has_class("-engine-stalled") and app.player.playing
            await pilot.press("q")
        deadline = time.monotonic() + 60  # the app has exited; its engine worker ends the process
        while bridge.exitcode is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert bridge.exitcode == -signal.SIGKILL  # the bridge killed it; it never answered SIGTERM
        assert watchdog.is_alive()  # and not the watchdog
    finally:
        watchdog.cancel()
    assert app.error is None and not app.engine_died  # quitting is not reported as a crash


@dataclass(slots=True)
class _HeapReportingSpec(EngineSpec):
    """A real engine whose run header also says how many objects its process has left out of
    garbage collection by the time the header is taken (right after loading)."""

    def make_engine(self):
        from blockviz.session import engine_session

        engine = EngineSpec.make_engine(self)  # in the engine process: patch its header there
        header = engine_session.trace_header
        engine_session.trace_header = lambda built: {**header(built), "gc_frozen": gc.get_freeze_count()}
        return engine


def test_the_engine_process_leaves_the_loaded_model_out_of_garbage_collection(tiny_gpt2_dir):
    settings = _spec(tiny_gpt2_dir).as_dict()
    bridge = ProcessBridge(_HeapReportingSpec(**settings))
    recorder = Recorder()
    thread = _run_in_thread(bridge, recorder)
    assert recorder.ready.wait(timeout=60)
    (header,), = recorder.named("ready")
    # torch, transformers and the model: a full collection over them stalled the engine ~225 ms
    assert header["gc_frozen"] > 50_000
    bridge.stop()
    thread.join(timeout=30)
    assert not thread.is_alive() and bridge.exitcode == 0


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:  # the field after the state: ppid
                found.append(int(entry))
    return found


def _policies(pid: int) -> set[int]:
    policies = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            policies.add(os.sched_getscheduler(int(tid)))
        except OSError:
            pass  # a thread that just ended
    return policies


def _can_idle_schedule() -> bool:
    """Whether a process here may make itself SCHED_IDLE (Linux lets any; a sandbox may not)."""
    if not hasattr(os, "SCHED_IDLE") or not os.path.isdir("/proc/self/task"):
        return False
    probe = "import os; os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


class _Terminal:
    """`blockviz run ARGS` in a pseudo-terminal of 100x30; what it draws gathers in `screen`."""

    def __init__(self, *args: str) -> None:
        import fcntl  # POSIX only, like the tests
        import pty
        import struct
        import termios

        self.main_fd, terminal_fd = pty.openpty()
        fcntl.ioctl(terminal_fd, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
        self.ui = subprocess.Popen([sys.executable, "-m", "blockviz", "run", *args], stdin=terminal_fd,
                                   stdout=terminal_fd, stderr=terminal_fd, start_new_session=True)
        os.close(terminal_fd)
        self.screen = bytearray()
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:  # the app blocks once the pty's buffer is full
        while True:
            try:
                chunk = os.read(self.main_fd, 65536)
            except OSError:
                return
            if not chunk:
                return
            self.screen.extend(chunk)

    def wait_for(self, predicate, what: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline or self.ui.poll() is not None:
                raise AssertionError(f"{what}: not seen; the screen ends {bytes(self.screen[-500:])!r}")
            time.sleep(0.02)

    def shows(self, text: str) -> bool:
        return text.encode() in self.screen

    def engine_pid(self) -> int | None:
        engines = [child for child in _children(self.ui.pid)
                   if b"spawn_main" in open(f"/proc/{child}/cmdline", "rb").read()]
        return engines[0] if engines else None

    def press(self, key: bytes) -> None:
        os.write(self.main_fd, key)

    def close(self) -> None:
        if self.ui.poll() is None:
            self.ui.kill()
            self.ui.wait()
        os.close(self.main_fd)


# What the engine process says before `import torch` and right after it (blockviz/session/engine_process.py)
BEFORE_TORCH = ("starting the engine process", "importing torch")
AFTER_TORCH = "loading the model"


def test_blockviz_run_draws_its_loading_screen_before_torch_is_imported_then_plays(tiny_gpt2_dir):
    """The order of what reaches the terminal, no clock: the loading screen (saying what it waits
    for) is drawn before the engine process has finished importing torch (it says "loading the
    model" only after), then the main view on the story's card 1, and the engine playing once
    space is pressed; q quits."""
    terminal = _Terminal("--model", str(tiny_gpt2_dir), "--max-tokens", "4")
    try:
        terminal.wait_for(lambda: terminal.shows("GPU pool") and terminal.shows("card 1"), "the main view on card 1")
        terminal.press(b" ")
        terminal.wait_for(lambda: terminal.shows("step 1 "), "the main view with a step done")
        screen = bytes(terminal.screen)
        first_frame = min(screen.find(text.encode()) for text in BEFORE_TORCH if text.encode() in screen)
        assert 0 <= first_frame < screen.find(AFTER_TORCH.encode())
        assert "▶ playing".encode() in screen
        terminal.press(b"q")
        assert terminal.ui.wait(timeout=60) == 0
    finally:
        terminal.close()
    assert b"Traceback" not in terminal.screen


def test_q_while_blockviz_run_loads_ends_the_engine_process_without_waiting_for_the_model(tiny_gpt2_dir):
    terminal = _Terminal("--model", str(tiny_gpt2_dir), "--max-tokens", "4")
    try:
        terminal.wait_for(lambda: any(terminal.shows(text) for text in BEFORE_TORCH), "the loading screen")
        engine = terminal.engine_pid()
        assert engine is not None and not terminal.shows(AFTER_TORCH)  # torch still importing
        terminal.press(b"q")
        assert terminal.ui.wait(timeout=60) == 0
    finally:
        terminal.close()
    assert not os.path.exists(f"/proc/{engine}")  # ended and reaped, not left loading
    assert not terminal.shows("GPU pool") and b"Traceback" not in terminal.screen  # the model never came


@pytest.mark.skipif(not _can_idle_schedule(), reason="Linux scheduling policies, SCHED_IDLE permitted")
@pytest.mark.parametrize("priority", ["idle", "normal"])
def test_blockviz_run_leaves_the_cores_to_the_engine_process(tiny_gpt2_dir, priority):
    """`blockviz run` in a terminal (a pty, 100x30): by default, once the engine is running (its
    `ready`: the UI needs the cores to draw the loading screen while the engine process imports
    torch), every thread of the UI's process is SCHED_IDLE, those Textual started after the switch
    too, while the engine process keeps the normal policy; `--ui-priority normal` leaves the UI as
    it was. Quitting with q exits 0."""
    terminal = _Terminal("--model", str(tiny_gpt2_dir), "--max-tokens", "4", "--ui-priority", priority)
    ui = terminal.ui
    try:
        # the engine is ready once the main view (its pools) is drawn; the policy was set before
        terminal.wait_for(lambda: terminal.engine_pid() is not None and terminal.shows("GPU pool")
                          and len(os.listdir(f"/proc/{ui.pid}/task")) >= 3, "the main view")
        expected = os.SCHED_IDLE if priority == "idle" else os.SCHED_OTHER
        assert _policies(ui.pid) == {expected}
        assert _policies(terminal.engine_pid()) == {os.SCHED_OTHER}
        terminal.press(b"q")
        assert ui.wait(timeout=60) == 0
    finally:
        terminal.close()
    assert b"Traceback" not in terminal.screen
