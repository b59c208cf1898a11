"""A lesson's page in `blockviz site`: its notebook (lessons/NN_*.ipynb) read as a page, offline.

The page holds, in the notebook's order: the text cells as prose (markdown rendered here with
markdown-it-py, no script and no network), the code cells folded under "the notebook's code", and
each exercise (an answer cell, tagged `answer`, metadata blockviz.exercise) as a question with a
blank box for a printed handout and its answer (blockviz/lessons/key.py KEY) revealed on click,
or with no answer text at all in the student edition (`answers=False`).

Beside them, the lesson's own runs: scripts/record_lesson_traces.py runs each notebook with the
key's answers and records every Visualizer it shows into blockviz/traces/lessons/ (NN-NAME.jsonl,
and NN.json: the moments the cells froze, `viz.snapshot()` / `viz.show(at=...)`, and each
exercise's figure). The page draws each run's frozen picture (model/svg.py, from the trace alone)
after the cell that froze it, and shows each exercise's recorded figure with its answer. A lesson
with no recorded run shows the shipped traces that record what its engines do (LESSON_TRACES) at
their card stops instead. Nothing here imports torch: the page is made from the traces.
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from blockviz.webpage.page import Moment, moments, picture

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
LESSON_CSS = Path(__file__).resolve().parent / "lesson.css"
NOTEBOOK = re.compile(r"^(\d\d)_[a-z0-9_]+\.ipynb$")
# For a lesson with no recorded run (LESSON_RUNS_DIR): the shipped traces that record what its
# engines do (its notebook names the mechanism; the trace's header names the scenario that shows it).
LESSON_TRACES: dict[str, tuple[str, ...]] = {
    "01": ("prefill",),
    "02": ("prefill",),
    "03": ("prefill",),
    "04": ("fork-cow",),
    "05": ("prefix-hit",),
    "06": ("swap", "recompute"),
    "07": ("eviction",),
    "08": ("prefill",),
    "09": ("eviction",),
    "10": ("v1-story",),
    "11": ("hybrid",),
}
MAX_MOMENTS = 8  # pictures per trace on a lesson page: its first card stops (a trace with no card: its end)
# The lessons' own runs, recorded by scripts/record_lesson_traces.py: NN.json (the runs, their
# moments, the exercises' figures) beside one trace per Visualizer, NN-NAME.jsonl.
LESSON_RUNS_DIR = Path(__file__).resolve().parents[1] / "traces" / "lessons"
RUNS_FORMAT = "blockviz-lesson-runs"


def lessons_dir() -> Path:
    """The notebooks' folder of this checkout (lessons/ beside the blockviz package)."""
    return Path(__file__).resolve().parents[2] / "lessons"


def lesson_notebooks(folder: Path | None = None) -> dict[str, Path]:
    """Every lesson notebook in `folder` (lessons_dir()), by its two-digit number, in order."""
    folder = lessons_dir() if folder is None else folder
    if not folder.is_dir():
        return {}
    found = {}
    for path in sorted(folder.iterdir()):
        match = NOTEBOOK.match(path.name)
        if match and path.is_file():
            found.setdefault(match.group(1), path)
    return found


def state_digest(state: Any) -> dict[str, Any]:
    """What a picture of reducer state `state` shows, as plain values: each pool's block states
    (ReducerState.codes, one letter a block) and each sequence's block table. The recorder keeps it
    for every moment of a live run; a test compares it with the recorded trace reduced there."""
    return {"codes": {device: bytes(codes).decode("ascii") for device, codes in sorted(state.codes.items())},
            "tables": {str(seq_id): [[device, number] for device, number in table]
                       for seq_id, table in sorted(state.tables.items())}}


def recorded_lesson(number: str, folder: Path | None = None) -> dict[str, Any] | None:
    """Lesson `number`'s recorded runs (`folder`/NN.json, LESSON_RUNS_DIR by default), or None when
    it has none: {"runs": [{"name", "trace", "cell", "num_events", "moments": [{"position", "cell",
    "state"}]}], "figures": [{"exercise", "variable", "answer", "shown", "verdict"}], ...}: the value
    the key's answer cell gave the exercise's variable (as JSON, and as the cell writes it) and
    the check's verdict on it."""
    path = (LESSON_RUNS_DIR if folder is None else folder) / f"{number}.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("format") != RUNS_FORMAT:
        raise ValueError(f"{path} is not a lesson's recorded runs (format {data.get('format')!r})")
    return data


