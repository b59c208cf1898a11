"""`blockviz export TRACE --html`: the frames a page carries are the Visualizer's, the page holds the
notebook's own front end and asks for nothing over a network, bad input is one line with nothing
half-written, and exporting imports no torch, transformers or textual. The page in a browser:
tests/test_webpage_browser.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from blockviz.cli import main
from blockviz.jupyter.visualizer import Visualizer
from blockviz.jupyter.widgets import ESM
from blockviz.webpage import page as page_module
from blockviz.webpage.frames import ABSENT, page_data
from blockviz.webpage.page import page_html, write_atomic
from serve_fixtures import blockviz_env

ROOT = Path(__file__).resolve().parent.parent


def rebuilt(data: dict) -> list[dict]:
    """Every position's parts, walked from the deltas as page.js walks them."""
    out, now = [], {}
    for delta in data["deltas"]:
        now = dict(now)
        for key, value in zip(delta[::2], delta[1::2]):
            if value == ABSENT:
                now.pop(data["keys"][key], None)
            else:
                now[data["keys"][key]] = data["values"][value]
        out.append(now)
    return out


@pytest.fixture(scope="module")
def fork_cow():
    viz = Visualizer.from_trace("fork-cow")
    data = page_data(viz).to_json()
    yield viz, data
    viz.close()


def test_every_position_holds_the_visualizers_frame(fork_cow):
    viz, data = fork_cow
    positions = rebuilt(data)
    assert len(positions) == len(viz.timeline) + 1 == data["meta"]["length"] + 1
    numbers = [0, 0]
    for at in range(0, len(positions), 7):
        viz.timeline.seek(at)
        viz.selected = None
        frame = viz.frame()
        frame.pop("log")
        parts = positions[at]
        for key, value in frame.items():
            assert json.loads(json.dumps(parts[key])) == json.loads(json.dumps(value)), (key, at)
        state = viz.state
        for device, pool in state.pools.items():
            for number in (0, len(pool) - 1):
                viz.selected = (device, number)
                assert parts[f"inspector {device}:{number}"] == json.loads(json.dumps(viz.frame()["inspector"]))
                numbers[0] += 1
        for seq_id in state.tables:
            viz.selected = None
            viz.insight.picked = None
            owned = next(((d, b.number) for d, pool in state.pools.items() for b in pool if min(b.owners, default=-1) == seq_id), None)
            if owned is not None:
                viz.selected = owned
                assert parts[f"explain s:{seq_id}"] == json.loads(json.dumps(viz.insight.parts(("explain",))["explain"]))
                numbers[1] += 1
    viz.selected = None
    assert numbers[0] and numbers[1]
    assert data["meta"]["landing"] == [viz.timeline.landing(p) for p in range(len(viz.timeline) + 1)]


def test_the_log_rows_are_the_event_logs(fork_cow):
    """page.js builds the log from meta.log as view.event_log does: the rows it reads are the log's."""
    viz, data = fork_cow
    viz.timeline.seek(len(viz.timeline))
    rows = viz.frame()["log"]["rows"]
    assert [list(r) for r in rows] == data["meta"]["log"][-len(rows):]


