"""TUI benchmark (figures, not a test): how fast the pool view draws, and what the TUI costs the engine.

    python benchmarks/tui.py                  # both parts
    python benchmarks/tui.py --part frames    # pool view only (no torch)
    python benchmarks/tui.py --part engine --model DIR
    python benchmarks/tui.py --part engine --gpt2-shape --max-tokens 64 --cycles 4 --no-thread
                                              # a random GPT-2-small-shaped model: --model gpt2's speed
    python benchmarks/tui.py --part engine --ui-priority normal
                                              # the app scheduled normally, not SCHED_IDLE
    python benchmarks/tui.py --part startup   # `blockviz run` in a terminal: first frame, first step
    python benchmarks/tui.py --smoke          # every part, briefly (tests/test_benchmarks.py): seconds, no figure to read

1. Frames/s of the pool view on a 4,096-block GPU pool under a stream of real BlockSpaceManager
   events (headless): each frame applies a batch of events to the timeline's reducer, hands the
   state to the PoolGrid and renders every visible line through Textual's Widget.render_lines.
   Also the whole app (every panel, Textual's compositor) end to end. Target: >= 30 frames/s.
   Then the same stream on a 200,000-block GPU pool (`--big-pool`, the size vLLM's sizing gives a
   GPU), which the PoolGrid draws zoomed out (blockviz/model/pool_zoom.py): the pool view alone.
2. The engine's tokens/s with the TUI attached (live app, headless, playing at "max", the engine
   in its own process and the app's process scheduled SCHED_IDLE, as `blockviz run` runs them)
   against the same engine with nothing attached.
   Each session starts an engine process and a live app over it, then runs cycles of an observed
   run (one subscriber keeping every event: what being watched costs the engine itself, building
   events and K/V digests) and a run with the TUI attached (requests added through the app,
   played at "max"), their order alternating, each between two runs of the workload alone:
   alone, attached, alone, observed, alone, ... A run's ratio is its tokens/s over the mean of
   its two alone neighbours', which cancels a steady drift of the machine's speed (up to a third
   over tens of seconds here). Each run also notes the steal time in it (the hypervisor running
   others on our cores, from /proc/stat), and each ratio is printed again over the calm runs alone
   (a run and both its neighbours with less than CALM_STEAL of the CPUs stolen). The alone and
   observed runs happen in the engine process while the app sits idle (its CPU time then is
   printed). Each session runs in a fresh Python process which, like `blockviz run`'s UI, never
   imports torch. The figure is the median of the attached runs' ratios, with a bootstrap 90%
   interval of that median (how far a rerun could move it). Also printed: how much
   neighbouring alone runs differ (the noise), the engine process's CPU time per token and how
   often the kernel pre-empted it in each kind of run, the engine's own cost of being watched measured
   step by step (steadier than whole runs), the app's CPU time, how fast the app's event loop
   answers while the engine runs (a probe posting to it), and the app with the engine on a
   thread of its own process (sharing its GIL). Target the ratio >= 0.95x.
3. `blockviz run --no-guided` started in a pseudo-terminal (100x30), as a user types it: seconds
   from the command to its first frame (the loading screen's text reaching the terminal), to the
   main view (the engine ready: the pools drawn) and to the first engine step drawn (the status
   bar's "step 1"), no key pressed (unguided, a live run plays at once; the story's guided default
   opens paused on its first card). Target: first frame <= 1 s.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import os
import random
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from blockviz.session import engine_process  # noqa: E402
from blockviz.session.spec import EngineSpec  # noqa: E402  (no torch: the frames part runs without it)

NUM_GPU_BLOCKS = 4096
NUM_CPU_BLOCKS = 512
BLOCK_SIZE = 16


# ---------------------------------------------------------------------------- 3. startup


FIRST_FRAME = (b"starting the engine process", b"importing torch")  # the loading screen's first words


def _startup_once(args: list[str], timeout: float = 120) -> dict[str, float]:
    """One `blockviz run` in a pty: seconds to the first frame, the main view and the first step."""
    import fcntl
    import pty
    import select
    import struct
    import termios

    main_fd, terminal_fd = pty.openpty()
    fcntl.ioctl(terminal_fd, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.monotonic()
    ui = subprocess.Popen([sys.executable, "-m", "blockviz", "run", *args], stdin=terminal_fd, stdout=terminal_fd,
                          stderr=terminal_fd, start_new_session=True, env=env, cwd=ROOT)
    os.close(terminal_fd)
    screen = bytearray()
    marks: dict[str, float] = {}
    wanted = {"first frame": FIRST_FRAME, "main view": (b"GPU pool",), "first step": (b"step 1 ",)}
    try:
        while len(marks) < len(wanted) and time.monotonic() - start < timeout and ui.poll() is None:
            if select.select([main_fd], [], [], 0.01)[0]:
                screen.extend(os.read(main_fd, 65536))
            now = time.monotonic()
            for name, texts in wanted.items():
                if name not in marks and any(text in screen for text in texts):
                    marks[name] = now - start
        os.write(main_fd, b"q")
        ui.wait(timeout=10)
    except subprocess.TimeoutExpired:  # q not read yet: a SCHED_IDLE UI waits for free cores while its engine plays
        pass
    finally:
        if ui.poll() is None:
            os.killpg(ui.pid, signal.SIGKILL)  # the UI and its engine process (the UI leads their group)
            ui.wait()
        os.close(main_fd)
    return marks


def bench_startup(runs: int, model: str | None, ui_priority: str) -> dict[str, float]:
    args = (["--model", model] if model else []) + ["--ui-priority", ui_priority, "--no-guided"]
    print(f"3. `blockviz run {' '.join(args)}` in a 100x30 pty, {runs} runs (seconds from the command)")
    results = [_startup_once(args) for _ in range(runs)]
    for name in ("first frame", "main view", "first step"):
        values = sorted(r[name] for r in results if name in r)
        if not values:
            print(f"  {name:<12} never seen")
            continue
        print(f"  {name:<12} median {statistics.median(values):.2f}  min {values[0]:.2f}  max {values[-1]:.2f}"
              + ("" if len(values) == runs else f"  (seen in {len(values)} of {runs} runs)"))
    frames = [r["first frame"] for r in results if "first frame" in r]
    if not frames:
        return {}
    median = statistics.median(frames)
    print(f"  first frame: {median:.2f} s  [{'ok' if median <= 1 else 'ABOVE TARGET'}: target <= 1 s]", flush=True)
    return {"startup first frame s": median}


# ---------------------------------------------------------------------------- 1. pool view frames/s


def block_manager_stream(num_events: int, seed: int = 0) -> list:
    """Real BlockSpaceManager events on a 4,096-block pool: prompts allocated, decode slots
    appended, n=2 forks with copy-on-write, sequences freed, a few swaps."""
    from engine.block_manager import AllocStatus, BlockSpaceManager
    from engine.events import EventBus
    from engine.sequence import Sequence, SequenceGroup, SequenceStatus

    rng = random.Random(seed)
    events: list = []
    bus = EventBus()
    bus.subscribe(events.append)
    bm = BlockSpaceManager(BLOCK_SIZE, NUM_GPU_BLOCKS, NUM_CPU_BLOCKS, watermark=0.0, events=bus)
    running: list[SequenceGroup] = []
    next_id = 0
    while len(events) < num_events:
        if rng.random() < 0.3:
            seq = Sequence(next_id, [rng.randrange(50000) for _ in range(rng.randrange(20, 400))], BLOCK_SIZE)
            next_id += 1
            group = SequenceGroup(str(seq.seq_id), [seq])
            if bm.can_allocate(group) is AllocStatus.OK:
                bm.allocate(group)
                seq.status = SequenceStatus.RUNNING
                if rng.random() < 0.3:
                    child = seq.fork(next_id)
                    next_id += 1
                    bm.fork(seq, child)
                    group.add(child)
                running.append(group)
        for group in list(running):
            for seq in group.get_seqs(SequenceStatus.RUNNING):
                if bm.get_num_free_gpu_blocks() < 4:
                    break
                seq.append_token_id(rng.randrange(50000))
                bm.append_slots(seq)
            if rng.random() < 0.02 or bm.get_num_free_gpu_blocks() < 8:
                for seq in group.get_seqs():
                    bm.free(seq)
                    seq.status = SequenceStatus.FINISHED_STOPPED
                running.remove(group)
    return events[:num_events]


async def _pool_frames(events: list, batch: int, size: tuple[int, int], seconds: float,
                       num_gpu_blocks: int = NUM_GPU_BLOCKS) -> tuple[float, int]:
    from textual.app import App, ComposeResult
    from textual.geometry import Region

    from blockviz.model.timeline import Timeline
    from blockviz.model.view import touched_blocks
    from blockviz.tui.widgets.pool_grid import PoolGrid

    class PoolHost(App):
        def compose(self) -> ComposeResult:
            yield PoolGrid("gpu", id="gpu")

    timeline = Timeline(BLOCK_SIZE, num_gpu_blocks, NUM_CPU_BLOCKS)
    timeline.extend(events)
    app = PoolHost()
    async with app.run_test(size=size) as pilot:
        grid = app.query_one(PoolGrid)
        grid.styles.height = "1fr"
        grid.show(timeline.state)
        await pilot.pause()
        frames = 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            if not timeline.forward(batch):
                timeline.seek(0)
            grid.show(timeline.state, touched_blocks(timeline.current_event).get("gpu", frozenset()))
            region = Region(0, 0, grid.size.width, grid.size.height)
            lines = grid.render_lines(region)
            assert len(lines) == grid.size.height
            frames += 1
        elapsed = time.perf_counter() - start
        return frames / elapsed, grid.columns


async def _app_frames(events: list, speed: float, size: tuple[int, int], seconds: float) -> tuple[float, float]:
    """Play the whole app (every panel) at `speed` events/s for `seconds`; returns the frames it
    drew per second and the events/s it kept up with (its frame timer asks for 30 frames/s)."""
    from blockviz.model.player import SPEEDS
    from blockviz.model.trace import Trace
    from blockviz.tui.app import BlockvizApp

    header = {"model": "synthetic", "block_size": BLOCK_SIZE, "num_gpu_blocks": NUM_GPU_BLOCKS,
              "num_cpu_blocks": NUM_CPU_BLOCKS}
    app = BlockvizApp(trace=Trace(header, events), deterministic=True)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        frames = 0
        draw = app.render_views

        def counted(full: bool = True) -> None:
            nonlocal frames
            frames += 1
            draw(full)

        app.render_views = counted
        app.player.speed_index = SPEEDS.index(speed)
        start = time.perf_counter()
        await pilot.press("space")
        await asyncio.sleep(seconds)
        elapsed = time.perf_counter() - start
        position = app.player.timeline.position
        return frames / elapsed, position / elapsed


def bench_frames(seconds: float, num_events: int = 60_000, big_pool: int = 200_000) -> dict[str, float]:
    t0 = time.perf_counter()
    events = block_manager_stream(num_events)
    figures: dict[str, float] = {}
    print(f"pool view: {NUM_GPU_BLOCKS} GPU blocks, {len(events)} real BlockSpaceManager events "
          f"(made in {time.perf_counter() - t0:.1f} s)")
    for size in ((80, 24), (200, 60)):
        for batch in (10, 100):
            fps, columns = asyncio.run(_pool_frames(events, batch, size, seconds))
            verdict = "ok" if fps >= 30 else "BELOW TARGET"
            print(f"  PoolGrid alone  {size[0]}x{size[1]} ({columns} cells a row), {batch:>3} events/frame: "
                  f"{fps:7.1f} frames/s  [{verdict}: target >= 30]")
            figures[f"PoolGrid {size[0]}x{size[1]} {batch} events/frame frames/s"] = fps
    for size in ((80, 24), (200, 60)):
        fps, rate = asyncio.run(_app_frames(events, 1000.0, size, seconds))
        verdict = "ok" if fps >= 30 else "below 30"
        print(f"  whole app       {size[0]}x{size[1]}, playing at 1000 events/s: {fps:7.1f} frames/s, "
              f"kept up with {rate:6.0f} events/s  [{verdict}; every panel + Textual's compositor]")
        figures[f"whole app {size[0]}x{size[1]} frames/s"] = fps
    print(f"pool view: {big_pool:,} GPU blocks (the same events), drawn zoomed out")
    for size in ((80, 24), (200, 60)):
        fps, columns = asyncio.run(_pool_frames(events, 10, size, seconds, big_pool))
        verdict = "ok" if fps >= 30 else "BELOW TARGET"
        print(f"  PoolGrid alone  {size[0]}x{size[1]} ({columns} cells a row),  10 events/frame: "
              f"{fps:7.1f} frames/s  [{verdict}: target >= 30]")
        figures[f"PoolGrid {big_pool} blocks {size[0]}x{size[1]} frames/s"] = fps
    return figures


# ---------------------------------------------------------------------------- 2. engine tokens/s


def _scratch_dir() -> Path:
    """A temporary folder for a checkpoint the benchmark builds, removed when the benchmark exits."""
    folder = Path(tempfile.mkdtemp(prefix="blockviz-bench-"))
    atexit.register(shutil.rmtree, folder, True)
    return folder


def _gpt2_shape_dir() -> str:
    """A random checkpoint shaped like GPT-2 small (12 layers, 768 wide, 50,257 tokens): what
    `--model gpt2` runs, built here since nothing can be downloaded (benchmarks/throughput.py)."""
    from throughput import build_model

    print("building a random GPT-2-small-shaped checkpoint (~500 MB)...", flush=True)
    return str(build_model(_scratch_dir() / "gpt2-shape", 12, 768, 12))


def _tiny_model_dir() -> str:
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import make_tiny_gpt2

    path = _scratch_dir() / "tiny-gpt2"
    make_tiny_gpt2(path, n_layer=4, n_embd=128, n_positions=512)
    return str(path)


PROMPTS = ("ROMEO:", "JULIET:", "First Citizen:", "KING RICHARD III:", "HAMLET:", "MACBETH:", "LEAR:", "OTHELLO:",
           "PORTIA:", "BRUTUS:", "CLEOPATRA:", "PROSPERO:", "VIOLA:", "FALSTAFF:", "OPHELIA:", "IAGO:")


def _spec(model: str, max_tokens: int):
    return EngineSpec.of(model=model, prompts=PROMPTS, n=1, max_tokens=max_tokens, block_size=16,
                         num_gpu_blocks=512, num_cpu_blocks=64, device="cpu", seed=0)


FLUSH_INTERVAL = engine_process.FLUSH_INTERVAL  # a free-running engine sends a batch of events this often


class DigestPacer:
    """Has an engine digest the K/V blocks it wrote once per FLUSH_INTERVAL, as it does under the
    live app at full speed (the engine session emits them before the bridge sends each batch), instead of
    every step: call after_step() after each step, finish() at the end."""

    def __init__(self, engine) -> None:
        self.engine = engine
        engine.set_kv_digests_per_step(False)
        self.last = time.perf_counter()

    def after_step(self) -> None:
        now = time.perf_counter()
        if now - self.last >= FLUSH_INTERVAL:
            self.last = now
            self.engine.emit_kv_digests()

    def finish(self) -> None:
        self.engine.set_kv_digests_per_step(True)  # emits what was held back


def _steps_alone(spec, engine, observed: bool = False, step=None) -> tuple[float, int]:
    """Run the spec's requests to the end on `engine` with nothing attached (`observed`: one
    subscriber keeping every event: what being watched costs the engine itself, building events
    and K/V digests, paced as under the live app at full speed); returns the wall time of the
    steps and the tokens generated."""
    unsubscribe = engine.events.subscribe([].append) if observed else None
    pacer = DigestPacer(engine) if observed else None
    for prompt in spec.workload:
        engine.add_request(prompt, spec.sampling_params())
    step = step or engine.step
    tokens = 0
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        for output in step():
            if output.finished:
                tokens += sum(len(completion.token_ids) for completion in output.outputs)
        if pacer is not None:
            pacer.after_step()
    if pacer is not None:
        pacer.finish()
    elapsed = time.perf_counter() - start
    if unsubscribe is not None:
        unsubscribe()
    return elapsed, tokens


@dataclass(slots=True)
class TimedSpec(EngineSpec):
    """The spec of the attached runs' engine process. The app starts it with no requests; once the
    engine is loaded, make_engine warms it up on the whole workload, has the engine note when each
    of its steps starts and ends, and starts a thread serving the benchmark's `control` FIFO:
    "alone" / "observed" run the workload on the same engine with the bridge's subscriber detached
    (nothing reaches the app), "span" reports the time from the start of the first step to the end
    of the last since the previous "span" (the attached run just played); answers go to the
    `results` FIFO. The benchmark sends these only while the engine is idle, so the bridge's worker
    thread is not using the engine meanwhile."""

    workload: tuple[str, ...] = ()
    control: str = ""
    results: str = ""

    def make_engine(self):
        engine = EngineSpec.make_engine(self)  # (no zero-argument super() in a slots dataclass)
        _steps_alone(self, engine)  # warm-up
        span: list[float] = []
        step = engine.step

        def noted_step():  # what the bridge calls: span is [first step's start, last step's end]
            start = time.perf_counter()
            if not span:  # ... and the engine process's CPU clock and pre-emptions then
                span[:] = [start, 0.0, *_process_clocks(), 0.0, 0]
            try:
                return step()
            finally:
                span[1] = time.perf_counter()
                span[4:6] = _process_clocks()

        engine.step = noted_step
        threading.Thread(target=_serve_timings, args=(self, engine, step, span), name="bench-timings",
                         daemon=True).start()
        return engine


def _process_clocks() -> tuple[float, int]:
    """This process's CPU time (every thread) and how often the kernel took a core from it."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime, usage.ru_nivcsw


def _serve_timings(spec: TimedSpec, engine, step, span: list[float]) -> None:
    with open(spec.control) as control, open(spec.results, "w") as results:
        for line in control:
            command = line.strip()
            if command == "span":
                answer = ({"seconds": span[1] - span[0], "cpu": span[4] - span[2], "preempted": span[5] - span[3]}
                          if span else {"seconds": 0.0, "cpu": 0.0, "preempted": 0})
                span.clear()
            else:
                bus = engine.events
                bridge_subscribers = list(bus._subscribers)  # the EngineBridge's buffer
                for subscriber in bridge_subscribers:
                    bus.unsubscribe(subscriber)
                cpu, preempted = _process_clocks()
                try:
                    seconds, tokens = _steps_alone(spec, engine, observed=command == "observed", step=step)
                finally:
                    for subscriber in bridge_subscribers:
                        bus.subscribe(subscriber)
                cpu_after, preempted_after = _process_clocks()
                answer = {"seconds": seconds, "tokens": tokens, "cpu": cpu_after - cpu,
                          "preempted": preempted_after - preempted}
            results.write(json.dumps(answer) + "\n")
            results.flush()


class StealMeter:
    """The share of the machine's CPU time the hypervisor gave to others (steal time, from
    /proc/stat) since this was made; None where the kernel does not say."""

    def __init__(self) -> None:
        self.start, self.steal = time.perf_counter(), self._steal()

    @staticmethod
    def _steal() -> float | None:
        try:
            with open("/proc/stat") as stat:
                fields = stat.readline().split()
        except OSError:
            return None
        if fields[0] != "cpu" or len(fields) < 9:
            return None
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")

    def fraction(self) -> float | None:
        steal = self._steal()
        if steal is None or self.steal is None:
            return None
        return (steal - self.steal) / ((time.perf_counter() - self.start) * (os.cpu_count() or 1))


