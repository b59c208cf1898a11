"""TUI benchmark (figures, not a test): how fast the pool view draws, and what the TUI costs the engine.

    python benchmarks/tui.py                  # both parts
    python benchmarks/tui.py --part frames    # pool view only (no torch)
    python benchmarks/tui.py --part engine --model DIR

1. Frames/s of the pool view on a 4,096-block GPU pool under a stream of real BlockSpaceManager
   events (headless): each frame applies a batch of events to the timeline's reducer, hands the
   state to the PoolGrid and renders every visible line through Textual's Widget.render_lines.
   Also the whole app (every panel, Textual's compositor) end to end. Target: >= 30 frames/s.
2. The engine's tokens/s with the TUI attached (live app, headless, playing at "max") against the
   same engine with nothing attached, in one run, alternating, same loaded model, both stepping on
   a non-main thread. A third figure, the engine with one subscriber and no UI, separates what
   being watched costs the engine itself (building events, K/V digests) from what the UI costs.
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


PROMPTS = ("ROMEO:", "JULIET:", "First Citizen:", "KING RICHARD III:", "HAMLET:", "MACBETH:", "LEAR:", "OTHELLO:")


def _spec(model: str, max_tokens: int):
    from blockviz.live import EngineSpec

    return EngineSpec(model=model, prompts=PROMPTS, n=1, max_tokens=max_tokens, block_size=16,
                      num_gpu_blocks=512, num_cpu_blocks=64, device="cpu", seed=0)


def run_without_tui(spec, loaded) -> float:
    """The same engine stepping on a plain thread, nothing subscribed (the TUI's engine runs on a
    worker thread too; torch's intra-op threading differs between the main thread and others)."""
    import threading

    result: list[float] = []
    thread = threading.Thread(target=lambda: result.append(_steps_alone(spec, loaded)))
    thread.start()
    thread.join()
    return result[0]


def run_observed(spec, loaded) -> float:
    """The engine on a plain thread with one subscriber collecting its events (what being watched
    costs the engine itself: building events and K/V digests), no UI."""
    import threading

    result: list[float] = []
    thread = threading.Thread(target=lambda: result.append(_steps_alone(spec, loaded, observed=True)))
    thread.start()
    thread.join()
    return result[0]


def _steps_alone(spec, loaded, observed: bool = False) -> float:
    from engine import LLMEngine

    engine = LLMEngine(spec.engine_config(), loaded=loaded)
    if observed:
        events: list = []
        engine.events.subscribe(events.append)
    for prompt in spec.prompts:
        engine.add_request(prompt, spec.sampling_params())
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
    return time.perf_counter() - start


async def _run_with_tui(spec, loaded, size: tuple[int, int]) -> tuple[float, int]:
    from blockviz.app import BlockvizApp
    from blockviz.history import SPEEDS
    from blockviz.live import EngineBridge
    from engine import LLMEngine

    bridge = EngineBridge(spec, make_engine=lambda: LLMEngine(spec.engine_config(), loaded=loaded))
    app = BlockvizApp(bridge=bridge, deterministic=True)
    async with app.run_test(size=size) as pilot:
        while app.player is None:
            await pilot.pause(0.01)
        while len(app.player.timeline) < len(spec.prompts):
            await pilot.pause(0.01)
        app.player.speed_index = len(SPEEDS) - 1
        start = time.perf_counter()
        app.action_toggle_play()  # what `space` does, without the test pilot's own overhead
        while not (app.player.finished and app.player.timeline.at_end):
            await asyncio.sleep(0.01)
        elapsed = time.perf_counter() - start
        tokens = app.player.timeline.state.num_tokens_generated
    return elapsed, tokens


def bench_engine(model: str | None, rounds: int, max_tokens: int) -> None:
    from engine.model_loader import load_model

    model = model or (_bundled() or _tiny_model_dir())
    loaded = load_model(model, "cpu")
    spec = _spec(model, max_tokens)
    import torch

    threads = torch.get_num_threads()  # the engine alone uses every core; the live app leaves one
    run_without_tui(spec, loaded)  # warm-up
    base, observed, attached, tokens = [], [], [], 0
    for _ in range(rounds):
        torch.set_num_threads(threads)
        base.append(run_without_tui(spec, loaded))
        observed.append(run_observed(spec, loaded))
        elapsed, tokens = asyncio.run(_run_with_tui(spec, loaded, (120, 36)))
        attached.append(elapsed)
    torch.set_num_threads(threads)
    t_base, t_obs, t_tui = statistics.median(base), statistics.median(observed), statistics.median(attached)
    print(f"engine: {model}, {len(PROMPTS)} requests x {max_tokens} tokens = {tokens} tokens, CPU, "
          f"median of {rounds} alternating runs; {threads} torch threads alone, "
          f"{max(1, threads - 1)} under the TUI")
    print(f"  without TUI: {tokens / t_base:8.1f} tokens/s ({t_base:.2f} s)")
    print(f"  events subscribed, no UI: {tokens / t_obs:8.1f} tokens/s ({t_obs:.2f} s, {t_base / t_obs:.2f}x: "
          f"the engine's own cost of being watched)")
    print(f"  TUI attached: {tokens / t_tui:8.1f} tokens/s ({t_tui:.2f} s, live app 120x36 playing at max)")
    ratio = t_base / t_tui
    print(f"  ratio: {ratio:.2f}x  [{'ok' if ratio >= 0.95 else 'BELOW TARGET'}: target >= 0.95x]")


def _bundled() -> str | None:
    path = ROOT / "engine" / "models" / "tiny-shakespeare"
    return "tiny-shakespeare" if (path / "config.json").is_file() else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("frames", "engine", "all"), default="all")
    parser.add_argument("--seconds", type=float, default=2.0, help="per frames/s measurement")
    parser.add_argument("--model", default=None, help="engine part: checkpoint (default: bundled, else a tiny GPT-2)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=256)
    args = parser.parse_args(argv)
    if args.part in ("frames", "all"):
        bench_frames(args.seconds)
    if args.part in ("engine", "all"):
        bench_engine(args.model, args.rounds, args.max_tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())
