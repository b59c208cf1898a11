"""What a lab costs the server: one student's kernel through a lesson, and the grader's truths.

    python benchmarks/lab_kernel.py                   # lessons 10 and 11 (and 12 where it exists)
    python benchmarks/lab_kernel.py lessons/05_prefix_caching.ipynb
    python benchmarks/lab_kernel.py --smoke           # a one-cell notebook and lesson 01's truths

Each notebook is filled with the answer key (blockviz/lessons/key.py) and run top to bottom, check
cells included, in a fresh python3 kernel (nbclient, as the grader and `jupyter nbconvert --execute`
do) in a temporary directory, from a process of its own, so that RUSAGE_CHILDREN is that kernel's
alone: wall seconds, the kernel's CPU seconds (user + system) and its peak resident memory. Then,
for each lesson of those notebooks, the grader's side: every truth of the lesson as stored computed
in a fresh process (what grading costs once per variant). Ends with one `figures: {...}` line.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SMOKE_NOTEBOOK = {"cells": [{"cell_type": "code", "id": "a", "source": "my_bytes = ...",
                             "metadata": {"blockviz": {"exercise": "01.bytes"}, "tags": ["answer"]},
                             "outputs": [], "execution_count": None}],
                  "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def one_notebook(path: str) -> dict:
    """Run one filled notebook in a fresh kernel; its costs (this process's children: the kernel)."""
    import nbformat
    from nbclient import NotebookClient

    from blockviz.lessons.key import fill

    raw = SMOKE_NOTEBOOK if path == "smoke" else json.loads(Path(path).read_text(encoding="utf-8"))
    notebook = nbformat.reads(json.dumps(fill(json.loads(json.dumps(raw)))), as_version=4)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as cwd:
        NotebookClient(notebook, timeout=1800, kernel_name="python3", resources={"metadata": {"path": cwd}}).execute()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"wall_s": round(time.perf_counter() - start, 1), "kernel_cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
            "kernel_peak_rss_mib": round(usage.ru_maxrss / 1024)}


def truths(lesson: str) -> dict:
    """Every truth of `lesson` as stored, computed in this process: what it cost."""
    from blockviz.lessons import EXERCISES, load_all

    start, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    load_all()
    for ex in EXERCISES.values():
        if ex.lesson == lesson:
            ex.truth()
    after = resource.getrusage(resource.RUSAGE_SELF)
    return {"wall_s": round(time.perf_counter() - start, 1),
            "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1),
            "peak_rss_mib": round(after.ru_maxrss / 1024)}


def in_a_process(*args: str) -> dict:
    done = subprocess.run([sys.executable, __file__, *args], check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    if argv[:1] == ["--one"] and len(argv) == 2:
        print(json.dumps(one_notebook(argv[1])))
        return 0
    if argv[:1] == ["--truths"] and len(argv) == 2:
        print(json.dumps(truths(argv[1])))
        return 0
    smoke = "--smoke" in argv
    paths = [arg for arg in argv if arg != "--smoke"]
    if any(arg.startswith("-") for arg in paths):
        print("usage: python benchmarks/lab_kernel.py [--smoke] [NOTEBOOK...]", file=sys.stderr)
        return 2
    if smoke:
        paths, lessons = ["smoke"], ["01"]
    else:
        paths = paths or [str(p) for p in sorted((ROOT / "lessons").glob("1[0-2]_*.ipynb"))]
        lessons = sorted({Path(p).name[:2] for p in paths})
    figures = {}
    for path in paths:
        measured = in_a_process("--one", path)
        figures.update({f"{Path(path).name} {name}": value for name, value in measured.items()})
        print(f"{Path(path).name}: wall {measured['wall_s']} s, kernel CPU {measured['kernel_cpu_s']} s, "
              f"kernel peak RSS {measured['kernel_peak_rss_mib']} MiB", flush=True)
    for lesson in lessons:
        measured = in_a_process("--truths", lesson)
        figures.update({f"truths {lesson} {name}": value for name, value in measured.items()})
        print(f"lesson {lesson}'s truths in the grader: wall {measured['wall_s']} s, CPU {measured['cpu_s']} s, "
              f"peak RSS {measured['peak_rss_mib']} MiB", flush=True)
    print("figures: " + json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
