"""The lab tools: the grader (python3 -m blockviz.lessons.grade), the per-student variants
(python3 -m blockviz.lessons.key --variants / --variant) and the checks' hints for numbers and units.

The grader's acceptance tests run real kernels over a folder of submissions: the key's solved copy,
the blank lesson and a copy with chosen wrong answers of lesson 01 (the cheapest to run), and
notebooks that loop forever, print 100 MB, ask for more memory than the kernel may have, are not
JSON, or come from another course. They check each verdict in the CSV, that each bad notebook is
reported on one line, and that nothing outside the output was written.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from blockviz.lessons import EXERCISES, load_all, variants
from blockviz.lessons import grade as grader
from blockviz.lessons.checks import CORRECT, WRONG, Exercise, Slip
from blockviz.lessons.key import KEY, KeyWriteError, fill, read_roster, variant_answers, variant_notebook

ROOT = Path(__file__).resolve().parent.parent
LESSONS_DIR = ROOT / "lessons"
LESSON01 = LESSONS_DIR / "01_block_size.ipynb"

load_all()


def read(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def with_answers(notebook: dict, answers: dict[str, str]) -> dict:
    """`notebook` with the answer cells of the exercises named replaced by the sources given."""
    notebook = json.loads(json.dumps(notebook))
    for cell in notebook["cells"]:
        exercise = cell.get("metadata", {}).get("blockviz", {}).get("exercise")
        if "answer" in cell.get("metadata", {}).get("tags", []) and exercise in answers:
            cell["source"] = answers[exercise]
    return notebook


def tiny(answer: str, *more: str) -> dict:
    """A notebook of one 01.bytes answer cell and the cells given after it."""
    cells = [{"cell_type": "code", "id": "a", "metadata": {"blockviz": {"exercise": "01.bytes"}, "tags": ["answer"]},
              "source": answer, "outputs": [], "execution_count": None}]
    cells += [{"cell_type": "code", "id": f"c{n}", "metadata": {}, "source": source, "outputs": [],
               "execution_count": None} for n, source in enumerate(more)]
    return {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def tree(*folders: Path) -> dict[str, tuple[int, int]]:
    """Every file under `folders`: its size and modification time."""
    found = {}
    for folder in folders:
        for path in folder.rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                stat = path.stat()
                found[str(path)] = (stat.st_size, stat.st_mtime_ns)
    return found


def grade(folder: Path, out: Path, *options: str) -> tuple[subprocess.CompletedProcess, list[dict], list[dict]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "blockviz.lessons.grade", str(folder), "--out", str(out), *options],
                          capture_output=True, text=True, env=env, timeout=1800)
    with out.open() as stream:
        rows = list(csv.DictReader(stream))
    with out.with_name(out.stem + "-summary.csv").open() as stream:
        summary = list(csv.DictReader(stream))
    return done, rows, summary


def verdicts(rows: list[dict]) -> dict[tuple[str, str], str]:
    return {(row["student"], row["exercise"]): row["verdict"] for row in rows}


# ---------------------------------------------------------------- the grader, end to end


@pytest.mark.slow
def test_the_grader_marks_solved_blank_and_wrong_copies(tmp_path):
    folder = tmp_path / "submissions"
    folder.mkdir()
    lesson = read(LESSON01)
    (folder / "alice.ipynb").write_text(json.dumps(fill(json.loads(json.dumps(lesson)))))
    (folder / "bob.ipynb").write_text(json.dumps(lesson))
    wrong = with_answers(lesson, {"01.bytes": "my_bytes = 32_768", "01.blocks": 'my_blocks = "1820"',
                                  "01.gqa_bytes": "my_gqa_bytes = no_such_name"})
    (folder / "dan.ipynb").write_text(json.dumps(wrong))
    before = tree(folder, LESSONS_DIR)
    done, rows, summary = grade(folder, tmp_path / "marks.csv")
    assert done.returncode == 0, done.stderr
    assert tree(folder, LESSONS_DIR) == before, "the grader wrote beside the submissions or in lessons/"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["marks-summary.csv", "marks.csv", "submissions"]
    marks = verdicts(rows)
    for exercise in ("01.bytes", "01.blocks", "01.gqa_bytes"):
        assert marks["alice", exercise] == "correct"
        assert marks["bob", exercise] == "unanswered"
    assert marks["dan", "01.bytes"] == "wrong" and marks["dan", "01.blocks"] == "wrong"
    assert marks["dan", "01.gqa_bytes"] == "error"
    dan = {row["exercise"]: row for row in rows if row["student"] == "dan"}
    assert dan["01.bytes"]["slip"] == "32768" and "factor 2" in dan["01.bytes"]["hint"]
    assert "give a number" in dan["01.blocks"]["hint"]
    assert "NameError" in dan["01.gqa_bytes"]["note"]
    assert [r["verdict"] for r in rows if r["exercise"] == "total"] == ["3/3", "0/3", "0/3"]
    by_exercise = {line["exercise"]: line for line in summary}
    assert by_exercise["01.bytes"]["correct"] == "1" and by_exercise["01.bytes"]["commonest_slip"] == "32768"
    assert by_exercise["01.gqa_bytes"]["error"] == "1" and by_exercise["01.blocks"]["unanswered"] == "1"
    assert "01.bytes" in done.stdout


@pytest.mark.slow
def test_the_grader_bounds_and_reports_bad_submissions(tmp_path):
    folder = tmp_path / "submissions"
    folder.mkdir()
    right = KEY["01.bytes"]
    (folder / "eve.ipynb").write_text(json.dumps(tiny(right, "while True:\n    pass", "my_bytes = 1")))
    (folder / "fay.ipynb").write_text(json.dumps(tiny(right, "import sys\nfor _ in range(100):\n"
                                                                "    sys.stdout.write('x' * 2**20)")))
    (folder / "gus.ipynb").write_text(json.dumps(tiny(right, "hog = bytearray(3 * 2**30)")))
    (folder / "carl.ipynb").write_text("this is { not JSON")
    other = tiny(right)
    del other["cells"][0]["metadata"]["blockviz"]
    (folder / "zed.ipynb").write_text(json.dumps(other))
    before = tree(folder, LESSONS_DIR)
    done, rows, _ = grade(folder, tmp_path / "marks.csv", "--timeout", "25", "--memory", "2048", "--max-output", "1")
    assert done.returncode == 0, done.stderr
    assert tree(folder, LESSONS_DIR) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["marks-summary.csv", "marks.csv", "submissions"]
    marks = verdicts(rows)
    # the loop is interrupted at the deadline; its answer, given before it, is graded, the cell after is not run
    assert marks["eve", "01.bytes"] == "correct"
    assert marks["fay", "01.bytes"] == "correct" and marks["gus", "01.bytes"] == "correct"
    assert {row["student"] for row in rows} == {"eve", "fay", "gus"}, "not JSON and foreign: no rows"
    notes = {row["student"]: row["note"] for row in rows if row["exercise"] == "total"}
    assert "out of time after 25 s" in notes["eve"] and "output past 1 MiB dropped" in notes["fay"]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 4, lines
    assert any("carl.ipynb: not a notebook (not JSON" in line for line in lines)
    assert any("zed.ipynb: not a blockviz lesson" in line for line in lines)
    assert any("eve.ipynb: out of time" in line for line in lines)
    assert any("fay.ipynb: output past" in line for line in lines)


def test_bad_usage_is_one_line_and_exit_2(tmp_path, capsys):
    for argv in ([], [str(tmp_path)], [str(tmp_path / "none.ipynb"), "--out", str(tmp_path / "m.csv")],
                 [str(tmp_path), "--out", str(tmp_path)], [str(tmp_path), "--out", str(tmp_path / "m.csv")],
                 [str(LESSON01), "--out", str(tmp_path / "m.csv"), "--timeout", "0"]):
        assert grader.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("blockviz.lessons.grade: error: ") and err.count("\n") == 1, (argv, err)
    assert list(tmp_path.iterdir()) == []


def test_the_key_refuses_a_bad_roster_in_one_line(tmp_path, capsys):
    from blockviz.lessons.key import main as key_main

    roster = tmp_path / "roster.csv"
    roster.write_text("id\nada\nada\n")
    assert key_main(["--variants", str(roster), str(tmp_path / "out")]) == 2
    assert key_main(["--variant", "../ada"]) == 2
    assert key_main(["--variants", str(roster)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and "appears more than once" in err[0] and "not a student id" in err[1]
    assert not (tmp_path / "out").exists()


def test_answers_cross_from_the_kernel_as_plain_data():
    from engine.block_manager import AllocStatus

    assert grader.decode({"value": 3}) == 3 and grader.decode({"ellipsis": True}) is Ellipsis
    status = {"enum": f"{AllocStatus.__module__}:AllocStatus", "name": "LATER"}
    assert grader.decode(status) is AllocStatus.LATER
    foreign = grader.decode({"enum": "antigravity:Thing", "name": "X"})
    assert repr(foreign) == "Thing.X" and foreign != AllocStatus.LATER, "no module a notebook names is imported"
    assert EXERCISES["01.bytes"].verdict(grader.decode({"type": "object", "repr": "<object>"})).status == WRONG


def test_a_student_id_comes_from_metadata_else_the_file_and_fixes_the_variant(tmp_path):
    notebook = variant_notebook(read(LESSONS_DIR / "10_vllm_v1.ipynb"), "10", "ada")
    assert grader.student_of(tmp_path / "whatever.ipynb", notebook) == "ada"
    assert grader.student_of(tmp_path / "bo.ipynb", read(LESSON01)) == "bo"
    assert grader.student_of(tmp_path / "cy" / "01_block_size.ipynb", read(LESSON01)) == "cy"
    assert grader.variant_of(notebook, "ada") == (variants.seed_of("ada", "10"), "")
    notebook["metadata"]["blockviz"]["variant"] = variants.seed_of("cy", "10")
    seed, note = grader.variant_of(notebook, "ada")
    assert seed == variants.seed_of("ada", "10") and "is not ada's" in note
    assert grader.variant_of(read(LESSON01), "bo") == (None, "")


# ---------------------------------------------------------------- variants


def two_students(lesson: str, differ) -> tuple[str, str]:
    """Two ids of the roster a-z whose variants of `lesson` differ as `differ(figures, figures)` asks."""
    ids = [f"s{n:02}" for n in range(60)]
    figures = {i: variants._FIGURES[lesson](variants.seed_of(i, lesson)) for i in ids}
    return next((a, b) for a in ids for b in ids if differ(figures[a], figures[b]))


def test_variants_are_seeded_from_the_id_and_their_notebooks_state_their_figures(tmp_path):
    roster = tmp_path / "roster.csv"
    roster.write_text("name,id\nAda,ada\nBo,bo\n")
    assert read_roster(roster) == ["ada", "bo"]
    for text in ("id\n../x\n", "id\nada\nada\n", "id\n"):
        roster.write_text(text)
        with pytest.raises(KeyWriteError):
            read_roster(roster)
    assert variants.seed_of("ada", "10") == variants.seed_of(" ada ", "10") != variants.seed_of("ada", "11")
    a, b = two_students("10", lambda x, y: x.block_size != y.block_size and x.budget != y.budget)
    stored = read(LESSONS_DIR / "10_vllm_v1.ipynb")
    texts = []
    for student in (a, b):
        notebook = variant_notebook(stored, "10", student)
        seed = variants.seed_of(student, "10")
        assert notebook["metadata"]["blockviz"] == {"lesson": "10", "student": student, "variant": seed}
        text = "\n".join("".join(cell["source"]) for cell in notebook["cells"])
        assert f"variants.use({seed})" in text
        fig = variants._FIGURES["10"](seed)
        assert f"in blocks of {fig.block_size} tokens" in text and f"budget of {fig.budget} tokens" in text
        texts.append(text)
    assert texts[0] != texts[1]
    from blockviz.lessons import lesson10

    for stored_text, _ in lesson10.VARIANT_TEXT:
        assert "".join("".join(c["source"]) for c in stored["cells"]).count(stored_text) == 1, stored_text


def judge_across(lesson: str, a: str, b: str) -> None:
    """Each variant's key is correct under its own checks, and wrong under the other's wherever the
    two truths differ (most exercises)."""
    keys = {s: variant_answers(lesson, s) for s in (a, b)}
    for mine, other in ((a, b), (b, a)):
        differ = 0
        for exercise_id, source in keys[mine].items():
            ex = EXERCISES[exercise_id]
            value = eval(source.split(" = ", 1)[1].split("  #")[0])
            variants.use(variants.seed_of(mine, lesson))
            assert ex.verdict(value).status == CORRECT, (mine, exercise_id)
            variants.use(variants.seed_of(other, lesson))
            if keys[other][exercise_id] .split("  #")[0] != source.split("  #")[0]:
                differ += 1
                assert ex.verdict(value).status == WRONG, (mine, exercise_id)
            variants.use(None)
        assert differ >= len(keys[mine]) // 2, f"{lesson}: only {differ} figures differ between {a} and {b}"


@pytest.mark.slow
def test_lesson10_variant_keys_are_right_only_for_their_own_variant():
    a, b = two_students("10", lambda x, y: {x.block_size, y.block_size} == {3, 6} and {x.budget, y.budget} == {3, 11})
    judge_across("10", a, b)


# ---------------------------------------------------------------- hints


def test_a_number_given_as_text_or_in_the_other_unit_gets_its_own_hint():
    ex = Exercise("00.units", "my_hits", lambda: 2, "count again.", (Slip(3, "one too many."),),
                  unit="blocks", other_unit=("tokens", lambda: 8))
    assert "give a number" in ex.verdict("2").text and "give a number" in ex.verdict([2]).text
    assert "counts tokens; the question asks for blocks" in ex.verdict(8).text
    assert ex.verdict(3).text.endswith("one too many.") and ex.verdict(5).text.endswith("count again.")
    assert ex.slip_of(2) is None and ex.slip_of(3).value == 3


@pytest.mark.slow
def test_lesson11_variant_keys_are_right_only_for_their_own_variant():
    a, b = two_students("11", lambda x, y: x.mla_block_size != y.mla_block_size and x.pool_gib != y.pool_gib
                        and x.window_block_size != y.window_block_size)
    judge_across("11", a, b)


def test_every_answer_cell_names_what_it_counts():
    """Each answer cell says after "# your answer:" what to give (blocks, tokens, a block number...)."""
    for path in sorted(LESSONS_DIR.glob("[0-9][0-9]_*.ipynb")):
        for cell in read(path)["cells"]:
            if "answer" in cell.get("metadata", {}).get("tags", []):
                source = "".join(cell["source"])
                assert "# your answer:" in source or "AllocStatus" in source, (path.name, source)


def test_no_hint_states_an_arithmetic_answer():
    """The exercises computed by arithmetic alone: no hint or slip hint writes out the answer."""
    from blockviz.lessons import lesson01, lesson08, lesson11

    for ex in (lesson01.check_bytes, lesson01.check_blocks, lesson01.check_gqa_bytes, lesson08.check_fraction,
               lesson11.check_mqa_bytes, lesson11.check_mla_block, lesson11.check_fp8_tokens):
        truth = ex.truth()
        for text in (ex.hint, *(slip.hint for slip in ex.slips)):
            for written in {str(truth), f"{truth:,}", f"{truth:_}"}:
                assert written not in ex.fill_in(text), (ex.id, text)


@pytest.mark.slow
def test_the_grader_grades_each_variant_notebook_on_its_own_variant(tmp_path):
    """Two students' lesson 10 notebooks, both answered with the first one's key: the first is
    correct throughout, the second wrong wherever the two variants' answers differ."""
    a, b = two_students("10", lambda x, y: x.block_size != y.block_size and x.budget != y.budget)
    folder = tmp_path / "submissions"
    folder.mkdir()
    key = variant_answers("10", a)
    for student in (a, b):
        notebook = variant_notebook(read(LESSONS_DIR / "10_vllm_v1.ipynb"), "10", student)
        answers = {cell["metadata"]["blockviz"]["exercise"]: key[cell["metadata"]["blockviz"]["exercise"]]
                   for cell in notebook["cells"] if "answer" in cell["metadata"].get("tags", [])}
        (folder / f"{student}.ipynb").write_text(json.dumps(with_answers(notebook, answers)))
    done, rows, _ = grade(folder, tmp_path / "marks.csv")
    assert done.returncode == 0, done.stderr
    marks = verdicts(rows)
    other = variant_answers("10", b)
    for exercise_id, source in key.items():
        assert marks[a, exercise_id] == "correct", exercise_id
        same = source.split("  #")[0] == other[exercise_id].split("  #")[0]
        assert marks[b, exercise_id] == ("correct" if same else "wrong"), exercise_id
    assert sum(marks[b, e] == "wrong" for e in key) >= 3
