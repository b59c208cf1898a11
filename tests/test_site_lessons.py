"""`blockviz site`'s lesson pages (blockviz/webpage/lesson.py): each notebook's text as prose, each
exercise as a question with its answer from the key or, in the student edition, no answer text
anywhere; the pictures of the lesson's own recorded runs (blockviz/traces/lessons/, made by
scripts/record_lesson_traces.py) at its moments, and its exercises' recorded figures; bad input is
one line, exit 2, nothing left."""

from __future__ import annotations

import ast
import base64
import html
import json
import re
import subprocess
import sys

import pytest

from blockviz.cli import main
from blockviz.lessons.key import KEY
from blockviz.webpage.lesson import (LESSON_RUNS_DIR, LESSON_TRACES, lesson_goal, lesson_notebooks, lesson_page,
                                     lesson_runs, page_name, recorded_lesson, state_digest)

NOTEBOOKS = lesson_notebooks()
FIGURE = re.compile(r'<figure class="bv-moment bv-lesson-run" data-run="([^"]+)" data-position="(\d+)">.*?'
                    r'<img src="data:image/svg\+xml;base64,([^"]+)"', re.S)
POOL = re.compile(r'<g class="pool(?: zoomed)?" ([^>]*)>')
ATTRIBUTE = re.compile(r'data-([\w-]+)="([^"]*)"')


def exercises_of(path) -> list[str]:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return [c["metadata"]["blockviz"]["exercise"] for c in cells
            if c["cell_type"] == "code" and "answer" in c["metadata"].get("tags", [])]


def answer_texts(exercise: str) -> list[str]:
    """What of KEY's entry would give the answer away: each line, and each line's comment, less
    what the stored notebook (handed to students as it is) shows itself."""
    notebook = "".join("".join(c["source"]) for n, path in NOTEBOOKS.items() if exercise.startswith(n)
                       for c in json.loads(path.read_text(encoding="utf-8"))["cells"])
    texts = []
    for line in KEY[exercise].splitlines():
        texts.append(line.strip())
        if "#" in line:
            texts.append(line.split("#", 1)[1].strip())
    return [t for t in texts if len(t) > 6 and t not in notebook]


def key_value(exercise: str):
    """The value the key's answer cell gives its variable, where the cell is a literal; else None."""
    try:
        return ast.literal_eval(ast.parse(KEY[exercise].splitlines()[-1]).body[0].value)
    except ValueError:
        return None


def test_every_lesson_notebook_is_found_and_its_fallback_runs_are_shipped_traces():
    assert len(NOTEBOOKS) >= 11 and list(NOTEBOOKS) == sorted(NOTEBOOKS)
    assert set(LESSON_TRACES) <= set(NOTEBOOKS)
    from blockviz.model.trace import shipped_traces

    assert {name for names in LESSON_TRACES.values() for name in names} <= set(shipped_traces())


@pytest.mark.parametrize("number", sorted(NOTEBOOKS))
def test_every_lesson_ships_its_recorded_runs_and_figures(number):
    """Each lesson's runs are traces the checker reads whole, their moments within them; its figures
    are its exercises', in the notebook's order, each the key's answer and judged correct."""
    from blockviz.model.trace import read_trace

    data = recorded_lesson(number)
    assert data is not None and data["notebook"] == NOTEBOOKS[number].name
    assert data["runs"], number
    for run in data["runs"]:
        trace = read_trace(LESSON_RUNS_DIR / run["trace"])
        assert len(trace.events) == run["num_events"] > 0
        assert all(0 <= m["position"] <= run["num_events"] for m in run["moments"])
    figures = data["figures"]
    assert [f["exercise"] for f in figures] == exercises_of(NOTEBOOKS[number])
    literal = 0  # figures compared with the key's literal answer
    for figure in figures:
        assert figure["verdict"] == "correct", figure
        value = key_value(figure["exercise"])
        if value is not None:
            assert figure["answer"] == value, figure
            literal += 1
    assert literal == sum(key_value(e) is not None for e in exercises_of(NOTEBOOKS[number]))


def reduced(trace, position: int):
    from blockviz.model.reducer import ReducerState

    state = ReducerState.from_header(trace.header)
    for event in trace.events[:position]:
        state.apply(event)
    return state


