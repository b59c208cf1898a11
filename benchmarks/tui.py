"""TUI benchmark (figures, not a test): how fast the pool view draws, and what the TUI costs the engine.

    python benchmarks/tui.py                  # both parts
    python benchmarks/tui.py --part frames    # pool view only (no torch)
    python benchmarks/tui.py --part engine --model DIR

1. Frames/s of the pool view on a 4,096-block GPU pool under a stream of real BlockSpaceManager
   events (headless): each frame applies a batch of events to the timeline's reducer, hands the
   state to the PoolGrid and renders every visible line through Textual's Widget.render_lines.
   Also the whole app (every panel, Textual's compositor) end to end. Target: >= 30 frames/s.
2. The engine's tokens/s with the TUI attached (live app, headless, playing at "max", the engine
   in its own process as `blockviz run` runs it) against the same engine with nothing attached,
   in one run, alternating rounds. The attached time runs from pressing play to the engine's
   report that it finished reaching the app. Two more figures: the engine with one subscriber
   and no UI (what being watched costs the engine itself: building events, K/V digests), and the
   app with the engine on a thread of its own process (why blockviz runs it in a process).
   Target the ratio >= 0.95x.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

NUM_GPU_BLOCKS = 4096
NUM_CPU_BLOCKS = 512
BLOCK_SIZE = 16


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


async def _pool_frames(events: list, batch: int, size: tuple[int, int], seconds: float) -> tuple[float, int]:
    from textual.app import App, ComposeResult
    from textual.geometry import Region

    from blockviz.history import Timeline
    from blockviz.widgets.palette import touched_blocks
    from blockviz.widgets.pool_grid import PoolGrid

    class PoolHost(App):
        def compose(self) -> ComposeResult:
            yield PoolGrid("gpu", id="gpu")

    timeline = Timeline(BLOCK_SIZE, NUM_GPU_BLOCKS, NUM_CPU_BLOCKS)
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
    from blockviz import history
    from blockviz.app import BlockvizApp
    from blockviz.trace import Trace

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
        app.player.speed_index = history.SPEEDS.index(speed)
        start = time.perf_counter()
        await pilot.press("space")
        await asyncio.sleep(seconds)
        elapsed = time.perf_counter() - start
        position = app.player.timeline.position
        return frames / elapsed, position / elapsed


def bench_frames(seconds: float) -> None:
    t0 = time.perf_counter()
    events = block_manager_stream(60_000)
    print(f"pool view: {NUM_GPU_BLOCKS} GPU blocks, {len(events)} real BlockSpaceManager events "
          f"(made in {time.perf_counter() - t0:.1f} s)")
    for size in ((80, 24), (200, 60)):
        for batch in (10, 100):
            fps, columns = asyncio.run(_pool_frames(events, batch, size, seconds))
            verdict = "ok" if fps >= 30 else "BELOW TARGET"
            print(f"  PoolGrid alone  {size[0]}x{size[1]} ({columns} cells a row), {batch:>3} events/frame: "
                  f"{fps:7.1f} frames/s  [{verdict}: target >= 30]")
    for size in ((80, 24), (200, 60)):
        fps, rate = asyncio.run(_app_frames(events, 1000.0, size, seconds))
        verdict = "ok" if fps >= 30 else "below 30"
        print(f"  whole app       {size[0]}x{size[1]}, playing at 1000 events/s: {fps:7.1f} frames/s, "
              f"kept up with {rate:6.0f} events/s  [{verdict}; every panel + Textual's compositor]")


# ---------------------------------------------------------------------------- 2. engine tokens/s


def _tiny_model_dir() -> str:
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import make_tiny_gpt2

    path = Path(tempfile.mkdtemp(prefix="blockviz-bench-")) / "tiny-gpt2"
    make_tiny_gpt2(path, n_layer=4, n_embd=128, n_positions=512)
    return str(path)


PROMPTS = ("ROMEO:", "JULIET:", "First Citizen:", "KING RICHARD III:", "HAMLET:", "MACBETH:", "LEAR:", "OTHELLO:",
           "PORTIA:", "BRUTUS:", "CLEOPATRA:", "PROSPERO:", "VIOLA:", "FALSTAFF:", "OPHELIA:", "IAGO:")


def _spec(model: str, max_tokens: int):
    from blockviz.live import EngineSpec

    return EngineSpec(model=model, prompts=PROMPTS, n=1, max_tokens=max_tokens, block_size=16,
                      num_gpu_blocks=512, num_cpu_blocks=64, device="cpu", seed=0)


def alone_in_a_process(spec, observed: bool = False) -> float:
    """The engine with no UI, in a fresh process stepping on its main thread, as the engine
    process of `blockviz run` does; `observed` attaches one subscriber that keeps every event
    (what being watched costs the engine itself: building events, K/V digests)."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_alone_child, args=(spec, observed, send))
    process.start()
    send.close()
    elapsed = receive.recv()
    process.join()
    return elapsed


def _alone_child(spec, observed: bool, out) -> None:
    out.send(_steps_alone(spec, spec.make_engine(), observed))


def _steps_alone(spec, engine, observed: bool = False) -> float:
    if observed:
        events: list = []
        engine.events.subscribe(events.append)
    for prompt in spec.prompts:
        engine.add_request(prompt, spec.sampling_params())
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
    return time.perf_counter() - start