class LoopLatency:
    """How long the app's event loop takes to answer: a thread posts a callback to it every
    `interval` and notes the delay until it runs (what a key press waits for, roughly)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, interval: float = 0.25) -> None:
        self.delays: list[float] = []
        self._loop, self._interval = loop, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._post, name="bench-latency", daemon=True)
        self._thread.start()

    def _post(self) -> None:
        while not self._stop.wait(self._interval):
            posted = time.perf_counter()
            self._loop.call_soon_threadsafe(self._answered, posted)

    def _answered(self, posted: float) -> None:
        self.delays.append(time.perf_counter() - posted)

    def stop(self) -> tuple[float, float]:
        """(90th percentile, largest) delay in seconds."""
        self._stop.set()
        self._thread.join()
        delays = sorted(self.delays) or [0.0]
        return delays[int(0.9 * (len(delays) - 1))], delays[-1]


class _AttachedSession:
    """One engine process (as `blockviz run` starts it) and one live app (headless, 120x36) over
    it, for a few cycles of an observed run and a run with the TUI attached (their order
    alternating from cycle to cycle), each between two runs of the workload alone: alone,
    attached, alone, observed, alone, ... Alone and observed runs happen in the engine process
    while the app sits idle (its CPU time then is measured and reported); attached runs add the
    requests through the app's bridge and play at "max" until the engine's idle report reaches
    the app. A measured run is compared with the mean of the alone runs on either side of it:
    this machine's speed drifts by up to a third over tens of seconds, and the bracket cancels a
    steady drift. Each run notes the steal time during it (the hypervisor running others)."""

    def __init__(self, spec, make_bridge, cycles: int, first: int, ui_priority: str = "idle") -> None:
        self.spec, self.make_bridge, self.cycles, self.first = spec, make_bridge, cycles, first
        self.ui_priority = ui_priority
        self.runs: list[dict[str, Any]] = []  # in order: {"kind", "seconds", "tokens"[, "wall"]}
        self.idle_cpu_s = 0.0  # the UI process's CPU time during the alone and observed runs
        self.attached_cpu_s = 0.0  # ... and during the attached runs (with the engine's, in a thread)
        self.idle_at = 0.0
        self.ui_idle = False  # the app's process scheduled SCHED_IDLE

    def run(self) -> list[dict[str, Any]]:
        folder = Path(tempfile.mkdtemp(prefix="blockviz-bench-"))
        control, results = folder / "control", folder / "results"
        os.mkfifo(control)
        os.mkfifo(results)
        timed = TimedSpec(**{**self.spec.as_dict(), "prompts": ()}, workload=tuple(self.spec.prompts),
                          control=str(control), results=str(results))
        self.bridge = self.make_bridge(timed)
        if hasattr(self.bridge, "start"):  # a ProcessBridge starts before the app (see its docstring)
            self.bridge.start()
        try:
            asyncio.run(self._session(control, results))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return self.runs

    async def _session(self, control: Path, results: Path) -> None:
        from blockviz.tui.app import BlockvizApp
        from blockviz.model.player import SPEEDS

        idle = asyncio.Event()
        session = self

        class TimedApp(BlockvizApp):
            def on_engine_idle(self, message) -> None:  # Textual calls BlockvizApp's handler next
                session.idle_at = time.process_time()  # (before that handler's full redraw)
                idle.set()

        self.app = app = TimedApp(bridge=self.bridge, deterministic=True, play=False)
        async with app.run_test(size=(120, 36)) as pilot:
            while app.player is None:
                if app.error:
                    raise RuntimeError(f"the engine did not start: {app.error}")
                await pilot.pause(0.05)
            if hasattr(self.bridge, "start") and self.ui_priority == "idle":
                self.ui_idle = engine_process.leave_cores_to_engine()  # once ready, as `blockviz run` does
            await pilot.pause(0.5)  # the first frame settles (layout)
            app.player.speed_index = len(SPEEDS) - 1
            # the FIFOs open once the engine process's thread opens its ends (after its warm-up)
            self._writer = await asyncio.to_thread(open, control, "w")
            self._reader = await asyncio.to_thread(open, results)
            try:
                await self._run("alone", pilot, idle)
                for cycle in range(self.cycles):
                    kinds = ["attached", "observed"]
                    if (self.first + cycle) % 2:
                        kinds.reverse()
                    for kind in kinds:
                        await self._run(kind, pilot, idle)
                        await self._run("alone", pilot, idle)
            finally:
                self._writer.close()
                self._reader.close()

    async def _run(self, kind: str, pilot, idle: asyncio.Event) -> None:
        steal = StealMeter()
        if kind == "attached":
            self.runs.append({"kind": kind, **await self._attached(pilot, idle), "steal": steal.fraction()})
            await pilot.pause(0.5)  # the app's catch-up redraw is over before the next run starts
            return
        cpu = time.process_time()
        result = await self._ask(kind)
        self.idle_cpu_s += time.process_time() - cpu
        self.runs.append({"kind": kind, "seconds": result["seconds"], "tokens": result["tokens"],
                          "cpu": result["cpu"], "preempted": result["preempted"], "steal": steal.fraction()})

    async def _ask(self, command: str) -> dict:
        """A command to the engine process's timing thread, and its answer."""
        self._writer.write(command + "\n")
        self._writer.flush()
        answer = await asyncio.to_thread(self._reader.readline)
        if not answer:
            raise RuntimeError("the engine process closed its timing channel (it exited)")
        return json.loads(answer)

    async def _attached(self, pilot, idle: asyncio.Event) -> dict[str, float]:
        """The time is the engine's: from the start of its first step to the end of its last, noted
        in the engine process (everything between steps included: sending events, the bridge's
        loop); `wall` adds the messages' way: pressing play reaching the engine, and its report
        that it finished reaching the app."""
        latency = LoopLatency(asyncio.get_running_loop())
        played = await play_to_idle(self.app, self.bridge, self.spec.prompts, pilot, idle)
        late90, latest = latency.stop()
        self.attached_cpu_s += self.idle_at - played["cpu_start"]
        span = await self._ask("span")
        return {"seconds": span["seconds"], "wall": played["wall"], "tokens": played["tokens"],
                "cpu": span["cpu"], "preempted": span["preempted"], "late90": late90, "latest": latest}


