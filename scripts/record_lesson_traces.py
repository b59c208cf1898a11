"""Record the lessons' own runs into blockviz/traces/lessons/, for `blockviz site`'s lesson pages.

    python scripts/record_lesson_traces.py            # every lesson notebook (lessons/NN_*.ipynb)
    python scripts/record_lesson_traces.py --only 04  # one or more lessons
    python scripts/record_lesson_traces.py --out DIR  # somewhere else (a test compares with the shipped files)

Each lesson runs in a fresh Python process: its notebook's code cells in order, in one namespace,
from lessons/ (as a student's kernel would), with every answer cell filled from the answer key
(blockviz/lessons/key.py `fill`, as tests/test_lessons.py runs a solved lesson). Every Visualizer
a cell leaves in the notebook's namespace (a variable, or an entry of a dict or list held in one)
or freezes a moment of (`viz.snapshot()`, `viz.show(at=...)`) is written as a trace,
NN-NAME.jsonl, NAME being its variable ("viz", "swap", "runs-v1"). NN.json beside them lists the
runs with the cell that made each and the moments the lesson's cells froze (the event position,
the cell, and what the picture showed: blockviz.webpage.lesson.state_digest), and the figures:
for each exercise, the value the key's answer cell gave its variable and the check's verdict on it.

The runs are seeded, on CPU with the bundled model, and a step's wall time is written as 0, so
recording again on the same machine writes the same files. When a lesson changes, run this
script and commit what it writes.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from blockviz.webpage.lesson import LESSON_RUNS_DIR, RUNS_FORMAT, lesson_notebooks, state_digest  # noqa: E402

RUN_TIMEOUT_S = 1800  # one lesson's process; a limit for a loaded machine, not a measurement


def _source(cell: dict[str, Any]) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def _shown(value: Any) -> str:
    """An answer as its cell would write it: an enum member as Class.NAME, anything else its repr."""
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    return repr(value)


def _plain(value: Any) -> Any:
    """An answer as a JSON value: numbers, text and truth values as they are, anything else
    (an AllocStatus) as its cell would write it."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return _shown(value)


def _names(namespace: dict[str, Any], viz_type: type) -> dict[int, str]:
    """Each Visualizer the namespace holds, by id: its variable, or VARIABLE-KEY inside a dict,
    list or tuple (the first name found, in the namespace's order)."""
    found: dict[int, str] = {}
    for name, value in namespace.items():
        if name.startswith("_"):
            continue
        if isinstance(value, viz_type):
            found.setdefault(id(value), name)
        elif isinstance(value, dict):
            for key, item in value.items():
                if isinstance(item, viz_type):
                    found.setdefault(id(item), f"{name}-{key}")
        elif isinstance(value, (list, tuple)):
            for key, item in enumerate(value):
                if isinstance(item, viz_type):
                    found.setdefault(id(item), f"{name}-{key}")
    return found


