"""Grade a class's submitted lesson notebooks into marks:

    python3 -m blockviz.lessons.grade SUBMISSIONS... --out marks.csv [--summary summary.csv]
        [--timeout SECONDS] [--cpu SECONDS] [--memory MIB] [--max-output MIB]

SUBMISSIONS are notebooks or folders of them (`*.ipynb`, not recursive). Each notebook runs top to
bottom in a fresh kernel of its own (nbclient, as `jupyter nbconvert --execute` does), with:

- its working directory and HOME a new temporary directory, removed afterwards (the grader writes
  nothing but --out and the summary);
- a wall-clock budget for the whole notebook (--timeout: a cell still running at the end is
  interrupted, the cells after it are not run, the kernel is killed if it does not stop), and the
  kernel process limited by setrlimit to --cpu seconds of CPU (RLIMIT_CPU) and --memory MiB of
  address space (RLIMIT_AS);
- its outputs kept up to --max-output MiB, the rest dropped and the notebook marked;
- its check cells skipped: after the notebook's own cells, one cell added by the grader reads each
  exercise's answer variable as plain data, and the grader judges it in its own process with the
  lesson's checks (blockviz.lessons.checks) on the notebook's own variant (the seed of its
  metadata.blockviz.student, blockviz.lessons.variants), so nothing a notebook redefines can change
  its verdict.

--out gets one row per student and exercise (correct / wrong / unanswered / error, the slip the
answer matched and its hint) and a total row per notebook; the summary (by default beside --out,
NAME-summary.csv) one row per exercise: how many got it, the commonest slip. A file that is not a
notebook, or a notebook of another course (no exercise of ours), is reported on one line and
skipped. Exit status: 0 when graded, 2 on bad usage (one line).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ANSWERS_MIME = "application/vnd.blockviz.answers+json"
FIELDS = ("student", "notebook", "exercise", "verdict", "score", "answer", "slip", "hint", "note")
SUMMARY_FIELDS = ("exercise", "submissions", "correct", "wrong", "unanswered", "error", "commonest_slip",
                  "slip_count", "slip_hint")
ERROR = "error"
_LESSON_FILE = re.compile(r"\d\d_\w+\.ipynb")

# The cell the grader adds after a notebook's own: each answer variable as plain data (JSON), an
# enum as its class and member name, anything else as its type and a short repr.
_READ_ANSWERS = '''
def _blockviz_read_answers(names):
    import enum, json
    from IPython.display import display
    def encode(value):
        if value is Ellipsis:
            return {"ellipsis": True}
        if isinstance(value, enum.Enum):
            return {"enum": type(value).__module__ + ":" + type(value).__qualname__, "name": value.name}
        try:
            text = json.dumps(value)
        except (TypeError, ValueError, OverflowError, RecursionError):
            return {"type": type(value).__name__, "repr": repr(value)[:80]}
        return {"value": json.loads(text)} if len(text) < 100_000 else {"type": type(value).__name__, "repr": text[:80]}
    found = {name: encode(globals()[name]) if name in globals() else {"missing": True} for name in names}
    display({"%s": found}, raw=True)
_blockviz_read_answers(%r)
'''


class UsageError(ValueError):
    """Bad command-line usage; str() is one line."""


@dataclass
class Limits:
    """The bounds on one notebook: wall seconds for the whole run, CPU seconds and MiB of address
    space for its kernel process, MiB of outputs kept."""

    timeout: float = 600.0
    cpu: int | None = None
    memory: int = 8192
    max_output: float = 8.0

    @property
    def cpu_seconds(self) -> int:
        return self.cpu if self.cpu is not None else int(self.timeout) + 5


@dataclass
class Row:
    """One CSV row: a student's verdict on one exercise (or the total)."""

    student: str
    notebook: str
    exercise: str
    verdict: str
    score: int | str = 0
    answer: str = ""
    slip: str = ""
    hint: str = ""
    note: str = ""


@dataclass
class Run:
    """What running one notebook gave: each answer variable's encoded value, the exercises whose
    answer cell raised, and what went wrong with the run as a whole."""

    answers: dict[str, dict] = field(default_factory=dict)
    raised: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


