"""`blockviz record --out FILE`: an existing file is kept unless --force (one line, exit 2, before
the model loads), and a trace is written to a temporary file, fsync'ed, then renamed into place."""

from __future__ import annotations

import os

import pytest

from blockviz.cli import main
from blockviz.commands.record import record_trace
from blockviz.session.spec import EngineSpec
from blockviz.model.trace import TraceError, TraceWriter, read_trace
from test_tui_fake_engine import FakeEngine

HEADER = {"format": "blockviz-trace", "version": 1, "block_size": 4, "num_gpu_blocks": 8, "num_cpu_blocks": 0}


def _one_line(capsys, expected: str) -> None:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err and "Traceback" not in err, err


def test_record_refuses_an_existing_file_before_loading_a_model(tmp_path, capsys):
    out = tmp_path / "lesson.jsonl"
    out.write_text("the speaker's notes\n")
    # a model that does not exist: the refusal must come first, without loading anything
    assert main(["record", "--out", str(out), "--model", str(tmp_path / "no-model")]) == 2
    _one_line(capsys, "already exists: give another name, or --force to overwrite it")
    assert out.read_text() == "the speaker's notes\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lesson.jsonl"]


def test_record_force_overwrites(tmp_path, capsys, tiny_gpt2_dir):
    out = tmp_path / "lesson.jsonl"
    out.write_text("old\n")
    assert main(["record", "--out", str(out), "--force", "--model", str(tiny_gpt2_dir),
                 "--prompt", "KV", "--max-tokens", "2"]) == 0
    assert read_trace(out).events  # a whole trace replaced the old file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lesson.jsonl"]


def test_the_trace_is_fsynced_before_the_rename(tmp_path, monkeypatch):
    calls: list[str] = []
    real_fsync, real_link, real_replace = os.fsync, os.link, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "link", lambda a, b: (calls.append("link"), real_link(a, b))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (calls.append("replace"), real_replace(a, b))[1])
    spec = EngineSpec.of(model="fake", prompts=("ROMEO: hi",), max_tokens=3)
    out = tmp_path / "run.jsonl"
    record_trace(spec, out, engine=FakeEngine(), overwrite=False)
    assert calls[:2] == ["fsync", "link"]  # the file's data, then the new name (then its directory)
    assert read_trace(out).events
    calls.clear()
    record_trace(spec, out, engine=FakeEngine(), overwrite=True)
    assert calls[:2] == ["fsync", "replace"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.jsonl"]


def test_a_file_that_appears_during_the_run_is_kept(tmp_path):
    out = tmp_path / "run.jsonl"
    writer = TraceWriter.create(out, HEADER)
    out.write_text("written by someone else meanwhile\n")
    with pytest.raises(TraceError, match="already exists"):
        writer.commit()
    assert out.read_text() == "written by someone else meanwhile\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.jsonl"]


def test_a_run_cut_short_leaves_nothing(tmp_path):
    out = tmp_path / "run.jsonl"
    with pytest.raises(KeyboardInterrupt):
        with TraceWriter.create(out, HEADER):
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []
