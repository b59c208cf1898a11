"""TUI benchmark (figures, not a test): how fast the pool view draws, and what the TUI costs the engine.

    python benchmarks/tui.py                  # both parts
    python benchmarks/tui.py --part frames    # pool view only (no torch)
    python benchmarks/tui.py --part engine --model DIR
    python benchmarks/tui.py --part engine --gpt2-shape --max-tokens 64 --rounds 5 --no-thread
                                              # a random GPT-2-small-shaped model: --model gpt2's speed

1. Frames/s of the pool view on a 4,096-block GPU pool under a stream of real BlockSpaceManager
   events (headless): each frame applies a batch of events to the timeline's reducer, hands the
   state to the PoolGrid and renders every visible line through Textual's Widget.render_lines.
   Also the whole app (every panel, Textual's compositor) end to end. Target: >= 30 frames/s.
2. The engine's tokens/s with the TUI attached (live app, headless, playing at "max", the engine
   in its own process as `blockviz run` runs it) against the same engine with nothing attached.
   Each round starts an engine process that, once loaded and before the app starts, warms up and
   times the workload alone and with one subscriber keeping every event (what being watched costs
   the engine itself: building events, K/V digests); then the app attaches and the same engine
   runs the workload again, timed from pressing play to the engine's report that it finished
   reaching the app. Comparing within one process matters here: fresh processes differ in speed
   by up to a third on this machine. The ratio is the median of the rounds' ratios. One more
   figure: the app with the engine on a thread of its own process (why blockviz runs it in a
   process). Target the ratio >= 0.95x.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from blockviz.live import EngineSpec  # noqa: E402  (no torch: the frames part runs without it)

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


def _gpt2_shape_dir() -> str:
    """A random checkpoint shaped like GPT-2 small (12 layers, 768 wide, 50,257 tokens): what
    `--model gpt2` runs, built here since nothing can be downloaded (benchmarks/throughput.py)."""
    from throughput import build_model

    print("building a random GPT-2-small-shaped checkpoint (~500 MB)...", flush=True)
    return str(build_model(Path(tempfile.mkdtemp(prefix="blockviz-bench-")) / "gpt2-shape", 12, 768, 12))


def _tiny_model_dir() -> str:
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import make_tiny_gpt2

    path = Path(tempfile.mkdtemp(prefix="blockviz-bench-")) / "tiny-gpt2"
    make_tiny_gpt2(path, n_layer=4, n_embd=128, n_positions=512)
    return str(path)


PROMPTS = ("ROMEO:", "JULIET:", "First Citizen:", "KING RICHARD III:", "HAMLET:", "MACBETH:", "LEAR:", "OTHELLO:",
           "PORTIA:", "BRUTUS:", "CLEOPATRA:", "PROSPERO:", "VIOLA:", "FALSTAFF:", "OPHELIA:", "IAGO:")


def _spec(model: str, max_tokens: int):
    return EngineSpec(model=model, prompts=PROMPTS, n=1, max_tokens=max_tokens, block_size=16,
                      num_gpu_blocks=512, num_cpu_blocks=64, device="cpu", seed=0)


def _steps_alone(spec, engine, observed: bool = False) -> float:
    """Run the spec's requests to the end on `engine` with nothing attached (`observed`: one
    subscriber keeping every event: what being watched costs the engine itself, building events
    and K/V digests); returns the wall time of the steps."""
    unsubscribe = engine.events.subscribe([].append) if observed else None
    for prompt in spec.prompts:
        engine.add_request(prompt, spec.sampling_params())
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
    elapsed = time.perf_counter() - start
    if unsubscribe is not None:
        unsubscribe()
    return elapsed


def _time_alone(spec, engine, observed_first: bool) -> dict[str, float]:
    """A warm-up run of the whole workload, then the workload alone and observed (in the order
    given). The warm-up is the whole workload: the first run at each context length is slower
    (kernels and buffers for new shapes), and a shorter warm-up left that cost in whichever
    measured run came first."""
    _steps_alone(spec, engine)
    times = {}
    for observed in (observed_first, not observed_first):
        times["observed" if observed else "alone"] = _steps_alone(spec, engine, observed)
    return times


@dataclass(slots=True)
class TimedSpec(EngineSpec):
    """The spec the attached run's engine process is given: once loaded, and before the app
    exists, its make_engine times the same workload alone (and observed) on the same engine in
    the same process, and writes the times to `result_path`. Fresh processes differ in speed by
    up to a third on this machine (where their memory and threads land); comparing within one
    process keeps that out of the ratio."""

    result_path: str = ""
    observed_first: bool = False

    def make_engine(self):
        engine = EngineSpec.make_engine(self)  # (no zero-argument super() in a slots dataclass)
        times = _time_alone(self, engine, self.observed_first)
        Path(self.result_path).write_text(json.dumps(times))
        return engine


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


def attached_round(spec, observed_first: bool) -> dict[str, float]:
    """What `blockviz run` does: the engine in its own process (blockviz/engine_process.py), the
    live app at 120x36. The same engine process first times the workload with nothing attached
    (TimedSpec); the app starts once that is done, so nothing else runs meanwhile."""
    from blockviz.engine_process import ProcessBridge

    result = Path(tempfile.mkdtemp(prefix="blockviz-bench-")) / "alone.json"
    bridge = ProcessBridge(TimedSpec(**spec.as_dict(), result_path=str(result), observed_first=observed_first))
    bridge.start()
    while not result.exists():
        if not bridge._process.is_alive():
            raise RuntimeError(f"the engine process exited with code {bridge._process.exitcode}")
        time.sleep(0.05)
    times = json.loads(result.read_text())
    times["attached"], times["tokens"] = asyncio.run(_run_with_tui(spec, bridge, (120, 36)))
    return times


def thread_round(spec, loaded, observed_first: bool) -> dict[str, float]:
    """The app with the engine on a thread of its own process (EngineBridge, as the tests drive
    it), against the same engine alone in this process first."""
    from blockviz.live import EngineBridge
    from engine import LLMEngine

    engine = LLMEngine(spec.engine_config(), loaded=loaded)
    times = _time_alone(spec, engine, observed_first)
    bridge = EngineBridge(spec, make_engine=lambda: engine)
    times["attached"], times["tokens"] = asyncio.run(_run_with_tui(spec, bridge, (120, 36)))
    return times


def bench_engine(model: str | None, rounds: int, max_tokens: int, thread: bool) -> None:
    from engine.model_loader import load_model

    model = model or (_bundled() or _tiny_model_dir())
    loaded = load_model(model, "cpu")
    spec = _spec(model, max_tokens)
    import torch

    threads = torch.get_num_threads()
    kinds = {"process": lambda observed_first: attached_round(spec, observed_first)}
    if thread:
        kinds["thread"] = lambda observed_first: thread_round(spec, loaded, observed_first)
    results: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
    for round_no in range(rounds):
        for kind in (list(kinds) if round_no % 2 == 0 else list(reversed(kinds))):
            results[kind].append(kinds[kind](round_no % 2 == 1))
            torch.set_num_threads(threads)  # the in-thread app leaves a core to its UI
    tokens = int(results["process"][0]["tokens"])

    def line(label: str, kind: str, name: str, note: str) -> tuple[str, float]:
        rates = [tokens / r[name] for r in results[kind]]
        per_round = [r["alone"] / r[name] for r in results[kind]]
        ratio = statistics.median(per_round)
        low, _, high = statistics.quantiles(per_round, n=4) if len(per_round) > 1 else (ratio,) * 3
        return (f"  {label:<34} {statistics.median(rates):7.1f} tokens/s  {ratio:.2f}x (middle half "
                f"{low:.2f}-{high:.2f}; rounds {', '.join(f'{r:.2f}' for r in per_round)}) {note}"), ratio

    print(f"engine: {model}, {len(spec.prompts)} requests x {max_tokens} tokens = {tokens} tokens, CPU, "
          f"{threads} torch threads, {rounds} rounds; each round compares runs of one engine in one process "
          f"(after a warm-up); a ratio is the median of the rounds' ratios")
    print(line("without TUI", "process", "alone", "(in the engine process, before the app starts)")[0])
    print(line("events subscribed, no UI", "process", "observed", "(the engine's own cost of being watched)")[0])
    text, ratio = line("TUI attached (blockviz run)", "process", "attached", "(engine process, live app 120x36 at max)")
    print(text)
    if thread:
        print(line("TUI attached, engine in a thread", "thread", "attached",
                   f"(one process, engine on {max(1, threads - 1)} torch threads: engine and UI share the GIL)")[0])
    print(f"  ratio: {ratio:.2f}x with the TUI attached  [{'ok' if ratio >= 0.95 else 'BELOW TARGET'}: "
          f"target >= 0.95x]", flush=True)


def _bundled() -> str | None:
    path = ROOT / "engine" / "models" / "tiny-shakespeare"
    return "tiny-shakespeare" if (path / "config.json").is_file() else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("frames", "engine", "all"), default="all")
    parser.add_argument("--seconds", type=float, default=2.0, help="per frames/s measurement")
    parser.add_argument("--model", default=None, help="engine part: checkpoint (default: bundled, else a tiny GPT-2)")
    parser.add_argument("--gpt2-shape", action="store_true",
                        help="engine part: a random GPT-2-small-shaped checkpoint (the speed of --model gpt2)")
    parser.add_argument("--rounds", type=int, default=9,
                        help="engine part: rounds (this machine drifts; more rounds, steadier median)")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--no-thread", action="store_true", help="engine part: skip the engine-in-a-thread figure")
    args = parser.parse_args(argv)
    if args.part in ("frames", "all"):
        bench_frames(args.seconds)
    if args.part in ("engine", "all"):
        model = _gpt2_shape_dir() if args.gpt2_shape else args.model
        bench_engine(model, args.rounds, args.max_tokens, not args.no_thread)
    return 0


if __name__ == "__main__":
    sys.exit(main())