class _Opaque:
    """An answer of a kind that cannot cross from the kernel (shown by its repr; equal to nothing)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _metadata(cell_or_notebook: dict) -> dict:
    metadata = cell_or_notebook.get("metadata")
    return metadata if isinstance(metadata, dict) else {}


def _ours(metadata: dict) -> dict:
    value = metadata.get("blockviz")
    return value if isinstance(value, dict) else {}


def _tags(cell: dict) -> list:
    tags = _metadata(cell).get("tags")
    return tags if isinstance(tags, list) else []


def answer_cells(notebook: dict) -> dict[str, int]:
    """The notebook's exercises, in order, each with the index of its answer cell."""
    found: dict[str, int] = {}
    for index, cell in enumerate(notebook.get("cells", [])):
        exercise = _ours(_metadata(cell)).get("exercise") if isinstance(cell, dict) else None
        if isinstance(exercise, str) and "answer" in _tags(cell) and exercise not in found:
            found[exercise] = index
    return found


def read_submission(path: Path) -> dict:
    """The notebook at `path` as JSON, or ValueError (one line) naming why it is not a lesson of ours."""
    try:
        notebook = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"not a notebook (not JSON: {str(exc).splitlines()[0][:80]})") from None
    if not isinstance(notebook, dict) or not isinstance(notebook.get("cells"), list) or not all(
            isinstance(cell, dict) for cell in notebook["cells"]):
        raise ValueError("not a notebook (no list of cells)")
    if not answer_cells(notebook):
        raise ValueError("not a blockviz lesson (no metadata.blockviz exercise): skipped")
    return notebook


def _kernel_spec(folder: Path, home: Path, limits: Limits) -> None:
    """A kernel spec in `folder`: ipykernel started through this module's --kernel mode, which sets
    the rlimits, with HOME and the caches in `home`."""
    spec = {
        "argv": [sys.executable, "-m", "blockviz.lessons.grade", "--kernel", str(limits.cpu_seconds),
                 str(limits.memory), "-f", "{connection_file}"],
        "display_name": "blockviz grader", "language": "python",
        "env": {"HOME": str(home), "IPYTHONDIR": str(home / ".ipython"), "XDG_CACHE_HOME": str(home / ".cache"),
                "XDG_CONFIG_HOME": str(home / ".config"), "XDG_DATA_HOME": str(home / ".local"),
                "MPLCONFIGDIR": str(home / ".matplotlib"), "JUPYTER_RUNTIME_DIR": str(home / ".runtime"),
                "TRITON_CACHE_DIR": str(home / ".triton"), "TMPDIR": str(home / ".tmp"),
                "PYTHONDONTWRITEBYTECODE": "1"},
    }
    (folder / "blockviz-grade").mkdir(parents=True)
    (folder / "blockviz-grade" / "kernel.json").write_text(json.dumps(spec))
    (home / ".tmp").mkdir(parents=True)