def record_lesson(number: str, out: Path) -> dict[str, Any]:
    """Run lesson `number`'s notebook with the key's answers in this process and write its runs
    into `out` (NN-NAME.jsonl and NN.json). Returns NN.json's data."""
    import msgspec

    from blockviz.jupyter.visualizer import Visualizer
    from blockviz.lessons import EXERCISES
    from blockviz.lessons.key import fill
    from blockviz.model.trace import make_header, write_trace
    from engine import events as ev

    path = lesson_notebooks()[number]
    notebook = fill(json.loads(path.read_text(encoding="utf-8")))
    made: list[tuple[Any, int]] = []  # (Visualizer, the cell that made it), in order
    frozen: list[tuple[Any, int, int, dict]] = []  # (Visualizer, position, cell, what it showed)
    cell_now = [-1]
    make, snapshot = Visualizer.__init__, Visualizer.snapshot

    def made_here(viz, *args, **kwargs):
        make(viz, *args, **kwargs)
        made.append((viz, cell_now[0]))

    def frozen_here(viz, at=None):
        moment = snapshot(viz, at)
        frozen.append((viz, moment.position, cell_now[0], state_digest(moment.state)))
        return moment

    Visualizer.__init__, Visualizer.snapshot = made_here, frozen_here
    namespace: dict[str, Any] = {"__name__": "__main__"}
    names: dict[int, str] = {}
    last_cell: dict[int, int] = {}  # id -> the last cell that added events to it (or made it)
    seen: dict[int, int] = {}  # id -> events known after the last cell
    os.chdir(path.parent)
    for index, cell in enumerate(notebook["cells"]):
        source = _source(cell)
        if cell.get("cell_type") != "code" or not source.strip():
            continue
        cell_now[0] = index
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(source, f"{path.name} cell {index}", "exec"), namespace)
        for key, name in _names(namespace, Visualizer).items():
            names.setdefault(key, name)
        for viz, _ in made:
            if seen.get(id(viz)) != len(viz.events):
                seen[id(viz)], last_cell[id(viz)] = len(viz.events), index

    runs, taken = [], set()
    for k, (viz, cell) in enumerate(made):
        moments = [(position, at, state) for v, position, at, state in frozen if v is viz]
        if id(viz) not in names and not moments:
            continue  # a Visualizer the lesson's code made for itself and never showed
        name = base = names.get(id(viz), f"run{k}")
        while name in taken:  # a variable the lesson binds to a second run
            name = f"{base}-{len([t for t in taken if t == base or t.startswith(base + '-')]) + 1}"
        taken.add(name)
        if viz.timeline.dropped_events:
            raise SystemExit(f"lesson {number}: run {name!r} dropped its first events")
        events = [msgspec.structs.replace(e, duration_s=0.0) if isinstance(e, ev.StepFinished) else e
                  for e in viz.events]
        engine_header = {key: value for key, value in viz.header.items()
                         if key not in ("format", "version", "blockviz_version", "title", "description")}
        header = make_header(engine_header, title=f"lesson {number} · {name}",
                             description=f"lessons/{path.name}: the run `{name}`, recorded with the key's answers")
        trace = f"{number}-{name}.jsonl"
        write_trace(out / trace, header, events)
        runs.append({"name": name, "trace": trace, "cell": cell, "last_cell": last_cell.get(id(viz), cell),
                     "num_events": len(events),
                     "moments": [{"position": position, "cell": at, "state": state} for position, at, state in moments]})

    figures = []
    for cell in notebook["cells"]:
        exercise = ((cell.get("metadata") or {}).get("blockviz") or {}).get("exercise")
        if cell.get("cell_type") == "code" and "answer" in (cell.get("metadata") or {}).get("tags", []):
            ex = EXERCISES[exercise]
            answer = namespace[ex.variable]
            figures.append({"exercise": exercise, "variable": ex.variable, "answer": _plain(answer),
                            "shown": _shown(answer), "verdict": ex.verdict(answer).status})
    data = {"format": RUNS_FORMAT, "version": 1, "lesson": number, "notebook": path.name,
            "runs": runs, "figures": figures}
    (out / f"{number}.json").write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="NN", help="these lessons (two digits each)")
    parser.add_argument("--out", type=Path, default=LESSON_RUNS_DIR, help="the folder to write (made if missing)")
    parser.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)  # one lesson, here
    args = parser.parse_args(argv)
    notebooks = lesson_notebooks()
    numbers = args.only or list(notebooks)
    unknown = [n for n in numbers if n not in notebooks]
    if unknown:
        print(f"no lesson {unknown[0]!r} (lessons: {', '.join(notebooks)})", file=sys.stderr)
        return 2
    out = args.out.resolve()
    if not out.parent.is_dir():
        print(f"{out.parent} does not exist", file=sys.stderr)
        return 2
    out.mkdir(exist_ok=True)
    if args.in_process:
        for number in numbers:
            data = record_lesson(number, out)
            print(f"lesson {number}: " + ", ".join(f"{r['name']} {r['num_events']} events {len(r['moments'])} moments"
                                                   for r in data["runs"]))
        return 0
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "HF_HUB_OFFLINE": "1"}
    for number in numbers:  # each lesson into a folder of its own, then in place of its old files
        with tempfile.TemporaryDirectory(prefix=f".{number}.", dir=out) as fresh:
            done = subprocess.run([sys.executable, __file__, "--in-process", "--only", number, "--out", fresh],
                                  env=env, timeout=RUN_TIMEOUT_S)
            if done.returncode:
                print(f"lesson {number}: the recording failed (exit {done.returncode}); its files are left as they were",
                      file=sys.stderr)
                return 1
            for old in [*out.glob(f"{number}-*.jsonl"), out / f"{number}.json"]:
                old.unlink(missing_ok=True)
            for path in sorted(Path(fresh).iterdir()):
                os.replace(path, out / path.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