async def play_to_idle(app, bridge, prompts, pilot, idle: asyncio.Event) -> dict[str, float]:
    """What pressing `a` with each prompt and then space does, without the prompt screens: the
    requests go in through the app's bridge, the app plays (at its player's speed) until the
    engine's idle report sets `idle`, then the views catch up and playback stops. Returns the wall
    time from pressing play to the idle report, this process's CPU clock when play was pressed
    (the caller notes it again when `idle` is set), and the tokens generated."""
    player = app.player
    timeline = player.timeline
    received = len(timeline)
    tokens_before = timeline.state.num_tokens_generated
    player.finished = False
    for prompt in prompts:
        bridge.add_request(prompt)
    while sum(event.type == "request_added" for event in timeline.events[received:]) < len(prompts):
        await pilot.pause(0.05)
    app.action_travel("to_end")  # shown: not playing yet
    await pilot.pause(0.3)
    idle.clear()
    start, cpu = time.perf_counter(), time.process_time()
    app.action_toggle_play()  # what `space` does, without the test pilot's own overhead
    await idle.wait()  # (no polling here: this process's wake-ups are the UI's cost)
    wall = time.perf_counter() - start
    while not timeline.at_end:  # the views catch up before the next run
        await asyncio.sleep(0.1)
    if player.playing:
        app.action_toggle_play()
    return {"wall": wall, "cpu_start": cpu, "tokens": timeline.state.num_tokens_generated - tokens_before}


