"""Every benchmarks/*.py runs on its smallest setting (`--smoke`), so a renamed function or a moved
module fails here instead of the next reader's run. Found by glob: a new benchmark is covered
without being listed, and must have a --smoke flag.

A benchmark's contract: it exits 0 and prints one `figures: {...}` line (a JSON object of the
figures it measured, names to numbers), and a line starting `unavailable: ` for each part that
could not run here (a package, a model or chromium missing), which this test reports as a skip
after checking what did run (a benchmark that could run nothing prints no figures line). Nothing here reads the figures' values as good or bad: a smoke run's
timings mean nothing, and the machine is shared.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = sorted(path for path in (ROOT / "benchmarks").glob("*.py") if not path.name.startswith("_"))
RUN_LIMIT_S = 900  # a cold machine's worst case for one smoke run, not a measurement


def test_the_benchmarks_are_found():
    names = {path.name for path in BENCHMARKS}
    assert {"throughput.py", "block_manager.py", "tui.py", "compare_commits.py"} <= names


@pytest.mark.parametrize("script", BENCHMARKS, ids=lambda path: path.stem)
def test_benchmark_runs_on_its_smallest_setting(script: Path):
    """It runs, prints one line of finite figures, and leaves no folder of its own behind in TMPDIR."""
    scratch = Path(tempfile.mkdtemp(prefix="bvb-"))  # short: sockets made under TMPDIR have a length limit
    try:
        _run_smallest_setting(script, scratch)
        left = sorted(p.name for p in scratch.glob("blockviz-bench-*"))
        assert not left, f"{script.name} left {left} in TMPDIR"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _run_smallest_setting(script: Path, scratch: Path) -> None:
    # one torch thread: on 2 shared cores a tiny model's ops otherwise wait on a second thread's core
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TMPDIR": str(scratch)}
    done = subprocess.run([sys.executable, str(script), "--smoke"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=RUN_LIMIT_S)
    output = (done.stdout + done.stderr).strip()
    assert done.returncode == 0, f"{script.name} --smoke exited {done.returncode}:\n{output[-4000:]}"
    lines = done.stdout.splitlines()
    unavailable = [line.removeprefix("unavailable: ") for line in lines if line.startswith("unavailable: ")]
    printed = [line.removeprefix("figures: ") for line in lines if line.startswith("figures: ")]
    if unavailable and not printed:
        pytest.skip(f"{script.name} did not run: " + "; ".join(unavailable))
    assert len(printed) == 1, f"{script.name} printed {len(printed)} figures: lines:\n{output[-4000:]}"
    figures = json.loads(printed[0])
    assert isinstance(figures, dict)
    assert all(isinstance(value, (int, float)) and math.isfinite(value) for value in figures.values()), figures
    if unavailable:
        pytest.skip(f"{script.name}: " + "; ".join(unavailable))
    assert figures, f"{script.name} measured nothing:\n{output[-4000:]}"