@pytest.mark.parametrize("number", sorted(NOTEBOOKS))
def test_a_lesson_pages_pictures_are_its_recorded_runs_at_its_moments(number):
    """Every picture on the page is one of the lesson's runs at a moment its cells froze (or the run's
    end, where it froze none), in the notebook's order: the pools drawn are that run's trace reduced
    to that position, which is what the live run showed when the cell froze it."""
    from blockviz.model.trace import read_trace

    data = recorded_lesson(number)
    text = lesson_page(NOTEBOOKS[number], runs=lesson_runs(number))
    shown = FIGURE.findall(text)
    expected = sorted(((m["cell"], run["name"], m["position"]) for run in data["runs"] for m in run["moments"]
                       or [{"cell": run["last_cell"], "position": run["num_events"]}]), key=lambda x: x[0])
    assert [(name, int(position)) for name, position, _ in shown] == [(name, position) for _, name, position in expected]
    runs = {run["name"]: run for run in data["runs"]}
    for name, position, svg in shown:
        run, position = runs[name], int(position)
        state = reduced(read_trace(LESSON_RUNS_DIR / run["trace"]), position)
        frozen = [m["state"] for m in run["moments"] if m["position"] == position]
        assert all(digest == state_digest(state) for digest in frozen), (name, position)
        svg = base64.b64decode(svg).decode("utf-8")
        assert f'data-position="{position}"' in svg
        pools = {a["device"]: a for a in (dict(ATTRIBUTE.findall(tag)) for tag in POOL.findall(svg)) if int(a["n"])}
        assert pools.get("gpu"), (name, position)
        codes = {d: codes for d, codes in state_digest(state)["codes"].items() if codes}
        assert pools.keys() == codes.keys(), (name, position)
        for device, pool in pools.items():
            if "per-cell" not in pool:
                assert pool["states"] == codes[device], (name, position, device)
                continue
            per_cell = int(pool["per-cell"])  # a big pool, a cell per few blocks: one of their states
            cells = [codes[device][i:i + per_cell] for i in range(0, len(codes[device]), per_cell)]
            assert len(pool["states"]) == len(cells) and all(c in blocks for c, blocks in zip(pool["states"], cells))


@pytest.mark.parametrize("number", sorted(NOTEBOOKS))
def test_a_lesson_pages_figures_are_the_keys_answers(number):
    text = lesson_page(NOTEBOOKS[number], runs=lesson_runs(number))
    figures = re.findall(r'data-exercise="([^"]+)".*?<p class="bv-figure" data-answer="([^"]*)" data-verdict="(\w+)"',
                         text, re.S)
    assert [exercise for exercise, _, _ in figures] == exercises_of(NOTEBOOKS[number])
    for exercise, answer, verdict in figures:
        assert verdict == "correct"
        value = key_value(exercise)
        assert value is None or json.loads(html.unescape(answer)) == value, exercise
    student = lesson_page(NOTEBOOKS[number], runs=lesson_runs(number), answers=False)
    assert "bv-figure" not in student and student.count("bv-lesson-run\"") == text.count("bv-lesson-run\"")


def comparable_trace(path) -> tuple[dict, list[dict]]:
    """A recorded trace less what differs between two machines by nature: a K/V digest's value
    (floating-point sums round differently on another CPU or thread count)."""
    from blockviz.model.trace import read_trace

    trace = read_trace(path)
    events = [{k: v for k, v in e.to_dict().items() if k != "digest"} for e in trace.events]
    return trace.header, events


@pytest.mark.slow
def test_recording_a_lesson_again_writes_the_shipped_files(tmp_path):
    """Lesson 03 (one run, a few steps), recorded afresh by scripts/record_lesson_traces.py, is the
    shipped recording: the same runs, moments, states and figures, the same events."""
    from serve_fixtures import REPO, blockviz_env

    done = subprocess.run([sys.executable, "scripts/record_lesson_traces.py", "--only", "03", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=900, cwd=REPO, env=blockviz_env())
    assert done.returncode == 0, done.stderr
    shipped = sorted(p.name for p in LESSON_RUNS_DIR.glob("03*"))
    assert sorted(p.name for p in tmp_path.iterdir()) == shipped and len(shipped) >= 2
    assert recorded_lesson("03", tmp_path) == recorded_lesson("03")
    for name in shipped:
        if name.endswith(".jsonl"):
            assert comparable_trace(tmp_path / name) == comparable_trace(LESSON_RUNS_DIR / name), name


@pytest.mark.parametrize("number", sorted(NOTEBOOKS))
def test_a_lesson_page_holds_its_prose_and_its_exercises_with_their_answers(number):
    path = NOTEBOOKS[number]
    text = lesson_page(path)
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    title = "".join(cells[0]["source"]).splitlines()[0][2:]
    assert f"<h1>{html.escape(title, quote=False)}</h1>" in text
    assert "<strong>Goal.</strong>" in text  # the markdown is rendered, not shown as source
    shown = re.findall(r'class="bv-exercise" data-exercise="([^"]+)"', text)
    assert shown == exercises_of(path)
    for exercise in shown:
        assert html.escape(KEY[exercise]) in text
    assert "<script" not in text and "http://" not in text.split("</style>")[0]
    assert ".ipynb\"" not in text  # links to other lessons point at their pages
    assert f"lessons/{path.name}" in text


@pytest.mark.parametrize("number", sorted(NOTEBOOKS))
def test_the_student_edition_holds_no_answer_text(number):
    path = NOTEBOOKS[number]
    text = lesson_page(path, answers=False)
    assert re.findall(r'data-exercise="([^"]+)"', text) == exercises_of(path)
    assert "bv-answer\"" not in text and "Show the answer" not in text and "bv-figure" not in text
    assert [s for e in exercises_of(path) for s in answer_texts(e)] or not exercises_of(path)
    for exercise in exercises_of(path):
        for secret in answer_texts(exercise):
            assert secret not in text and html.escape(secret) not in text, (exercise, secret)


def test_site_no_answers_writes_no_answer_anywhere(tmp_path):
    site = tmp_path / "class"
    assert main(["site", str(site), "--traces", "fork-cow", "--lessons", "04", "01", "--no-answers"]) == 0
    files = sorted(p.name for p in site.iterdir())
    assert files == ["fork-cow.html", "fork-cow.svg", "index.html", page_name("01"), page_name("04")]
    everything = "".join(p.read_text(encoding="utf-8") for p in site.iterdir())
    secrets = [s for n in ("01", "04") for e in exercises_of(NOTEBOOKS[n]) for s in answer_texts(e)]
    assert secrets and not [s for s in secrets if s in everything or html.escape(s) in everything]
    index = (site / "index.html").read_text(encoding="utf-8")
    assert index.index(page_name("04")) > index.index(page_name("01"))  # in the lessons' order
    goal = lesson_goal(NOTEBOOKS["04"])
    assert goal.startswith("With n=2") and goal.endswith(".") and html.escape(goal) in index
    lesson04 = (site / page_name("04")).read_text(encoding="utf-8")
    moments = [m for run in recorded_lesson("04")["runs"] for m in run["moments"]]
    assert len(moments) >= 2 and lesson04.count('<figure class="bv-moment bv-lesson-run"') == len(moments)
    assert 'data-trace="fork-cow"' not in lesson04  # its own runs, not a shipped story


@pytest.mark.parametrize(("args", "expected"), [
    (["{tmp}/site", "--lessons", "99"], "no lesson '99'"),
    (["{tmp}/site", "--lessons", "04", "x"], "no lesson 'x'"),
    (["{tmp}/none/site", "--lessons", "04"], "does not exist"),
])
def test_site_bad_lesson_input_is_one_line_exit_2(tmp_path, capsys, args, expected):
    assert main(["site", *(a.format(tmp=tmp_path) for a in args)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0]
    assert list(tmp_path.iterdir()) == []


def test_a_lesson_page_and_its_pictures_are_made_without_torch_transformers_or_textual():
    from serve_fixtures import REPO, blockviz_env

    code = ("import sys\nfrom blockviz.webpage.lesson import lesson_notebooks, lesson_page, lesson_runs, trace_moments\n"
            "page = lesson_page(lesson_notebooks()['04'], moments={'fork-cow': trace_moments('fork-cow')},\n"
            "                   runs=lesson_runs('04'))\n"
            "assert 'bv-moment' in page and 'bv-lesson-run' in page and 'bv-figure' in page\n"
            "print(sorted(m for m in ('torch', 'transformers', 'textual') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=REPO, env=blockviz_env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