def run_session(kind: str, model: str, max_tokens: int, cycles: int, first: int, ui_priority: str = "idle") -> dict:
    """One session, in this process (the benchmark runs each in a fresh one: see bench_engine)."""
    from blockviz.session.engine_thread import EngineBridge
    from blockviz.session.engine_process import ProcessBridge

    make_bridge = {
        "process": lambda timed: ProcessBridge(timed),
        # both on all torch threads: what sharing the process (and its GIL) costs
        "thread": lambda timed: EngineBridge(timed, share_cores=False),
    }[kind]
    session = _AttachedSession(_spec(model, max_tokens), make_bridge, cycles, first, ui_priority)
    runs = session.run()
    return {"runs": runs, "idle_cpu_s": session.idle_cpu_s, "attached_cpu_s": session.attached_cpu_s,
            "torch_in_app": "torch" in sys.modules, "ui_idle": session.ui_idle}


def observed_step_by_step(model: str, max_tokens: int, runs: int = 6) -> float:
    """The engine's own cost of being watched, measured step by step: the workload runs `runs`
    times in this process, each step alone or with one subscriber keeping every event (and the
    K/V digests that come with one, paced by DigestPacer), alternating step by step and shifting the pattern between
    runs. Neighbouring steps see the same machine, so this is steadier than whole runs; returns
    the mean alone step time over the mean observed one."""
    from engine import LLMEngine

    spec = _spec(model, max_tokens)
    engine = LLMEngine(spec.config)
    totals = {False: 0.0, True: 0.0}
    counts = {False: 0, True: 0}
    pacer = DigestPacer(engine)  # (digests once per interval's worth of observed steps)
    for run in range(runs + 1):  # the first run warms up
        for prompt in spec.prompts:
            engine.add_request(prompt, spec.sampling_params())
        number = 0
        while engine.has_unfinished_requests():
            observed = (number + run) % 2 == 1
            unsubscribe = engine.events.subscribe([].append) if observed else None
            start = time.perf_counter()
            engine.step()
            if observed:
                pacer.after_step()
            if run:
                totals[observed] += time.perf_counter() - start
                counts[observed] += 1
            if unsubscribe is not None:
                unsubscribe()
            number += 1
    return (totals[False] / counts[False]) / (totals[True] / counts[True])


