"""`blockviz site`'s lesson pages (blockviz/webpage/lesson.py): each notebook's text as prose, each
exercise as a question with its answer from the key or, in the student edition, no answer text
anywhere; bad input is one line, exit 2, nothing left."""

from __future__ import annotations

import html
import json
import re

import pytest

from blockviz.cli import main
from blockviz.lessons.key import KEY
from blockviz.webpage.lesson import LESSON_TRACES, lesson_goal, lesson_notebooks, lesson_page, page_name

NOTEBOOKS = lesson_notebooks()


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


def test_every_lesson_notebook_is_found_and_its_recorded_runs_are_shipped_traces():
    assert len(NOTEBOOKS) >= 11 and list(NOTEBOOKS) == sorted(NOTEBOOKS)
    assert set(LESSON_TRACES) <= set(NOTEBOOKS)
    from blockviz.model.trace import shipped_traces

    assert {name for names in LESSON_TRACES.values() for name in names} <= set(shipped_traces())


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
    assert "bv-answer\"" not in text and "Show the answer" not in text
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
    assert 'data-trace="fork-cow"' in lesson04 and 'href="fork-cow.html"' in lesson04
    assert lesson04.count('<figure class="bv-moment"') >= 2  # fork-cow's cards


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
    import subprocess
    import sys

    from serve_fixtures import REPO, blockviz_env

    code = ("import sys\nfrom blockviz.webpage.lesson import lesson_notebooks, lesson_page, trace_moments\n"
            "page = lesson_page(lesson_notebooks()['04'], moments={'fork-cow': trace_moments('fork-cow')})\n"
            "assert 'bv-moment' in page\n"
            "print(sorted(m for m in ('torch', 'transformers', 'textual') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=REPO, env=blockviz_env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