@dataclass
class RunPicture:
    """A recorded lesson run's picture at one of the lesson's moments (or at the run's end, for a
    run the lesson froze no moment of), shown on the page after notebook cell `cell`."""

    run: str
    position: int
    num_events: int
    cell: int
    svg: str
    lines: list[str] = field(default_factory=list)


@dataclass
class LessonRuns:
    """What a lesson page shows of the lesson's recorded runs: the pictures, in the notebook's
    order, and the figures by exercise ({"answer", "shown", "verdict", ...}: recorded_lesson's)."""

    pictures: list[RunPicture]
    figures: dict[str, dict[str, Any]]


def lesson_runs(number: str, folder: Path | None = None) -> LessonRuns | None:
    """Lesson `number`'s recorded runs drawn (model/svg.py, the frame the notebook draws: trace_frame
    of the run's trace reduced to each moment's position), or None when it has none recorded."""
    from blockviz.model.export import trace_frame
    from blockviz.model.svg import frame_svg
    from blockviz.model.timeline import Timeline
    from blockviz.model.trace import read_trace

    folder = LESSON_RUNS_DIR if folder is None else folder
    data = recorded_lesson(number, folder)
    if data is None:
        return None
    pictures = []
    for run in data["runs"]:
        trace = read_trace(folder / run["trace"])
        timeline = Timeline.for_trace(trace)
        title = f"lesson {number} · {run['name']}"
        stops = [(m["position"], m["cell"]) for m in run["moments"]] or [(len(trace.events), run["last_cell"])]
        for position, cell in stops:
            timeline.seek(position)
            frame = trace_frame(timeline, trace.header, title)
            cursor = frame["cursor"]
            lines = [f"event {position} of {len(trace.events)}" + (f", {cursor['step']}" if cursor.get("step") else "")]
            if cursor.get("current"):
                lines.append(cursor["current"])
            pictures.append(RunPicture(run["name"], position, len(trace.events), cell, frame_svg(frame, title=title), lines))
    pictures.sort(key=lambda p: p.cell)
    return LessonRuns(pictures, {f["exercise"]: f for f in data["figures"]})


def _run_picture_html(shot: RunPicture) -> str:
    text = "".join(f"<p>{html.escape(line)}</p>" for line in shot.lines)
    return (f'<figure class="bv-moment bv-lesson-run" data-run="{html.escape(shot.run)}" data-position="{shot.position}">'
            f'<figcaption><h4>the run <code>{html.escape(shot.run)}</code>, recorded</h4>{text}</figcaption>'
            f'{picture(shot.svg, f"the run {shot.run} at event {shot.position}")}</figure>')


def page_name(number: str) -> str:
    return f"lesson-{number}.html"


def trace_moments(name: str, limit: int = MAX_MOMENTS) -> list[Moment]:
    """Pictures of shipped trace `name` (page.moments), at most `limit`."""
    from blockviz.jupyter.visualizer import Visualizer

    viz = Visualizer.from_trace(name)
    try:
        return moments(viz, limit)
    finally:
        viz.close()


def _markdown():
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": False}).enable("table")


def _links(rendered: str) -> str:
    """Links to a lesson notebook go to its page."""
    return re.sub(r'href="(\d\d)_[a-z0-9_]+\.ipynb(#[^"]*)?"', lambda m: f'href="{page_name(m.group(1))}"', rendered)


def _source(cell: dict[str, Any]) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def _exercise_of(cell: dict[str, Any]) -> str | None:
    meta = cell.get("metadata") or {}
    exercise = (meta.get("blockviz") or {}).get("exercise") if isinstance(meta.get("blockviz"), dict) else None
    return exercise if isinstance(exercise, str) else None


def _tags(cell: dict[str, Any]) -> list[str]:
    tags = (cell.get("metadata") or {}).get("tags") or []
    return [t for t in tags if isinstance(t, str)]


def _moments_html(moments: dict[str, list[Moment]], linked: set[str]) -> list[str]:
    if not moments:
        return []
    parts = ['<section class="bv-lesson-runs"><h2>The lesson\'s runs, recorded</h2>',
             "<p>Pictures of a real engine's run that does what this lesson's cells do, frozen where "
             "each new idea happens. Open the run's page to play it and click its blocks.</p>"]
    for name, shots in moments.items():
        link = (f' · <a href="{html.escape(name)}.html">play it</a>' if name in linked else "")
        parts.append(f'<h3 class="bv-lesson-run" data-trace="{html.escape(name)}">trace {html.escape(name)}{link}</h3>')
        for shot in shots:
            text = "".join(f"<p>{html.escape(line)}</p>" for line in shot.lines)
            parts.append(f'<figure class="bv-moment" data-trace="{html.escape(name)}" data-position="{shot.position}">'
                         f'<figcaption><h4>{html.escape(shot.title)}</h4>{text}</figcaption>'
                         f'{picture(shot.svg, f"{name} at event {shot.position}")}</figure>')
    parts.append("</section>")
    return parts