def run_notebook(notebook: dict, limits: Limits) -> Run:
    """Run `notebook` (its check cells left out) in a fresh, bounded kernel in a temporary
    directory, then read its answers; see the module docstring."""
    import nbformat
    from jupyter_client import AsyncKernelManager
    from jupyter_client.kernelspec import KernelSpecManager
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError

    from blockviz.lessons import EXERCISES

    exercises = answer_cells(notebook)
    names = {EXERCISES[exercise_id].variable for exercise_id in exercises if exercise_id in EXERCISES}
    cells = [cell for cell in notebook["cells"] if cell.get("cell_type") in ("code", "markdown", "raw")
             and not (cell.get("cell_type") == "code" and "check" in _tags(cell))]
    read = {"cell_type": "code", "metadata": {"blockviz": {"grader": True}}, "source":
            _READ_ANSWERS % (ANSWERS_MIME, sorted(names)), "outputs": [], "execution_count": None}
    work = {"cells": [*cells, read], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    for number, cell in enumerate(work["cells"]):
        cell = work["cells"][number] = dict(cell, id=f"cell-{number}")
        if cell.get("cell_type") == "code":
            cell["outputs"], cell["execution_count"] = [], None
    nb = nbformat.reads(json.dumps(work), as_version=4)
    read_index = len(nb.cells) - 1
    run = Run()

    with tempfile.TemporaryDirectory(prefix="blockviz-grade-") as scratch:
        root = Path(scratch)
        cwd, home, specs = root / "work", root / "home", root / "kernels"
        cwd.mkdir()
        _kernel_spec(specs, home, limits)
        km = AsyncKernelManager(kernel_name="blockviz-grade", connection_file=str(root / "connection.json"),
                                kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(specs)]))
        client = _make_client_class()(nb, km=km, kernel_name="blockviz-grade", resources={"metadata": {"path": str(cwd)}},
                                allow_errors=True, interrupt_on_timeout=True, shutdown_kernel="immediate",
                                startup_timeout=120)
        client.deadline = time.monotonic() + limits.timeout
        client.read_index = read_index
        client.max_output_bytes = int(limits.max_output * 2**20)

        async def execute() -> None:
            await asyncio.wait_for(client.async_execute(), timeout=limits.timeout + 60)

        try:
            asyncio.run(execute())
        except asyncio.TimeoutError:
            run.problems.append(f"did not stop within {limits.timeout:g} s: kernel killed")
        except DeadKernelError:
            run.problems.append(f"kernel died (past {limits.cpu_seconds} CPU s or {limits.memory} MiB?)")
        except Exception as exc:  # a kernel that will not start, a broken notebook
            run.problems.append(f"could not run: {type(exc).__name__}: {str(exc).splitlines()[0][:80] if str(exc) else ''}")
        finally:
            if km.has_kernel:
                try:
                    asyncio.run(km.shutdown_kernel(now=True))
                except Exception:
                    pass
        if client.timed_out:
            run.problems.insert(0, f"out of time after {limits.timeout:g} s: {client.skipped} cell(s) not run")
        if client.cut:
            run.problems.append(f"output past {limits.max_output:g} MiB dropped")
    for cell, original in zip(nb.cells[:read_index], cells):
        exercise_id = _ours(_metadata(original)).get("exercise")
        if exercise_id in exercises and "answer" in _tags(original):
            errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
            if errors:
                run.raised[exercise_id] = f"{errors[0].get('ename', 'error')} in the answer cell"
    for output in nb.cells[read_index].get("outputs", []):
        data = output.get("data", {}) if isinstance(output, dict) else {}
        if ANSWERS_MIME in data:
            found = data[ANSWERS_MIME]
            run.answers = json.loads(found) if isinstance(found, str) else dict(found)
    if not run.answers and not run.problems:
        run.problems.append("its answers could not be read")
    return run


def _make_client_class():
    from nbclient import NotebookClient

    class BoundedClient(NotebookClient):
        """A NotebookClient that keeps one deadline for the whole notebook (a cell gets what is left;
        once none is, the notebook's cells are skipped and only the grader's reading cell runs) and
        keeps at most max_output_bytes of the notebook's outputs."""

        deadline: float = math.inf
        read_index: int = -1
        max_output_bytes: int = 2**23
        timed_out = False
        cut = False
        skipped = 0
        _kept = 0

        async def async_start_new_kernel(self, **kwargs):
            kwargs.setdefault("stdout", subprocess.DEVNULL)  # what the kernel writes to its own
            kwargs.setdefault("stderr", subprocess.DEVNULL)  # stdout and stderr reaches no one
            return await super().async_start_new_kernel(**kwargs)

        async def async_execute_cell(self, cell, cell_index, execution_count=None, store_history=True):
            if cell_index == self.read_index:
                self.timeout = 30
            else:
                left = self.deadline - time.monotonic()
                if left <= 0 or self.timed_out:
                    self.timed_out = True
                    self.skipped += cell.get("cell_type") == "code"
                    return cell
                self.timeout = max(1, math.ceil(left))  # a cell timed out ends at or past the deadline
            result = await super().async_execute_cell(cell, cell_index, execution_count, store_history)
            if cell_index != self.read_index and time.monotonic() >= self.deadline:
                self.timed_out = True
            return result

        def output(self, outs, msg, display_id, cell_index):
            if cell_index != self.read_index and msg["msg_type"] != "error":
                self._kept += len(json.dumps(msg.get("content", {}), default=str))
                if self._kept > self.max_output_bytes:
                    self.cut = True
                    return None
            return super().output(outs, msg, display_id, cell_index)

    return BoundedClient


def decode(encoded: dict) -> Any:
    """An answer read from the kernel as the grader's own value (an enum only from engine/ or
    blockviz/, so nothing a notebook names is imported)."""
    if encoded.get("ellipsis"):
        return Ellipsis
    if "value" in encoded:
        return encoded["value"]
    if "enum" in encoded:
        module, _, qualname = str(encoded["enum"]).partition(":")
        if module.split(".")[0] in ("engine", "blockviz"):
            import importlib

            try:
                owner: Any = importlib.import_module(module)
                for part in qualname.split("."):
                    owner = getattr(owner, part)
                return owner[encoded["name"]]
            except (ImportError, AttributeError, KeyError, TypeError):
                pass
        return _Opaque(f"{qualname}.{encoded.get('name')}")
    return _Opaque(str(encoded.get("repr", encoded.get("type", "?"))))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def student_of(path: Path, notebook: dict) -> str:
    """The student's id: metadata.blockviz.student, else the file's name without .ipynb, or the
    folder's name for a file named as a lesson is (ada/05_prefix_caching.ipynb is ada's)."""
    student = _ours(_metadata(notebook)).get("student")
    if isinstance(student, (str, int)) and str(student).strip():
        return str(student).strip()
    return path.parent.name if _LESSON_FILE.fullmatch(path.name) and path.parent.name else path.stem


