"""`blockviz record` stopped by SIGTERM or SIGINT (issue 50, item 6): one line saying no trace was
written, nothing left in the folder (no trace, no `.part`), the shell's exit code (143, 130); a
signal that arrives while the finished trace is renamed into place lets it finish whole."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from serve_fixtures import REPO, blockviz_env

from blockviz.commands.record import record_trace
from blockviz.commands.signals import StopOnSignals, Stopped
from blockviz.model.trace import TraceWriter, read_trace
from blockviz.session.spec import EngineSpec
from test_tui_fake_engine import FakeEngine

START_LIMIT_S = 240  # a cold start of python, torch and the model on a loaded machine: a limit, not a measurement


def _wait_for_part(folder: Path, process: subprocess.Popen) -> Path:
    deadline = time.monotonic() + START_LIMIT_S
    while time.monotonic() < deadline and process.poll() is None:
        parts = list(folder.glob(".*.part"))
        if parts:
            return parts[0]
        time.sleep(0.002)
    raise AssertionError(f"record wrote no .part (exit {process.poll()}): {process.stderr.read()[-2000:]}")


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"])
def test_record_stopped_mid_run_says_so_in_one_line_and_leaves_nothing(tmp_path, tiny_gpt2_dir, signum, code):
    out = tmp_path / "traces"
    out.mkdir()
    argv = [sys.executable, "-m", "blockviz", "record", "--out", str(out / "run.jsonl"), "--model",
            str(tiny_gpt2_dir), "--max-tokens", "100", "--n", "4",
            "--prompt", "ROMEO: But soft, what light", "--prompt", "JULIET: O Romeo, Romeo"]
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, cwd=REPO, env=blockviz_env())
    try:
        _wait_for_part(out, process)
        # held still while signalled, so the signal lands inside the run, whatever the machine's load
        process.send_signal(signal.SIGSTOP)
        process.send_signal(signum)
        process.send_signal(signal.SIGCONT)
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    lines = stderr.strip().splitlines()
    assert process.returncode == code and "Traceback" not in stderr, stderr[-2000:]
    assert lines[-1] == (f"blockviz: record stopped by {signal.Signals(signum).name}: "
                         "no trace written, nothing left behind"), stderr[-2000:]
    assert list(out.iterdir()) == []


def _spec() -> EngineSpec:
    return EngineSpec.of(model="fake", prompts=("ROMEO: hi", "JULIET:"), n=2, max_tokens=6, seed=7)


def test_a_signal_between_steps_stops_the_recording_and_removes_its_part(tmp_path):
    def signalled(session, steps_done: int) -> None:
        if steps_done == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    with StopOnSignals() as stop, pytest.raises(Stopped) as stopped:
        record_trace(_spec(), tmp_path / "run.jsonl", engine=FakeEngine(), between_steps=signalled,
                     publishing=stop.finishing)
    assert stopped.value.exit_code == 143 and stop.signum == signal.SIGTERM
    assert list(tmp_path.iterdir()) == []
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # the handler before it, back


def test_a_signal_while_the_trace_is_renamed_into_place_lets_it_finish_whole(tmp_path, monkeypatch):
    commit = TraceWriter.commit

    def signalled_commit(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        commit(self)

    monkeypatch.setattr(TraceWriter, "commit", signalled_commit)
    out = tmp_path / "run.jsonl"
    with StopOnSignals() as stop:
        recording = record_trace(_spec(), out, engine=FakeEngine(), publishing=stop.finishing)
    assert stop.signum == signal.SIGINT
    trace = read_trace(out)
    assert trace.header["prompts"] == ["ROMEO: hi", "JULIET:"] and len(trace.events) == recording.num_events > 0
    assert [p.name for p in tmp_path.iterdir()] == ["run.jsonl"]
    json.loads(out.read_text().splitlines()[-1])  # the last line whole


def test_a_second_signal_while_the_first_is_handled_is_ignored():
    with StopOnSignals() as stop:
        with pytest.raises(Stopped):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)  # the handler runs at the next bytecode; never reached
        os.kill(os.getpid(), signal.SIGTERM)  # cleaning up: ignored
        time.sleep(0)
    assert stop.signum == signal.SIGINT