def test_a_frame_without_its_log_is_the_frame_less_its_log(fork_cow):
    """Visualizer.frame(log=False), what page_data draws each position from, leaves out the log and nothing else."""
    viz, _ = fork_cow
    for at in (0, len(viz.timeline) // 2, len(viz.timeline)):
        viz.timeline.seek(at)
        whole, without = viz.frame(), viz.frame(log=False)
        assert "log" in whole and "log" not in without
        whole.pop("log")
        assert json.dumps(without, sort_keys=True) == json.dumps(whole, sort_keys=True), at


def fields_json(value):
    """A record as JSON read field by field from dataclasses.fields at each call (Record.to_json's contract)."""
    from dataclasses import fields

    from blockviz.model.record import Record

    if isinstance(value, Record):
        return {f.name: fields_json(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, list) and value and isinstance(value[0], Record):
        return [fields_json(item) for item in value]
    if isinstance(value, dict) and value and isinstance(next(iter(value.values())), Record):
        return {key: fields_json(item) for key, item in value.items()}
    return value


def test_a_records_json_is_its_fields_in_order_with_the_records_inside_it_as_dicts(fork_cow):
    """Record.to_json keeps each class's field names after its first record: records of several
    classes (a block's inspector, the explainer's rows and first miss, a subclass with fields of
    its own) come out as their fields say, in order, the same on a second call."""
    from dataclasses import dataclass

    from blockviz.model.insight_view import explain_record
    from blockviz.model.record import Record
    from blockviz.model.view import inspect_block

    @dataclass
    class Inner(Record):
        a: int
        b: tuple

    @dataclass
    class Outer(Inner):
        inner: Inner
        rows: list
        by_name: dict
        plain: list

    viz, _ = fork_cow
    viz.timeline.seek(len(viz.timeline))
    state = viz.state
    records = [inspect_block(state, device, number, vocab=viz.timeline.token_texts)
               for device, pool in state.pools.items() for number in range(len(pool))]
    records.append(explain_record(viz.insight.insights, viz.position, state=state, events=viz.timeline.events))
    records.append(Outer(1, (2, 3), Inner(4, ()), [Inner(5, (6,))], {"x": Inner(7, (8,))}, [1, "two"]))
    assert any(r.__class__.__name__ == "ExplainRecord" and r.blocks and r.first_miss for r in records)
    for record in records:
        first = record.to_json()
        assert list(first) == [name for name in fields_json(record)]
        assert first == fields_json(record) == record.to_json()
    assert records[-1].to_json() == {"a": 1, "b": (2, 3), "inner": {"a": 4, "b": ()}, "rows": [{"a": 5, "b": (6,)}],
                                     "by_name": {"x": {"a": 7, "b": (8,)}}, "plain": [1, "two"]}
    assert Inner(9, ()).to_json() == {"a": 9, "b": ()}


def test_a_part_equal_to_its_value_before_adds_no_delta_and_each_value_is_kept_once():
    """PageData.add_position: a part equal to its value at the position before (a new object) keeps
    its value's index and is not in the delta; a changed part is, and a value seen before (under any
    key) gets its first index back."""
    from blockviz.webpage.frames import PageData

    data = PageData(meta={})
    first = data.add_position({"pools": {"gpu": [1, 2]}, "card": None}, {})
    assert data.deltas[-1] == [0, 0, 1, 1] and data.values == [{"gpu": [1, 2]}, None]
    same = data.add_position({"pools": {"gpu": [1, 2]}, "card": None}, first)
    assert data.deltas[-1] == [] and same == first and len(data.values) == 2
    changed = data.add_position({"pools": {"gpu": [1, 3]}, "card": None}, same)
    assert data.deltas[-1] == [0, 2] and data.values[2] == {"gpu": [1, 3]}
    back = data.add_position({"pools": {"gpu": [1, 2]}, "card": {"gpu": [1, 2]}}, changed)
    assert data.deltas[-1] == [0, 0, 1, 0] and len(data.values) == 3
    gone = data.add_position({"pools": {"gpu": [1, 2]}}, back)
    assert data.deltas[-1] == [1, ABSENT]
    assert data.add_position({"pools": {"gpu": [1, 2]}, "card": None}, gone) == first


def test_the_page_holds_the_notebooks_own_front_end_and_nothing_from_a_network(tmp_path):
    text = page_html({"meta": {}, "keys": [], "values": [], "deltas": []}, "a <title>")
    esm = re.search(r'<script type="text/plain" id="bv-esm">(.*?)</script>', text, re.S).group(1)
    assert esm == ESM  # the very module the widgets load, not a copy of it in the repository
    assert "Content-Security-Policy" in text and "default-src 'none'" in text
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)
    assert "<title>a &lt;title&gt;</title>" in text
    assert not list((ROOT / "blockviz" / "webpage").glob("*blockviz*.js"))  # no copied static file


def test_write_atomic_leaves_nothing_half_written(tmp_path, monkeypatch):
    target = tmp_path / "p.html"
    target.write_text("keep me")

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(page_module.os, "replace", broken)
    with pytest.raises(OSError):
        write_atomic(target, "new text")
    assert target.read_text() == "keep me" and sorted(p.name for p in tmp_path.iterdir()) == ["p.html"]


def _export(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "blockviz", "export", *args], capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL, cwd=cwd, env=blockviz_env())


