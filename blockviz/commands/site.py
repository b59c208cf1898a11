"""`blockviz site DIR [--traces NAME ...] [--lessons NN ...] [--no-answers] [--force]`: a static
folder a teacher copies to any web host or hands out as a zip: index.html lists every lesson and
every shipped trace (the stories first) with a picture and one line each, and links each trace's
page (`blockviz export TRACE --html`) and each lesson's page (blockviz/webpage/lesson.py: its text,
its exercises with their answers revealed on click, or none with --no-answers, and its recorded
runs' pictures).

Every page works offline (blockviz/webpage/page.py). The folder is made beside DIR under a
temporary name and renamed into place once whole, so a failure leaves nothing half-written.
"""

from __future__ import annotations

import html
import shutil
import sys
import tempfile
from pathlib import Path

from blockviz.errors import UsageError

INDEX_CSS = """body { font-family: sans-serif; margin: 2em auto; max-width: 64em; color: #222; }
.bv-site-trace { display: flex; gap: 1.5em; align-items: flex-start; margin: 1.5em 0; }
.bv-site-trace img { width: 24em; border: 1px solid #ddd; }
.bv-site-trace h2 { margin: 0 0 0.3em; font-size: 1.2em; }
.bv-site-story { font-size: 0.8em; color: #555; }
.bv-site-lessons li { margin: 0.5em 0; }
.bv-site-goal { font-size: 0.9em; color: #444; }"""


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "site", help="write a folder of offline pages: an index of the shipped traces, a page per trace",
        description="Write DIR: index.html (each shipped trace with a picture and one line) and one page per "
                    "trace that plays it in a browser, offline (as `blockviz export TRACE --html`).")
    parser.add_argument("dir", metavar="DIR", help="the folder to make (it must not exist, unless --force)")
    parser.add_argument("--traces", nargs="+", metavar="NAME", help="these shipped traces (default: all)")
    parser.add_argument("--lessons", nargs="+", metavar="NN", help="these lessons, by number (default: all)")
    parser.add_argument("--no-answers", action="store_true",
                        help="the student edition: the exercises without their answers")
    parser.add_argument("--force", action="store_true", help="replace DIR if it exists")


def _check(args) -> tuple[Path, list[str], dict[str, Path]]:
    from blockviz.model.trace import shipped_traces
    from blockviz.webpage.lesson import lesson_notebooks

    out = Path(args.dir)
    if not out.parent.is_dir():
        raise UsageError(f"{str(out)!r}: directory {str(out.parent)!r} does not exist")
    if out.exists() and not (args.force and out.is_dir()):
        raise UsageError(f"{str(out)!r} already exists: give another name, or --force to replace it")
    names = shipped_traces()
    chosen = args.traces or names
    unknown = [name for name in chosen if name not in names]
    if unknown:
        raise UsageError(f"no shipped trace {unknown[0]!r} (shipped traces: {', '.join(names)})")
    notebooks = lesson_notebooks()
    lessons = args.lessons or list(notebooks)
    unknown = [number for number in lessons if number not in notebooks]
    if unknown:
        raise UsageError(f"no lesson {unknown[0]!r} (lessons: {', '.join(notebooks) or 'none in this checkout'})")
    return out, list(dict.fromkeys(chosen)), {number: path for number, path in notebooks.items() if number in lessons}