def _session_process(kind: str, model: str, max_tokens: int, cycles: int, first: int, ui_priority: str) -> dict:
    """run_session in a fresh Python process: the app's process then holds what `blockviz run`'s
    holds, not this driver's imports (torch and transformers would make the app's heap four times
    bigger, and every full garbage collection there four times longer)."""
    command = [sys.executable, __file__, "--session", kind, "--model", model, "--max-tokens", str(max_tokens),
               "--cycles", str(cycles), "--first", str(first), "--ui-priority", ui_priority]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the {kind} session failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def bracketed(runs: list[dict[str, Any]], kind: str, key: str = "seconds") -> list[tuple[float, float, float]]:
    """(tokens/s, ratio, steal) of each `kind` run of one session: the ratio is its tokens/s over
    the mean tokens/s of the alone runs just before and just after it; steal is the largest share
    of CPU time stolen by the hypervisor in any of the three (0 where the kernel does not say)."""
    found = []
    for index, run in enumerate(runs):
        if run["kind"] != kind:
            continue
        before, after = runs[index - 1], runs[index + 1]
        if not before["kind"] == after["kind"] == "alone":
            raise RuntimeError(f"run {index} ({kind}) is not between two alone runs")
        rate = run["tokens"] / run[key]
        alone = (before["tokens"] / before["seconds"] + after["tokens"] / after["seconds"]) / 2
        steal = max(r.get("steal") or 0.0 for r in (before, run, after))
        found.append((rate, rate / alone, steal))
    return found


