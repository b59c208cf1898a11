"""Exported pages (`blockviz export TRACE --html`): per shipped trace, the page's size, the time
to make it, and the time from opening it in chromium (file URL, every other request refused) to
its first frame painted (the page's data-first-frame-ms: performance.now() at the first
animation frame after the views drew).

    python benchmarks/html_page.py                 # every shipped trace
    python benchmarks/html_page.py --smoke         # two small traces, once
    python benchmarks/html_page.py --traces swap hybrid --repeats 5

Prints a table and one `figures: {...}` line; `unavailable: chromium ...` when there is none.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

SMOKE_TRACES = ("prefix-hit", "fork-cow")


def shipped() -> list[str]:
    return sorted(path.stem for path in (ROOT / "blockviz" / "traces").glob("*.jsonl"))


def make_pages(names: list[str], out: Path) -> dict[str, dict]:
    from blockviz.webpage.page import trace_page, write_atomic

    rows = {}
    for name in names:
        started = time.perf_counter()
        text = trace_page(name)
        seconds = time.perf_counter() - started
        path = write_atomic(out / f"{name}.html", text)
        rows[name] = {"path": path, "bytes": path.stat().st_size, "export_s": seconds}
    return rows


def first_frames(rows: dict[str, dict], repeats: int) -> str | None:
    """Each page's first-frame time (the median of `repeats` fresh opens) into its row; returns why
    chromium could not run, or None."""
    try:
        from jupyter_fixtures import chromium_path, launch_args
        from playwright.sync_api import sync_playwright

        chromium_path()
    except BaseException as exc:  # noqa: BLE001 - pytest.skip's exception too: say why and go on
        return f"chromium: {exc}".splitlines()[0]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(**launch_args())
        try:
            for row in rows.values():
                times = []
                for _ in range(repeats):
                    context = browser.new_context(viewport={"width": 1400, "height": 1000})
                    page = context.new_page()
                    page.route("**", lambda r: r.continue_() if r.request.url.startswith("file://") else r.abort())
                    page.goto(row["path"].as_uri())
                    page.wait_for_function("() => document.getElementById('bv-page').dataset.firstFrameMs",
                                           timeout=60_000)
                    times.append(float(page.get_attribute("#bv-page", "data-first-frame-ms")))
                    context.close()
                row["first_frame_ms"] = statistics.median(times)
        finally:
            browser.close()
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="two small traces, opened once")
    parser.add_argument("--traces", nargs="*", help="shipped trace names (default: all)")
    parser.add_argument("--repeats", type=int, default=3, help="opens per page (the median is kept)")
    args = parser.parse_args(argv)
    names = list(SMOKE_TRACES) if args.smoke else (args.traces or shipped())
    repeats = 1 if args.smoke else args.repeats
    with tempfile.TemporaryDirectory() as folder:
        rows = make_pages(names, Path(folder))
        why = first_frames(rows, repeats)
    print(f"{'trace':12} {'page KiB':>9} {'export s':>9} {'first frame ms':>15}")
    figures = {}
    for name, row in rows.items():
        frame = row.get("first_frame_ms")
        print(f"{name:12} {row['bytes'] / 1024:9.0f} {row['export_s']:9.1f} {'-' if frame is None else f'{frame:15.0f}':>15}")
        figures[f"{name}_kib"] = round(row["bytes"] / 1024, 1)
        figures[f"{name}_export_s"] = round(row["export_s"], 2)
        if frame is not None:
            figures[f"{name}_first_frame_ms"] = round(frame, 1)
    if why:
        print(f"unavailable: {why}")
    print("figures: " + json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