def variant_of(notebook: dict, student: str) -> tuple[int | None, str]:
    """The variant seed to grade against and a note: a notebook written for a student
    (metadata.blockviz.variant) is graded on the seed of the student it names, whatever seed it
    carries; any other notebook on the lesson as stored."""
    from blockviz.lessons import variants

    ours = _ours(_metadata(notebook))
    if "variant" not in ours:
        return None, ""
    lesson = str(ours.get("lesson", ""))
    if not variants.has_variants(lesson):
        return None, f"lesson {lesson!r} has no variants: graded as stored"
    seed = variants.seed_of(student, lesson)
    return seed, "" if ours.get("variant") == seed else f"variant {ours.get('variant')!r} is not {student}'s: graded on {seed}"


def grade_notebook(path: Path, notebook: dict, limits: Limits) -> list[Row]:
    """Run one submission and judge its answers: one Row per exercise and a total Row."""
    from blockviz.lessons import EXERCISES, variants

    student = student_of(path, notebook)
    seed, variant_note = variant_of(notebook, student)
    run = run_notebook(notebook, limits)
    problem = "; ".join(run.problems)
    rows = []
    for exercise_id in answer_cells(notebook):
        row = Row(student, path.name, exercise_id, ERROR)
        ex = EXERCISES.get(exercise_id)
        if ex is None:
            row.note = "no such exercise in blockviz.lessons"
            rows.append(row)
            continue
        encoded = run.answers.get(ex.variable)
        if exercise_id in run.raised:
            row.note = run.raised[exercise_id]
        elif encoded is None:
            row.note = problem or "not read"
        elif encoded.get("missing"):
            row.note = f"{ex.variable} is not defined" + (f" ({problem})" if problem else "")
        else:
            answer = decode(encoded)
            row.answer = _short(answer)
            variants.use(seed)
            try:
                verdict = ex.verdict(answer)
                slip = ex.slip_of(answer) if verdict.status == "wrong" else None
            except Exception as exc:  # a truth that cannot be computed here: the grader's fault, reported
                row.note = f"check failed: {type(exc).__name__}: {exc}"[:200]
            else:
                row.verdict = verdict.status
                row.score = int(verdict.correct)
                if slip is not None:
                    row.slip = _short(slip.resolve())
                    row.hint = ex.fill_in(slip.hint)
                row.note = problem
            finally:
                variants.use(None)
        if variant_note:
            row.note = "; ".join(n for n in (row.note, variant_note) if n)
        rows.append(row)
    total = sum(int(r.score) for r in rows)
    rows.append(Row(student, path.name, "total", f"{total}/{len(rows)}", total, note=problem))
    return rows


def summarize(rows: list[Row]) -> list[dict[str, Any]]:
    """Per exercise: submissions, counts per verdict, and the commonest slip with its count and hint."""
    by_exercise: dict[str, list[Row]] = {}
    for row in rows:
        if row.exercise != "total":
            by_exercise.setdefault(row.exercise, []).append(row)
    summary = []
    for exercise_id, group in by_exercise.items():
        counts = Counter(r.verdict for r in group)
        slips = Counter((r.slip, r.hint) for r in group if r.slip)
        (slip, hint), count = slips.most_common(1)[0] if slips else (("", ""), 0)
        summary.append({"exercise": exercise_id, "submissions": len(group), "correct": counts["correct"],
                        "wrong": counts["wrong"], "unanswered": counts["unanswered"], "error": counts[ERROR],
                        "commonest_slip": slip, "slip_count": count, "slip_hint": hint})
    return summary