CALM_STEAL = 0.005  # a run and its two alone neighbours with less steal time than this count as calm


def median_interval(values: list[float], confidence: float = 0.9, resamples: int = 4000) -> tuple[float, float]:
    """A bootstrap interval of the median: how far the printed ratio could move on a rerun, given
    how much single runs scatter on this machine (the median of 18 runs scattered +-0.1 moves by
    a few hundredths)."""
    if len(values) < 2:
        return values[0], values[0]
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    tail = (1 - confidence) / 2
    return medians[int(tail * resamples)], medians[min(resamples - 1, int((1 - tail) * resamples))]


def bench_engine(model: str | None, sessions: int, cycles: int, max_tokens: int, thread: bool,
                 ui_priority: str = "idle", step_runs: int = 6) -> dict[str, float]:
    model = model or (_bundled() or _tiny_model_dir())
    spec = _spec(model, max_tokens)
    import torch

    threads = torch.get_num_threads()
    kinds = ["process", "thread"] if thread else ["process"]
    results: dict[str, list[list[dict[str, Any]]]] = {kind: [] for kind in kinds}  # runs per session
    idle_cpu = {kind: 0.0 for kind in kinds}
    attached_cpu = {kind: 0.0 for kind in kinds}
    ui_idle = True
    for number in range(sessions):
        for kind in (kinds if number % 2 == 0 else kinds[::-1]):
            session = _session_process(kind, model, max_tokens, cycles, number, ui_priority)
            if kind == "process" and session["torch_in_app"]:
                raise RuntimeError("the app's process imported torch: it does not under `blockviz run`")
            results[kind].append(session["runs"])
            ui_idle = ui_idle and (kind != "process" or session["ui_idle"])
            idle_cpu[kind] += session["idle_cpu_s"]
            attached_cpu[kind] += session["attached_cpu_s"]

    def line(label: str, kind: str, name: str, note: str, key: str = "seconds") -> tuple[str, float]:
        found = [triple for runs in results[kind] for triple in bracketed(runs, name, key)]
        ratios = [ratio for _, ratio, _ in found]
        ratio = statistics.median(ratios)
        low, _, high = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratio,) * 3
        lo90, hi90 = median_interval(ratios)
        calm = [ratio for _, ratio, steal in found if steal < CALM_STEAL]
        calm_text = (f"; without steal time {statistics.median(calm):.3f}x over {len(calm)} runs, 90% interval "
                     f"{'-'.join(f'{v:.3f}' for v in median_interval(calm))}" if calm else "")
        return (f"  {label:<34} {statistics.median(rate for rate, _, _ in found):7.1f} tokens/s  {ratio:.3f}x "
                f"(90% interval of the median {lo90:.3f}-{hi90:.3f}; middle half {low:.2f}-{high:.2f}{calm_text}; "
                f"runs {', '.join(f'{r:.2f}' for r in ratios)}) {note}"), ratio

    sessions_runs = results["process"]
    alone = [run for runs in sessions_runs for run in runs if run["kind"] == "alone"]
    alone_rates = [run["tokens"] / run["seconds"] for run in alone]
    # how much the machine moves between neighbouring alone runs (a measured run apart): the noise
    drift = [abs(b["tokens"] / b["seconds"] / (a["tokens"] / a["seconds"]) - 1)
             for runs in sessions_runs for a, b in zip(runs[::2], runs[2::2])]
    attached_runs = [run for runs in sessions_runs for run in runs if run["kind"] == "attached"]
    print(f"engine: {model}, {len(spec.prompts)} requests x {max_tokens} tokens = {alone[0]['tokens']} tokens, "
          f"CPU, {threads} torch threads; {sessions} engine processes x {cycles} cycles of an observed and a "
          f"TUI-attached run, each between two alone runs; a ratio is the median over runs of a run's "
          f"tokens/s over the mean of its two neighbouring alone runs'")
    print(f"  {'without TUI':<34} {statistics.median(alone_rates):7.1f} tokens/s  (the app idle meanwhile; "
          f"{min(alone_rates):.0f}-{max(alone_rates):.0f}; neighbouring alone runs differ by "
          f"{100 * statistics.median(drift):.1f}% (median), {100 * max(drift):.1f}% (most))")
    steals = [run["steal"] for runs in sessions_runs for run in runs if run.get("steal") is not None]
    if steals:
        print(f"  {'steal time':<34} median {100 * statistics.median(steals):.2f}%, most {100 * max(steals):.1f}% of the "
              f"CPUs in a run; {sum(st < CALM_STEAL for st in steals)} of {len(steals)} runs under "
              f"{100 * CALM_STEAL:.1f}% (calm)")
    text, observed = line("events subscribed, no UI", "process", "observed", "(the engine's own cost of being watched)")
    print(text)
    step_by_step = observed_step_by_step(model, max_tokens, step_runs)
    print(f"    the same, step by step            {step_by_step:.3f}x "
          f"(steps alone and observed alternating in one process: the machine's drift cancels)")
    text, ratio = line("TUI attached (blockviz run)", "process", "attached",
                       "(engine process, live app 120x36 at max; first step's start to last step's end)")
    print(text)
    print(line("  the same, timed by the app", "process", "attached",
               "(pressing play to the app hearing the engine finished)", key="wall")[0])
    def per_run(kind: str) -> str:
        chosen = [run for runs in sessions_runs for run in runs if run["kind"] == kind and "cpu" in run]
        cpu_per_token = statistics.median(1e6 * run["cpu"] / run["tokens"] for run in chosen)
        busy = statistics.median(run["cpu"] / run["seconds"] for run in chosen)
        return (f"{kind} {cpu_per_token:.0f} us of CPU a token ({busy:.2f} cores busy), "
                f"{statistics.median(run['preempted'] for run in chosen):.0f} pre-emptions a run")
    print(f"  the engine process (medians): {per_run('alone')}; {per_run('observed')}; {per_run('attached')}")
    wall = sum(run["wall"] for run in attached_runs)
    print(f"  the app's process used {1000 * attached_cpu['process'] / len(attached_runs):.0f} ms of CPU an "
          f"attached run ({100 * attached_cpu['process'] / wall:.1f}% of a core), "
          f"{1000 * idle_cpu['process'] / (len(alone) + len(attached_runs)):.1f} ms a run while the engine "
          f"ran alone or observed")
    print(f"  the app's event loop answered a probe (4 times a second, attached runs) within "
          f"{1000 * statistics.median(run['late90'] for run in attached_runs):.1f} ms 90% of the time (median "
          f"over runs), {1000 * max(run['latest'] for run in attached_runs):.0f} ms at the slowest"
          f"{' (the UI scheduled SCHED_IDLE, as `blockviz run` does)' if ui_idle else ' (the UI scheduled normally)'}")
    figures = {"engine alone tokens/s": statistics.median(alone_rates), "observed / alone": observed,
               "observed / alone, step by step": step_by_step, "TUI attached / alone": ratio,
               "app CPU ms per attached run": 1000 * attached_cpu["process"] / len(attached_runs)}
    if thread:
        text, figures["TUI attached, engine in a thread / alone"] = line(
            "TUI attached, engine in a thread", "thread", "attached",
            "(the app's process, same torch threads: engine and UI share the GIL)")
        print(text)
    print(f"  ratio: {ratio:.3f}x with the TUI attached  [{'ok' if ratio >= 0.95 else 'BELOW TARGET'}: "
          f"target >= 0.95x]", flush=True)
    return figures


