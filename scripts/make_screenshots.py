"""Regenerate screenshots/*.svg: the TUI at key moments of the shipped traces (blockviz/traces/),
and screenshots/jupyter.png: the Jupyter Visualizer in JupyterLab, drawn by chromium.

    python scripts/make_screenshots.py            # --no-jupyter: only the TUI's SVGs

Each picture is the app replaying a real engine trace (headless, `App.run_test`), moved to the
moment worth seeing, then exported as SVG. Deterministic: no clock, no tokens/s, no cursor blink,
so rerunning on the same traces rewrites identical files.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from blockviz.tui.app import BlockvizApp  # noqa: E402
from blockviz.model.trace import Trace, read_trace  # noqa: E402

TRACES_DIR = ROOT / "blockviz" / "traces"
OUT_DIR = ROOT / "screenshots"


def after_first(kind: str, settle: tuple[str, ...] = ()) -> Callable[[Trace], int]:
    """Position just after the first `kind` event, plus the `settle` events that directly follow it
    (e.g. the K/V digests the engine reports once it has moved the data), at the end of the engine
    operation it is in (Timeline.landing): a picture of a state the engine can be in."""

    def find(trace: Trace) -> int:
        from blockviz.model.timeline import Timeline

        events = trace.events
        index = next(i for i, e in enumerate(events) if e.type == kind)
        position = index + 1
        while position < len(events) and events[position].type in settle:
            position += 1
        return Timeline.for_trace(trace).landing(position)

    return find


def after_step(number: int) -> Callable[[Trace], int]:
    def find(trace: Trace) -> int:
        return next(i + 1 for i, e in enumerate(trace.events) if e.type == "step_finished" and e.step == number)

    return find


@dataclass
class Shot:
    name: str
    trace: str
    position: Callable[[Trace], int]
    size: tuple[int, int] = (160, 44)
    projector: bool = False
    select: Callable[[Trace, int], tuple[str, int] | None] = lambda trace, position: None
    view: str = "tables"
    seq: Callable[[Trace, int], int] | None = None  # the sequence then selected (its "Why hit or miss")


def _event_block(kind: str, attr: str, device: str) -> Callable[[Trace, int], tuple[str, int]]:
    def select(trace: Trace, position: int) -> tuple[str, int]:
        event = next(e for e in trace.events[:position][::-1] if e.type == kind)
        value = getattr(event, attr)
        return device, value if isinstance(value, int) else value[0][1]

    return select


def after_revived_chunk(trace: Trace) -> int:
    """vLLM v1: just after the step plan (tokens_scheduled) that gives a preempted sequence a chunk of its prefill."""
    preempted: set[int] = set()
    for index, e in enumerate(trace.events):
        if e.type == "preempted":
            preempted.update(e.seq_ids)
        elif e.type == "tokens_scheduled" and any(
                s in preempted and c + n < t for s, c, n, t in
                zip(e.seq_ids, e.num_computed_tokens, e.num_new_tokens, e.num_tokens)):
            return index + 1
    raise ValueError("no chunk of a recomputed prefill in this trace")


def _first_block_of_chunked(trace: Trace, position: int) -> tuple[str, int]:
    plan = trace.events[position - 1]
    seq_id = next(s for s, c, n, t in zip(plan.seq_ids, plan.num_computed_tokens, plan.num_new_tokens,
                                          plan.num_tokens) if c + n < t)
    first = next(e for e in trace.events[:position][::-1]
                 if e.type in ("block_allocated", "prefix_cache_hit") and seq_id in e.seq_ids and e.logical_index == 0)
    return "gpu", first.block


def _hitting_seq(trace: Trace, position: int) -> int:
    """The sequence of the last prefix-cache hit before `position`: the request that hit."""
    return next(e for e in trace.events[:position][::-1] if e.type == "prefix_cache_hit").seq_ids[0]


SHOTS = [
    Shot("prefill", "prefill", after_step(1)),
    Shot("copy-on-write", "fork-cow", after_first("copy_on_write", ("slot_appended", "kv_digest")),
         select=_event_block("copy_on_write", "dst_block", "gpu")),
    Shot("prefix-hit", "prefix-hit", after_first("prefix_cache_hit", ("prefix_cache_hit",)), view="hashes",
         select=_event_block("prefix_cache_hit", "block", "gpu"), seq=_hitting_seq),
    Shot("swap-out", "swap", after_first("swap_out", ("block_freed", "sequence_freed", "preempted", "kv_digest")),
         select=_event_block("swap_out", "mapping", "cpu")),
    Shot("projector", "swap", after_first("swap_out", ("block_freed", "sequence_freed", "preempted", "kv_digest")),
         size=(100, 30), projector=True),
    Shot("vllm-v1", "v1-story", after_revived_chunk, select=_first_block_of_chunked),
    Shot("hybrid", "hybrid", after_first("blocks_skipped", ("block_freed",)),
         select=_event_block("block_freed", "block", "gpu")),
    Shot("sglang-radix", "sglang-story", after_first("radix_node_split", ("radix_lock_ref", "prefix_cache_hit")),
         view="radix"),
]


async def take(shot: Shot, traces_dir: Path, out_dir: Path) -> Path:
    trace = read_trace(traces_dir / f"{shot.trace}.jsonl")
    app = BlockvizApp(trace=trace, projector=shot.projector, deterministic=True, source_name=f"{shot.trace}.jsonl")
    out = out_dir / f"{shot.name}.svg"
    async with app.run_test(size=shot.size) as pilot:
        position = shot.position(trace)
        app.right_view = shot.view
        app.player.timeline.seek(position)
        selection = shot.select(trace, position)
        if selection is not None:
            device, number = selection
            app.query_one(f"#{device}").select(number)
        app.render_views()
        await pilot.pause()
        if shot.seq is not None:  # after the block's selection, which selects its first owner
            app.selected_seq = shot.seq(trace, position)
            app.render_views()
            await pilot.pause()
        out.write_text(app.export_screenshot(title=f"blockviz — {shot.name}"), encoding="utf-8")
    return out


JUPYTER_CELLS = [
    "from blockviz.jupyter import Visualizer\n"
    "viz = Visualizer.from_trace('fork-cow')\n"
    "cow = viz.run_until('copy_on_write')\n"
    "viz.select('gpu', cow.dst_block)",
    "viz",
]


def take_jupyter(out_dir: Path) -> Path:
    """The browser session of tests/test_jupyter_browser.py: JupyterLab runs a notebook on the
    fork-cow trace, chromium clicks one engine step, and the widget is saved as a PNG."""
    sys.path.insert(0, str(ROOT / "tests"))
    from jupyter_fixtures import (click_and_wait, launch_args, open_notebook, run_all_cells,
                                  start_jupyter_server, wait_for_visualizer)
    from playwright.sync_api import sync_playwright

    out = out_dir / "jupyter.png"
    with start_jupyter_server() as server, sync_playwright() as playwright:
        browser = playwright.chromium.launch(**launch_args())
        page = browser.new_page(viewport={"width": 1400, "height": 1100}, device_scale_factor=1)
        path = server.add_notebook("blockviz.ipynb", JUPYTER_CELLS)
        open_notebook(page, server, path)
        run_all_cells(page)
        wait_for_visualizer(page, num_cells=32 + 16)
        click_and_wait(page, "step_event")
        page.wait_for_timeout(300)  # one frame interval: the last frame is drawn
        page.locator(".blockviz").first.screenshot(path=str(out))
        browser.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces-dir", type=Path, default=TRACES_DIR)
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR)
    parser.add_argument("--no-jupyter", action="store_true", help="skip screenshots/jupyter.png (needs chromium)")
    args = parser.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for shot in SHOTS:
        out = asyncio.run(take(shot, args.traces_dir, args.out_dir))
        print(out.relative_to(ROOT) if out.is_relative_to(ROOT) else out)
    if not args.no_jupyter:
        out = take_jupyter(args.out_dir)
        print(out.relative_to(ROOT) if out.is_relative_to(ROOT) else out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
