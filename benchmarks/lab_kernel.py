"""What one student's kernel costs through a lesson, for sizing a lab's server:

    python benchmarks/lab_kernel.py lessons/10_vllm_v1.ipynb lessons/11_what_a_token_costs.ipynb

Each notebook is filled with the answer key (blockviz/lessons/key.py) and run top to bottom, check
cells included, in a fresh python3 kernel of its own process (nbclient, as the grader and
`jupyter nbconvert --execute` do), in a temporary directory; one process per notebook, so
RUSAGE_CHILDREN is that kernel's alone. Prints wall seconds, the kernel's CPU seconds (user + system)
and its peak resident memory. The grader's side (the truths of one variant, computed once per
variant in the grading process) is measured by `--truths LESSON [SEED]`.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time


def one_notebook(path: str) -> None:
    """Run one filled notebook in a fresh kernel and print its costs (the child process's)."""
    import nbformat
    from nbclient import NotebookClient

    from blockviz.lessons.key import fill

    with open(path, encoding="utf-8") as stream:
        notebook = nbformat.reads(json.dumps(fill(json.load(stream))), as_version=4)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as cwd:
        NotebookClient(notebook, timeout=1800, kernel_name="python3", resources={"metadata": {"path": cwd}}).execute()
    wall = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"{path}: wall {wall:.1f} s, kernel CPU {usage.ru_utime + usage.ru_stime:.1f} s, "
          f"kernel peak RSS {usage.ru_maxrss / 1024:.0f} MiB", flush=True)


def truths(lesson: str, seed: int | None) -> None:
    """Compute every truth of one variant of `lesson` in this process and print what it cost."""
    from blockviz.lessons import EXERCISES, load_all, variants

    load_all()
    variants.use(seed)
    start, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    for ex in EXERCISES.values():
        if ex.lesson == lesson:
            ex.truth()
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    print(f"lesson {lesson} variant {seed}: truths in {time.perf_counter() - start:.1f} s wall, {cpu:.1f} CPU s; "
          f"grader peak RSS {after.ru_maxrss / 1024:.0f} MiB", flush=True)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--truths"] and len(argv) in (2, 3):
        truths(argv[1], int(argv[2]) if len(argv) == 3 else None)
        return 0
    if argv[:1] == ["--one"] and len(argv) == 2:
        one_notebook(argv[1])
        return 0
    if not argv or any(arg.startswith("-") for arg in argv):
        print("usage: python benchmarks/lab_kernel.py NOTEBOOK... | --truths LESSON [SEED]", file=sys.stderr)
        return 2
    for path in argv:
        subprocess.run([sys.executable, __file__, "--one", path], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