def submissions(paths: list[str]) -> list[Path]:
    """The notebooks named, folders expanded to their *.ipynb files (sorted); UsageError when one
    does not exist or nothing is named."""
    found: list[Path] = []
    for name in paths:
        path = Path(name)
        if path.is_dir():
            found.extend(sorted(p for p in path.glob("*.ipynb") if p.is_file()))
        elif path.is_file():
            found.append(path)
        else:
            raise UsageError(f"{name}: no such file or folder")
    if not found:
        raise UsageError("no notebooks to grade")
    return found


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python3 -m blockviz.lessons.grade", add_help=True,
                                     description="Grade submitted blockviz lesson notebooks into a CSV of marks.")
    parser.add_argument("submissions", nargs="+", help="notebooks, or folders of *.ipynb")
    parser.add_argument("--out", required=True, help="the marks CSV to write")
    parser.add_argument("--summary", help="the per-exercise summary CSV (default: beside --out, NAME-summary.csv)")
    parser.add_argument("--timeout", type=float, default=600.0, help="wall seconds for one notebook (600)")
    parser.add_argument("--cpu", type=int, default=None, help="CPU seconds for one kernel (the timeout + 5)")
    parser.add_argument("--memory", type=int, default=8192, help="MiB of address space for one kernel (8192)")
    parser.add_argument("--max-output", type=float, default=8.0, help="MiB of outputs kept per notebook (8)")
    return parser


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2
        raise UsageError(message)


def parse(argv: list[str]) -> argparse.Namespace:
    """The parsed arguments, or UsageError (one line)."""
    parser = _parser()
    parser.__class__ = _Parser
    args = parser.parse_args(argv)
    for name in ("timeout", "max_output"):
        if not getattr(args, name) > 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive")
    if args.cpu is not None and args.cpu < 1 or args.memory < 256:
        raise UsageError("--cpu must be at least 1 and --memory at least 256")
    args.out = Path(args.out)
    args.summary = Path(args.summary) if args.summary else args.out.with_name(args.out.stem + "-summary.csv")
    for target in (args.out, args.summary):
        if target.is_dir():
            raise UsageError(f"{target} is a folder: give a file name")
        if not target.parent.is_dir():
            raise UsageError(f"{target.parent} does not exist")
    if args.out.resolve() == args.summary.resolve():
        raise UsageError("--out and --summary name the same file")
    return args


def _write_csv(path: Path, fields: tuple[str, ...], rows: list[dict[str, Any]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as stream:
        writer = csv.DictWriter(stream, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def grade(paths: list[Path], limits: Limits, report=print) -> list[Row]:
    """Grade each notebook (the bad ones reported on one line each through `report`)."""
    from blockviz.lessons import load_all

    load_all()
    rows: list[Row] = []
    for path in paths:
        try:
            notebook = read_submission(path)
        except ValueError as exc:
            report(f"{path}: {exc}")
            continue
        graded = grade_notebook(path, notebook, limits)
        if graded[-1].note:
            report(f"{path}: {graded[-1].note}")
        rows.extend(graded)
    return rows


def main(argv: list[str]) -> int:
    """The command line (see the module docstring)."""
    if argv[:1] == ["--kernel"]:
        return _kernel(argv[1:])
    try:
        args = parse(argv)
        paths = submissions(args.submissions)
    except UsageError as exc:
        print(f"blockviz.lessons.grade: error: {exc}", file=sys.stderr)
        return 2
    limits = Limits(args.timeout, args.cpu, args.memory, args.max_output)
    rows = grade(paths, limits, report=lambda line: print(line, file=sys.stderr))
    _write_csv(args.out, FIELDS, [vars(row) for row in rows])
    summary = summarize(rows)
    _write_csv(args.summary, SUMMARY_FIELDS, summary)
    print(f"{'exercise':18} {'correct':>8} {'of':>4}  commonest slip")
    for line in summary:
        slip = f"{line['commonest_slip']} ({line['slip_count']}x)" if line["slip_count"] else "-"
        print(f"{line['exercise']:18} {line['correct']:>8} {line['submissions']:>4}  {slip}")
    print(f"marks: {args.out}   summary: {args.summary}")
    return 0


def _kernel(argv: list[str]) -> int:
    """The grader's kernel: set RLIMIT_CPU and RLIMIT_AS on this process, then run ipykernel with
    the rest of the arguments (`-f CONNECTION_FILE`)."""
    import resource

    cpu, memory, rest = int(argv[0]), int(argv[1]), argv[2:]
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
    resource.setrlimit(resource.RLIMIT_AS, (memory * 2**20, memory * 2**20))
    os.makedirs(os.environ.get("TMPDIR", tempfile.gettempdir()), exist_ok=True)
    from ipykernel import kernelapp

    kernelapp.launch_new_instance(argv=rest)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