async def _run_with_tui(spec, bridge, size: tuple[int, int]) -> tuple[float, int]:
    """Play the live app at "max" until the engine reports it finished; returns the engine's
    wall time (from pressing play to the engine's idle report reaching the app) and tokens."""
    from blockviz.app import BlockvizApp
    from blockviz.history import SPEEDS

    finished_at: list[float] = []
    finished = asyncio.Event()

    class TimedApp(BlockvizApp):
        def on_engine_idle(self, message) -> None:  # Textual calls BlockvizApp's handler next
            finished_at.append(time.perf_counter())
            finished.set()

    app = TimedApp(bridge=bridge, deterministic=True)
    async with app.run_test(size=size) as pilot:
        while app.player is None:
            await pilot.pause(0.01)
        while len(app.player.timeline) < len(spec.prompts):
            await pilot.pause(0.01)
        await pilot.pause(0.5)  # the first frame settles (layout), as it has before anyone presses play
        app.player.speed_index = len(SPEEDS) - 1
        start = time.perf_counter()
        app.action_toggle_play()  # what `space` does, without the test pilot's own overhead
        await finished.wait()  # (no polling here: this process's wake-ups are the UI's cost)
        while not app.player.timeline.at_end:  # the views catch up
            await asyncio.sleep(0.1)
        elapsed = finished_at[0] - start
        tokens = app.player.timeline.state.num_tokens_generated
    return elapsed, tokens


def with_tui_in_a_process(spec) -> tuple[float, int]:
    """What `blockviz run` does: the engine in its own process (blockviz/engine_process.py)."""
    from blockviz.engine_process import ProcessBridge

    bridge = ProcessBridge(spec)
    bridge.start()
    return asyncio.run(_run_with_tui(spec, bridge, (120, 36)))


def with_tui_in_a_thread(spec, loaded) -> tuple[float, int]:
    """The engine on a thread of the app's own process (EngineBridge, as the tests drive it)."""
    from blockviz.live import EngineBridge
    from engine import LLMEngine

    bridge = EngineBridge(spec, make_engine=lambda: LLMEngine(spec.engine_config(), loaded=loaded))
    return asyncio.run(_run_with_tui(spec, bridge, (120, 36)))


def bench_engine(model: str | None, rounds: int, max_tokens: int) -> None:
    from engine.model_loader import load_model

    model = model or (_bundled() or _tiny_model_dir())
    loaded = load_model(model, "cpu")
    spec = _spec(model, max_tokens)
    import torch

    threads = torch.get_num_threads()
    runs = {
        "alone": lambda: alone_in_a_process(spec),
        "observed": lambda: alone_in_a_process(spec, observed=True),
        "process": lambda: with_tui_in_a_process(spec),
        "thread": lambda: with_tui_in_a_thread(spec, loaded),
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    ratios: list[float] = []
    tokens = 0
    for round_no in range(rounds):
        # This machine's speed drifts by 10-20% over seconds; running the variants in the order
        # A B C D, then D C B A, and comparing within a round keeps the drift out of the ratio.
        order = list(runs) if round_no % 2 == 0 else list(reversed(runs))
        for name in order:
            result = runs[name]()
            elapsed, tokens = result if isinstance(result, tuple) else (result, tokens)
            times[name].append(elapsed)
            torch.set_num_threads(threads)  # the in-thread app leaves a core to its UI
        ratios.append(times["alone"][-1] / times["process"][-1])
    median = {name: statistics.median(values) for name, values in times.items()}
    base = median["alone"]

    def line(label: str, name: str, note: str) -> str:
        t = median[name]
        each = ", ".join(f"{tokens / v:.0f}" for v in times[name])
        return f"  {label:<34} {tokens / t:8.1f} tokens/s ({base / t:.2f}x; rounds {each}) {note}"

    print(f"engine: {model}, {len(spec.prompts)} requests x {max_tokens} tokens = {tokens} tokens, CPU, "
          f"{threads} torch threads (the in-thread app: {max(1, threads - 1)}), median of {rounds} "
          f"rounds; each run but the in-thread one in a fresh process")
    print(line("without TUI", "alone", ""))
    print(line("events subscribed, no UI", "observed", "(the engine's own cost of being watched)"))
    print(line("TUI attached (blockviz run)", "process", "(engine process, live app 120x36 at max)"))
    print(line("TUI attached, engine in a thread", "thread", "(one process: engine and UI share the GIL)"))
    ratio = statistics.median(ratios)
    print(f"  ratio: {ratio:.2f}x, the median of each round's attached/alone "
          f"(rounds {', '.join(f'{r:.2f}' for r in ratios)})  "
          f"[{'ok' if ratio >= 0.95 else 'BELOW TARGET'}: target >= 0.95x]")


def _bundled() -> str | None:
    path = ROOT / "engine" / "models" / "tiny-shakespeare"
    return "tiny-shakespeare" if (path / "config.json").is_file() else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("frames", "engine", "all"), default="all")
    parser.add_argument("--seconds", type=float, default=2.0, help="per frames/s measurement")
    parser.add_argument("--model", default=None, help="engine part: checkpoint (default: bundled, else a tiny GPT-2)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=256)
    args = parser.parse_args(argv)
    if args.part in ("frames", "all"):
        bench_frames(args.seconds)
    if args.part in ("engine", "all"):
        bench_engine(args.model, args.rounds, args.max_tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())
