"""The lessons (lessons/*.ipynb): stored stripped, shaped as the lessons issue asks, and each one runs
top to bottom headless on the bundled model (nbclient, a fresh kernel each) with every exercise's
check rejecting a wrong answer.

The kernel is the "python3" kernel of this very interpreter (ipykernel installed beside pytest), so
a machine with some other "python3" kernelspec on its Jupyter path runs the lessons here too.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
from nbclient.exceptions import CellExecutionError  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
LESSONS_DIR = ROOT / "lessons"
LESSONS = sorted(LESSONS_DIR.glob("[0-9][0-9]_*.ipynb"))
CELL_TIMEOUT_S = 180  # a limit for a loaded machine, not a measurement (each lesson aims at <= 60 s)


def read(path: Path):
    return nbformat.read(path, as_version=4)


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory):
    """Point the Jupyter path at a "python3" kernelspec running this interpreter, and let the kernel
    import the repository even where it is not installed."""
    base = tmp_path_factory.mktemp("jupyter")
    spec = base / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3", "language": "python",
    }))
    saved = {name: os.environ.get(name) for name in ("JUPYTER_PATH", "PYTHONPATH", "HF_HUB_OFFLINE")}
    os.environ["JUPYTER_PATH"] = str(base) + (os.pathsep + saved["JUPYTER_PATH"] if saved["JUPYTER_PATH"] else "")
    os.environ["PYTHONPATH"] = str(ROOT) + (os.pathsep + saved["PYTHONPATH"] if saved["PYTHONPATH"] else "")
    os.environ["HF_HUB_OFFLINE"] = "1"
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def execute(notebook) -> float:
    """Run a notebook in a fresh python3 kernel from lessons/ (as a student would); returns seconds."""
    client = nbclient.NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(LESSONS_DIR)}})
    start = time.perf_counter()
    client.execute()
    return time.perf_counter() - start


def exercises(notebook) -> list[tuple[str, str]]:
    """(wrong answer, check cell source) for every check cell."""
    return [(cell.metadata["blockviz"]["wrong_answer"], cell.source)
            for cell in notebook.cells if "check" in cell.metadata.get("tags", [])]


def rejection_cell(wrong_answer: str, check_source: str):
    """A cell that sets a wrong answer, re-runs the check, and fails unless the check's assert fires."""
    return nbformat.v4.new_code_cell(
        f"{wrong_answer}\n"
        "try:\n"
        f"    exec({check_source!r})\n"
        "except AssertionError as _bv_error:\n"
        "    print('rejected:', _bv_error)\n"
        "else:\n"
        f"    raise RuntimeError('the check accepted a wrong answer: ' + {wrong_answer!r})\n"
    )


def test_nine_lessons_and_their_index():
    assert [p.name[:2] for p in LESSONS] == [f"{i:02d}" for i in range(1, 10)]
    index = (LESSONS_DIR / "README.md").read_text()
    for path in LESSONS:
        assert f"({path.name})" in index, f"lessons/README.md does not list {path.name}"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_lesson_is_stored_stripped(path):
    notebook = read(path)
    nbformat.validate(notebook)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name}: a code cell has stored outputs"
            assert cell.execution_count is None, f"{path.name}: a code cell has an execution count"
    assert "widgets" not in notebook.metadata, f"{path.name}: stored widget state"
    assert notebook.metadata["kernelspec"]["name"] == "python3"


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_lesson_has_the_parts_of_a_lesson(path):
    """Goal in two sentences, the function it follows, the Visualizer, an exercise, a three-line summary."""
    notebook = read(path)
    markdown = [cell.source for cell in notebook.cells if cell.cell_type == "markdown"]
    code = "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "code")
    goal = next(m for m in markdown if "**Goal.**" in m).split("**Goal.**")[1].split("\n\n")[0]
    assert len(re.findall(r"[.!?](\s|$)", goal.strip())) == 2, f"{path.name}: the goal is not two sentences"
    assert any("**Follows:**" in m for m in markdown)
    assert "Visualizer" in code
    assert exercises(notebook), f"{path.name} has no exercise check"
    for cell in notebook.cells:
        if "check" in cell.metadata.get("tags", []):
            assert "assert " in cell.source and "Hint" in cell.source
    assert any("answer" in cell.metadata.get("tags", []) for cell in notebook.cells)
    summary = next(m for m in markdown if m.startswith("## Summary"))
    assert len([line for line in summary.splitlines() if line.startswith("- ")]) == 3


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_lesson_runs_top_to_bottom_and_checks_reject_wrong_answers(path, kernel_env):
    notebook = read(path)
    checks = exercises(notebook)
    notebook.cells += [rejection_cell(wrong, source) for wrong, source in checks]
    seconds = execute(notebook)
    rejections = [cell for cell in notebook.cells[-len(checks):]]
    for cell in rejections:
        text = "".join(output.get("text", "") for output in cell.outputs)
        assert "rejected:" in text, f"{path.name}: a check did not reject its wrong answer"
    print(f"{path.name}: {seconds:.1f} s")


def test_a_wrong_answer_fails_the_lesson(kernel_env):
    """Lesson 01 with the worked example's slip (32,768 bytes) typed in as the answer stops at its check."""
    notebook = read(LESSONS_DIR / "01_block_size.ipynb")
    answers = [cell for cell in notebook.cells if "answer" in cell.metadata.get("tags", [])]
    assert "my_answer = 65_536" in answers[0].source
    answers[0].source = answers[0].source.replace("my_answer = 65_536", "my_answer = 32_768")
    with pytest.raises(CellExecutionError) as failure:
        execute(notebook)
    assert "AssertionError" in str(failure.value) and "Hint" in str(failure.value)