def lesson_title(path: Path) -> str:
    """The notebook's first heading (its title), or its file name."""
    for cell in json.loads(path.read_text(encoding="utf-8")).get("cells", []):
        if cell.get("cell_type") == "markdown":
            for line in _source(cell).splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return path.stem


def lesson_goal(path: Path) -> str:
    """The first sentence of the notebook's goal (its "**Goal.**" paragraph), as plain text; "" if none."""
    for cell in json.loads(path.read_text(encoding="utf-8")).get("cells", []):
        for paragraph in _source(cell).split("\n\n") if cell.get("cell_type") == "markdown" else ():
            if paragraph.startswith("**Goal.**"):
                text = re.sub(r"[*`]", "", paragraph[len("**Goal.**"):]).strip()
                return re.split(r"(?<=[.!?])\s", text, maxsplit=1)[0]
    return ""


def lesson_page(path: Path, *, answers: bool = True, moments: dict[str, list[Moment]] | None = None,
                linked: set[str] = frozenset(), index: str | None = "index.html", runs: LessonRuns | None = None) -> str:
    """The page of lesson notebook `path`. `answers=False`: the student edition, with no answer
    text (KEY's, or a figure of the recorded runs) anywhere in it. `runs`: the lesson's own recorded
    runs (lesson_runs), each picture after the cell that froze it and each exercise's recorded
    figure with its answer; `moments`: pictures of shipped traces by name (trace_moments), for a
    lesson with no recorded run; `linked`: the traces whose pages sit beside it; `index`: the
    site's index, linked at the top."""
    from blockviz.lessons.key import KEY

    notebook = json.loads(path.read_text(encoding="utf-8"))
    md = _markdown()
    title = lesson_title(path)
    body = []
    shots: dict[int, list[RunPicture]] = {}
    for shot in runs.pictures if runs is not None else ():
        shots.setdefault(shot.cell, []).append(shot)
    figures = runs.figures if runs is not None else {}
    for number, cell in enumerate(notebook.get("cells", [])):
        kind, source = cell.get("cell_type"), _source(cell)
        exercise = _exercise_of(cell)
        if kind == "markdown":
            body.append(f'<div class="bv-prose">{_links(md.render(source))}</div>')
        elif kind == "code" and exercise and "answer" in _tags(cell):
            blank = source.strip()
            answer = ""
            if answers and exercise in KEY:
                figure = figures.get(exercise)
                recorded = (f'<p class="bv-figure" data-answer="{html.escape(json.dumps(figure["answer"]))}" '
                            f'data-verdict="{html.escape(figure["verdict"])}">In the recorded run: '
                            f'<code>{html.escape(figure["variable"])} = {html.escape(figure["shown"])}</code>, '
                            f'and the check said {html.escape(figure["verdict"])}.</p>' if figure else "")
                answer = (f'<details class="bv-answer"><summary>Show the answer</summary>'
                          f"<pre>{html.escape(KEY[exercise])}</pre>{recorded}</details>")
            body.append(f'<div class="bv-exercise" data-exercise="{html.escape(exercise)}">'
                        f'<p class="bv-exercise-line">Your answer: <code>{html.escape(blank)}</code></p>'
                        f'<div class="bv-answer-box"></div>{answer}</div>')
        elif kind == "code" and exercise:
            continue  # the check cell: it needs the notebook's kernel
        elif kind == "code" and source.strip():
            body.append(f'<details class="bv-code"><summary>the notebook\'s code</summary>'
                        f"<pre>{html.escape(source)}</pre></details>")
        body.extend(_run_picture_html(shot) for shot in shots.get(number, ()))
    top = f'<nav class="bv-nav"><a href="{html.escape(index)}">all lessons and runs</a></nav>' if index else ""
    edition = "" if answers else '<p class="bv-edition">Student edition: the answers are left out.</p>'
    return "\n".join([
        "<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title>",
        f"<style>{LESSON_CSS.read_text(encoding='utf-8')}</style>", "</head>",
        f'<body class="bv-lesson" data-answers="{str(answers).lower()}">', top, edition,
        *body, *_moments_html(moments or {}, set(linked)),
        '<p class="bv-notebook">In the notebook (lessons/' + html.escape(path.name) + ") every cell runs a live "
        "engine and each exercise checks your answer.</p>",
        "</body></html>"])
