"""Before / after: a benchmark run against two git revisions in one session, side by side (figures,
not a test: it prints medians and ratios, it never fails on time).

Each revision is exported (`git archive`) into a temporary folder and its own benchmarks/ script
runs there as a fresh process with PYTHONPATH set to that folder, so each side imports its own
engine/ and blockviz/. `.` stands for this checkout as it is, uncommitted changes included.
--benchmarks-from REV puts REV's benchmarks/ into every exported side instead of its own (for a
revision whose benchmarks are older than the `figures:` line, or to hold the benchmark fixed while
the code under it changes); a `.` side keeps its own. The two
sides take turns, A B, B A, A B, ... (--rounds rounds), so a machine that speeds up or slows down
mid-session weighs on both alike; every figure a run prints on its `figures:` line is collected,
and the summary gives each side's median, B / A, and B / A round by round (the ratio of the two
runs of one round: read its range as the noise).

    python benchmarks/compare_commits.py main HEAD                      # the three presets below
    python benchmarks/compare_commits.py main . --preset block_manager --rounds 5
    python benchmarks/compare_commits.py A B --rounds 3 -- kv_managers.py --requests 16 --pairs 1
    python benchmarks/compare_commits.py main main --benchmarks-from . --preset block_manager
    python benchmarks/compare_commits.py --smoke                        # HEAD against HEAD, block_manager --smoke

Presets (the before/after figures issue 36 asks for):
  throughput     benchmarks/README.md's CPU workload, engine alone: tokens/s and its fraction of
                 the compute-bound limit (by wall and by CPU seconds), one torch thread
  block_manager  the per-token append cost of v0 and v1 against nano-vllm's
  tui            engine tokens/s with the live TUI attached against alone (benchmarks/tui.py's engine part)
  app_cpu        the live app's own CPU time per run, the engine replaced by a replay
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PRESETS = {
    "throughput": ["throughput.py", "--engine-only", "--repeat", "3", "--requests", "48", "--prompt-lens", "16-128",
                   "--max-tokens", "8-64", "--layers", "6", "--width", "384", "--heads", "6", "--threads", "1"],
    "block_manager": ["block_manager.py", "--rounds", "3"],
    "tui": ["tui.py", "--part", "engine", "--sessions", "1", "--cycles", "3", "--no-thread"],
    "app_cpu": ["app_cpu.py", "--sessions", "1", "--runs", "4"],
}
DEFAULT_PRESETS = ("throughput", "block_manager", "tui")


def resolve(revision: str) -> str | None:
    """The commit `revision` names in this repository, `.` for this checkout, or None."""
    if revision == ".":
        return "."
    found = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}"], cwd=ROOT,
                           capture_output=True, text=True)
    return found.stdout.strip() if found.returncode == 0 else None


def export(commit: str, into: Path, benchmarks_from: Path | None = None) -> Path:
    """The tree of `commit` in a folder of its own (`.`: this checkout itself, as it is), with
    the benchmarks/ folder of `benchmarks_from` in place of its own when given."""
    if commit == ".":
        return ROOT
    folder = into / commit[:12]
    if not folder.exists():
        folder.mkdir(parents=True)
        archive = subprocess.Popen(["git", "archive", "--format=tar", commit], cwd=ROOT, stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", str(folder)], stdin=archive.stdout, check=True)
        if archive.wait() != 0:
            raise RuntimeError(f"git archive {commit} failed")
        if benchmarks_from is not None and benchmarks_from != folder:
            shutil.rmtree(folder / "benchmarks", ignore_errors=True)
            shutil.copytree(benchmarks_from / "benchmarks", folder / "benchmarks",
                            ignore=shutil.ignore_patterns("__pycache__"))
    return folder


def run_once(checkout: Path, command: list[str], timeout: float) -> tuple[dict[str, float], float]:
    """One run of benchmarks/<script> in `checkout`: the figures it printed, and its wall seconds."""
    script, *args = command
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, str(checkout / "benchmarks" / script), *args], cwd=checkout, env=env,
                          capture_output=True, text=True, timeout=timeout)
    elapsed = time.perf_counter() - start
    lines = done.stdout.splitlines()
    found = [line for line in lines if line.startswith("figures: ")]
    if done.returncode != 0 or not found:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise SystemExit(f"compare_commits: {script} in {checkout} exited {done.returncode}"
                         f"{'' if found else ' without a figures: line'}:\n{tail}")
    return json.loads(found[-1].removeprefix("figures: ")), elapsed


def compare(name: str, command: list[str], checkouts: dict[str, Path], rounds: int, timeout: float) -> dict[str, float]:
    """Runs `command` on both sides, alternating, and prints the side-by-side table; returns the
    median B / A of each figure."""
    (label_a, path_a), (label_b, path_b) = checkouts.items()
    runs: dict[str, list[dict[str, float]]] = {label_a: [], label_b: []}
    print(f"\n{name}: benchmarks/{' '.join(command)}, {rounds} rounds, A = {label_a}, B = {label_b}", flush=True)
    for number in range(rounds):
        order = [(label_a, path_a), (label_b, path_b)]
        if number % 2:
            order.reverse()
        for label, path in order:
            figures, seconds = run_once(path, command, timeout)
            runs[label].append(figures)
            print(f"  round {number + 1} {'A' if label == label_a else 'B'}: {seconds:5.1f} s", flush=True)
    keys = [key for key in runs[label_a][0] if all(key in run for side in runs.values() for run in side)]
    width = max(len(key) for key in keys) if keys else 10
    print(f"  {'figure':<{width}} {'A median':>12} {'B median':>12} {'B / A':>8}   B / A by round")
    ratios = {}
    for key in keys:
        a = statistics.median(run[key] for run in runs[label_a])
        b = statistics.median(run[key] for run in runs[label_b])
        by_round = [rb[key] / ra[key] if ra[key] else float("nan") for ra, rb in zip(runs[label_a], runs[label_b])]
        ratios[f"{name}: {key} B / A"] = b / a if a else float("nan")
        print(f"  {key:<{width}} {a:12.4g} {b:12.4g} {ratios[f'{name}: {key} B / A']:7.3f}x   "
              + " ".join(f"{r:.3f}" for r in by_round))
    return ratios


def fail(message: str) -> int:
    """Bad input: one line on stderr, exit status 2."""
    print(f"compare_commits: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     usage="%(prog)s A B [--preset NAME ...] [--rounds N] [-- SCRIPT.py ARGS...]")
    parser.add_argument("revisions", nargs="*", metavar="REV", help="two git revisions (`.`: this checkout as it is)")
    parser.add_argument("--preset", action="append", choices=sorted(PRESETS),
                        help=f"a benchmark to compare (repeatable; default {', '.join(DEFAULT_PRESETS)})")
    parser.add_argument("--rounds", type=int, default=3, help="turns of each side (default 3)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds one benchmark run may take")
    parser.add_argument("--benchmarks-from", metavar="REV",
                        help="run REV's benchmarks/ on every exported side (`.`: this checkout's)")
    parser.add_argument("--smoke", action="store_true",
                        help="HEAD against HEAD, block_manager.py --smoke, 2 rounds: a check that it runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.revisions, args.rounds, args.preset = args.revisions or ["HEAD", "HEAD"], 2, None
        command = ["block_manager.py", "--smoke"]
    if len(args.revisions) != 2:
        return fail("give two revisions, e.g. main HEAD")
    if args.rounds < 1:
        return fail("--rounds must be at least 1")
    if command and args.preset:
        return fail("give --preset or a command after --, not both")
    if shutil.which("git") is None or subprocess.run(["git", "rev-parse", "--git-dir"], cwd=ROOT,
                                                     capture_output=True).returncode != 0:
        print(f"unavailable: {ROOT} is not a git checkout (or git is not installed)")
        return 0
    commits = [resolve(revision) for revision in args.revisions]
    for revision, commit in zip(args.revisions, commits):
        if commit is None:
            return fail(f"{revision!r} is not a revision of {ROOT}")
    scripts_commit = resolve(args.benchmarks_from) if args.benchmarks_from else None
    if args.benchmarks_from and scripts_commit is None:
        return fail(f"{args.benchmarks_from!r} is not a revision of {ROOT}")
    if command and not (ROOT / "benchmarks" / command[0]).is_file():
        return fail(f"no benchmark benchmarks/{command[0]}")
    benches = {"command": command} if command else {name: PRESETS[name] for name in args.preset or DEFAULT_PRESETS}
    with tempfile.TemporaryDirectory(prefix="blockviz-compare-") as tmp:
        scripts = export(scripts_commit, Path(tmp) / "benchmarks-from") if scripts_commit else None
        paths = [export(commit, Path(tmp), scripts) for commit in commits]
        labels = list(args.revisions)
        if labels[0] == labels[1]:
            labels = [f"{labels[0]} (1)", f"{labels[1]} (2)"]
        checkouts = dict(zip(labels, paths))
        for label, path in checkouts.items():
            print(f"{label}: {path}")
        figures: dict[str, float] = {}
        for name, bench in benches.items():
            figures.update(compare(name, bench, checkouts, args.rounds, args.timeout))
    print("figures: " + json.dumps({k: round(v, 4) for k, v in figures.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