def _entry(name: str, folder: Path) -> tuple[bool, str]:
    """Write `name`'s page and picture into `folder`; returns (a story, its index entry)."""
    from blockviz.model.export import save_frame, trace_frame, trace_title
    from blockviz.model.timeline import Timeline
    from blockviz.model.trace import load_trace
    from blockviz.session.scenario import is_story
    from blockviz.webpage.page import trace_page, write_atomic

    trace = load_trace(name)
    write_atomic(folder / f"{name}.html", trace_page(trace))
    timeline = Timeline.for_trace(trace)
    timeline.seek(len(timeline))
    save_frame(trace_frame(timeline, trace.header, trace_title(trace)), folder / f"{name}.svg")
    story = is_story(trace.header)
    line = trace.header.get("description") or trace_title(trace)
    entry = (f'<div class="bv-site-trace" data-trace="{html.escape(name)}">'
             f'<a href="{html.escape(name)}.html"><img src="{html.escape(name)}.svg" alt="{html.escape(name)} at its end"></a>'
             f'<div><h2><a href="{html.escape(name)}.html">{html.escape(name)}</a></h2>'
             f'<p>{html.escape(line)}</p>'
             + ('<p class="bv-site-story">a story: playing stops at each new idea with a card</p>' if story else "")
             + "</div></div>")
    return story, entry


def _lesson(number: str, path: Path, folder: Path, traces: list[str], answers: bool,
            cache: dict[str, list]) -> str:
    """Write lesson `number`'s page into `folder`; returns its index entry."""
    from blockviz.webpage.lesson import (LESSON_TRACES, lesson_goal, lesson_page, lesson_runs, lesson_title, page_name,
                                         trace_moments)
    from blockviz.webpage.page import write_atomic

    recorded = lesson_runs(number)
    shipped = {}
    for name in LESSON_TRACES.get(number, ()) if recorded is None else ():  # a lesson with no recorded run
        if name not in cache:
            cache[name] = trace_moments(name)
        shipped[name] = cache[name]
    write_atomic(folder / page_name(number), lesson_page(path, answers=answers, moments=shipped, linked=set(traces),
                                                         runs=recorded))
    goal = lesson_goal(path)
    return (f'<li data-lesson="{html.escape(number)}"><a href="{page_name(number)}">{html.escape(lesson_title(path))}</a>'
            + (f'<br><span class="bv-site-goal">{html.escape(goal)}</span>' if goal else "") + "</li>")


def index_html(entries: list[tuple[bool, str]], lessons: list[str] = ()) -> str:
    """The index: the lessons, then the stories, then the other traces, in the order given."""
    ordered = [entry for story, entry in entries if story] + [entry for story, entry in entries if not story]
    listed = (['<h2>Lessons</h2>', '<ul class="bv-site-lessons">', *lessons, "</ul>"] if lessons else [])
    runs = ["<h2>Recorded runs</h2>"] if lessons and ordered else []
    return "\n".join([
        "<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
        "<title>blockviz: paged KV-cache lessons</title>", f"<style>{INDEX_CSS}</style>", "</head><body>",
        "<h1>blockviz: a real paged-KV engine's blocks, step by step</h1>",
        "<p>Each page plays a recorded run of a real engine in your browser, offline: press play, or "
        "drag the slider; click a block to inspect it.</p>",
        *listed, *runs, *ordered, "</body></html>"])


def execute(args) -> int:
    out, names, notebooks = _check(args)
    building = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".part", dir=out.parent))
    try:
        entries = []
        for name in names:
            print(f"{name}…", file=sys.stderr, flush=True)
            entries.append(_entry(name, building))
        lessons, cache = [], {}
        for number, path in notebooks.items():
            print(f"lesson {number}…", file=sys.stderr, flush=True)
            lessons.append(_lesson(number, path, building, names, not args.no_answers, cache))
        (building / "index.html").write_text(index_html(entries, lessons), encoding="utf-8")
        building.chmod(0o755)
        if out.exists():
            shutil.rmtree(out)
        building.rename(out)
    except OSError as exc:
        raise UsageError(f"cannot write {str(out)!r}: {exc.strerror or exc}") from None
    finally:
        if building.exists():
            shutil.rmtree(building, ignore_errors=True)
    edition = " (student edition: no answers)" if args.no_answers else ""
    print(f"wrote {out}: index.html, {len(names)} trace pages and {len(notebooks)} lesson pages{edition}",
          file=sys.stdout)
    return 0