def _bundled() -> str | None:
    path = ROOT / "engine" / "models" / "tiny-shakespeare"
    return "tiny-shakespeare" if (path / "config.json").is_file() else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("frames", "engine", "startup", "all"), default="all")
    parser.add_argument("--seconds", type=float, default=2.0, help="per frames/s measurement")
    parser.add_argument("--model", default=None, help="engine part: checkpoint (default: bundled, else a tiny GPT-2)")
    parser.add_argument("--gpt2-shape", action="store_true",
                        help="engine part: a random GPT-2-small-shaped checkpoint (the speed of --model gpt2)")
    parser.add_argument("--sessions", type=int, default=3, help="engine part: engine processes (and app sessions)")
    parser.add_argument("--cycles", type=int, default=6,
                        help="engine part: cycles of an observed and an attached run (each between alone runs) per session")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--no-thread", action="store_true", help="engine part: skip the engine-in-a-thread figure")
    parser.add_argument("--ui-priority", choices=("idle", "normal"), default="idle",
                        help="engine part: the app's scheduling, as `blockviz run --ui-priority` (default idle)")
    parser.add_argument("--session", choices=("process", "thread"), help=argparse.SUPPRESS)  # one session, as JSON
    parser.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--startup-runs", type=int, default=5, help="startup part: `blockviz run`s timed")
    parser.add_argument("--events", type=int, default=60_000, help="frames part: events in the stream played")
    parser.add_argument("--big-pool", type=int, default=200_000, help="frames part: GPU blocks of the big pool")
    parser.add_argument("--step-runs", type=int, default=6, help="engine part: runs of the step-by-step comparison")
    parser.add_argument("--smoke", action="store_true",
                        help="every part once, briefly, on the bundled model: a check that it runs, not a figure")
    args = parser.parse_args(argv)
    if args.smoke:
        vars(args).update(part="all", seconds=0.2, events=3_000, sessions=1, cycles=1, max_tokens=8, no_thread=False,
                          step_runs=1, startup_runs=1, gpt2_shape=False, big_pool=8192)
    if args.session:
        print(json.dumps(run_session(args.session, args.model, args.max_tokens, args.cycles, args.first,
                                     args.ui_priority)))
        return 0
    figures: dict[str, float] = {}
    if args.part in ("frames", "all"):
        figures.update(bench_frames(args.seconds, args.events, args.big_pool))
    if args.part in ("engine", "all"):
        model = _gpt2_shape_dir() if args.gpt2_shape else args.model
        figures.update(bench_engine(model, args.sessions, args.cycles, args.max_tokens, not args.no_thread,
                                    args.ui_priority, args.step_runs))
    if args.part in ("startup", "all"):
        figures.update(bench_startup(args.startup_runs, args.model, args.ui_priority))
    print("figures: " + json.dumps({k: round(v, 4) for k, v in figures.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