@pytest.mark.parametrize(("case", "args", "expected"), [
    ("unknown trace", ["no-such-trace", "--html", "{tmp}/a.html"], "no-such-trace"),
    ("missing directory", ["fork-cow", "--html", "{tmp}/none/a.html"], "does not exist"),
    ("refused trace", ["{tmp}/bad.jsonl", "--html", "{tmp}/a.html"], "bad.jsonl"),
    ("not a page name", ["fork-cow", "--html", "{tmp}/a.txt"], "ending in .html"),
    ("existing page", ["fork-cow", "--html", "{tmp}/old.html"], "already exists"),
    ("with --at", ["fork-cow", "--html", "{tmp}/a.html", "--at", "3"], "leave out --at"),
], ids=lambda value: value if isinstance(value, str) else None)
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, case, args, expected):
    (tmp_path / "old.html").write_text("keep me")
    (tmp_path / "bad.jsonl").write_text('{"type": "header", "version": 1}\n{"type": "no_such_event"}\n')
    before = sorted(p.name for p in tmp_path.iterdir())
    result = _export(*(arg.format(tmp=tmp_path) for arg in args), cwd=tmp_path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert (tmp_path / "old.html").read_text() == "keep me"


def test_a_page_too_big_is_refused_with_its_size(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(page_module, "MAX_PAGE_BYTES", 10_000)
    assert main(["export", "prefix-hit", "--html", str(tmp_path / "p.html")]) == 2
    line = capsys.readouterr().err.strip()
    assert len(line.splitlines()) == 1 and re.search(r"the page would be \d+\.\d MiB", line), line
    assert list(tmp_path.iterdir()) == []


def test_exporting_a_page_imports_no_torch_transformers_or_textual(tmp_path):
    code = ("import sys\nfrom blockviz.cli import main\n"
            f"assert main(['export', 'prefix-hit', '--html', {str(tmp_path / 'p.html')!r}]) == 0\n"
            "print(sorted(m for m in ('torch', 'transformers', 'textual') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            stdin=subprocess.DEVNULL, cwd=tmp_path, env=blockviz_env())
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"
    assert (tmp_path / "p.html").read_text().startswith("<!doctype html>")


def test_viz_save_html_writes_the_page_of_its_timeline(tmp_path):
    viz = Visualizer.from_trace("prefix-hit")
    try:
        viz.seek(20)
        path = viz.save(tmp_path / "lesson.html")
        assert viz.position == viz.timeline.landing(20)  # the cursor is left where it was
        text = path.read_text()
        assert text.startswith("<!doctype html>") and '<script type="text/plain" id="bv-esm">' in text
        with pytest.raises(ValueError, match="at="):
            viz.save(tmp_path / "other.html", at=3)
        with pytest.raises(FileNotFoundError):
            viz.save(tmp_path / "none" / "x.html")
    finally:
        viz.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lesson.html"]


def test_record_html_writes_the_trace_and_its_page(tmp_path, tiny_gpt2_dir):
    out, page = tmp_path / "run.jsonl", tmp_path / "run.html"
    assert main(["record", "--out", str(out), "--html", str(page), "--model", str(tiny_gpt2_dir),
                 "--prompt", "KV", "--max-tokens", "2"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.html", "run.jsonl"]
    assert 'id="bv-data"' in page.read_text()


def test_record_html_refuses_a_page_path_before_loading_a_model(tmp_path, capsys):
    assert main(["record", "--out", str(tmp_path / "t.jsonl"), "--html", str(tmp_path / "none" / "t.html"),
                 "--model", str(tmp_path / "no-model")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
