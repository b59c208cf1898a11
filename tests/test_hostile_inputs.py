"""Hostile input, round two (issue 40): every trace header field checked where the trace is read,
the trace checker's hash rules, exports bounded by the file, `blockviz record` on a full disk, and
the answer key that never destroys a student's work. Each case is one line and exit code 2 at the
CLI, with nothing of the user's lost. The limits are in docs/traces.md and lessons/README.md."""

from __future__ import annotations

import errno
import json
import re
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from blockviz.cli import main
from blockviz.model.trace import HEADER_FIELDS, TraceError, TraceWriter, read_trace, resolve_trace_path
from serve_fixtures import REPO, blockviz_env

V1_STORY = resolve_trace_path("v1-story")
V0_PREFIX = resolve_trace_path("prefix-hit")


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _with_header(tmp_path: Path, source: Path = V1_STORY, **fields) -> Path:
    lines = _lines(source)
    header = json.loads(lines[0])
    header.update(fields)
    return _write(tmp_path / "bad.jsonl", [json.dumps(header)] + lines[1:])


def _one_line_exit_2(capsys, code: int, *expected: str) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2, captured.err
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


# ---------------------------------------------------------------- 3, 4: every header field checked

# A value no reader can use, for every field a header can have; a field added to HEADER_FIELDS
# without one here fails test_every_header_field_has_a_bad_value.
BAD_VALUES = {
    "blockviz_version": 1, "model": ["gpt2"], "model_type": None, "device": 0, "scenario": {},
    "description": 5, "budget_source": False,
    "block_size": 0, "num_gpu_blocks": "48", "num_cpu_blocks": -1,
    "enable_prefix_caching": "yes", "preemption_mode": "evict", "dtype": "int4",
    "block_bytes": None, "total_bytes": 0, "peak_bytes": -5, "gpu_memory_utilization": 1.5,
    "free_bytes": -1, "non_torch_bytes": "0",
    "max_model_len": 2.5, "vocab_size": 0, "num_layers": None, "num_heads": "4", "num_kv_heads": 0,
    "head_dim": True, "kv_manager": "v2", "prefix_caching_hash_algo": "md5",
    "prompts": ["ok", 3], "n": 0, "max_tokens": None, "seed": 1 << 64, "temperature": float("nan"),
    "arrivals": [{"step": -1, "prompt": "x"}], "later_prompts": [[2]],
    "kv_cache_groups": [{"kind": "chunked_local_attention", "layer_names": ["0"]}], "async_scheduling": "yes",
}


def test_every_header_field_has_a_bad_value():
    assert set(BAD_VALUES) == set(HEADER_FIELDS)


@pytest.mark.parametrize("field", sorted(BAD_VALUES))
def test_a_bad_header_field_is_refused_naming_it(tmp_path, field):
    path = _with_header(tmp_path, **{field: BAD_VALUES[field]})
    with pytest.raises(TraceError) as info:
        read_trace(path)
    message = str(info.value)
    assert "\n" not in message and "line 1" in message and repr(field) in message, message


@pytest.mark.parametrize("value", ["md5", ["sha256"], None, 256])
def test_the_hash_algo_is_one_the_engine_has(tmp_path, value):
    with pytest.raises(TraceError, match="prefix_caching_hash_algo"):
        read_trace(_with_header(tmp_path, prefix_caching_hash_algo=value))


@pytest.mark.parametrize("fields", [{"prefix_caching_hash_algo": "md5"}, {"prefix_caching_hash_algo": ["x"]},
                                    {"block_bytes": None}])
@pytest.mark.parametrize("command", ["replay", "export"])
def test_replay_and_export_refuse_a_bad_header_in_one_line(tmp_path, capsys, fields, command):
    path = _with_header(tmp_path, **fields)
    argv = [command, str(path)] + (["--out", str(tmp_path / "step.svg")] if command == "export" else [])
    _one_line_exit_2(capsys, main(argv), next(iter(fields)), "line 1")
    assert not (tmp_path / "step.svg").exists()


def test_every_shipped_header_is_valid_and_unknown_fields_are_kept(tmp_path):
    for path in (V1_STORY, V0_PREFIX):
        assert read_trace(path).header == json.loads(_lines(path)[0])
    assert read_trace(_with_header(tmp_path, notes={"by": "a teacher"})).header["notes"] == {"by": "a teacher"}


# ---------------------------------------------------------------- minor: the checker's hash rules


def _hashed_lines(path: Path) -> tuple[list[str], int]:
    lines = _lines(path)
    index = next(i for i, line in enumerate(lines) if i and json.loads(line)["type"] == "block_hashed")
    return lines, index


def _renumbered(lines: list[str]) -> list[str]:
    out = [lines[0]]
    for number, line in enumerate(lines[1:]):
        out.append(json.dumps({**json.loads(line), "seq_no": number}))
    return out


@pytest.mark.parametrize("source", [V0_PREFIX, V1_STORY])
def test_a_block_hashed_twice_is_refused(tmp_path, source):
    lines, index = _hashed_lines(source)
    path = _write(tmp_path / "twice.jsonl", _renumbered(lines[:index + 1] + [lines[index]] + lines[index + 1:]))
    with pytest.raises(TraceError, match=f"line {index + 2} is corrupted: .* is hashed again"):
        read_trace(path)


@pytest.mark.parametrize("source", [V0_PREFIX, V1_STORY])
def test_a_hash_that_is_its_own_parent_is_refused(tmp_path, source):
    lines, index = _hashed_lines(source)
    event = json.loads(lines[index])
    event["parent_hash"] = event["block_hash"]
    path = _write(tmp_path / "loop.jsonl", lines[:index] + [json.dumps(event)] + lines[index + 1:])
    with pytest.raises(TraceError, match=f"line {index + 1} is corrupted: hash {event['block_hash']} is its own parent"):
        read_trace(path)


# ---------------------------------------------------------------- 7: record on a full disk

HEADER = {"format": "blockviz-trace", "version": 1, "block_size": 4, "num_gpu_blocks": 8, "num_cpu_blocks": 0}


class _FullDisk:
    """A stream over a real file whose flush and close meet a full disk (ENOSPC), as a buffered
    trace's do when the disk fills during a run."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream.write(text)

    def flush(self) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def fileno(self) -> int:
        return self._stream.fileno()

    def close(self) -> None:
        self._stream.close()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_discard_removes_the_partial_file_when_the_close_fails(tmp_path):
    writer = TraceWriter.create(tmp_path / "run.jsonl", HEADER)
    writer._stream = _FullDisk(writer._stream)
    writer.discard()  # no OSError: nothing is published and nothing is left
    assert list(tmp_path.iterdir()) == []


def test_commit_on_a_full_disk_is_one_line_and_leaves_nothing(tmp_path):
    writer = TraceWriter.create(tmp_path / "run.jsonl", HEADER)
    writer._stream = _FullDisk(writer._stream)
    with pytest.raises(TraceError, match="No space left on device"):
        writer.commit()
    assert list(tmp_path.iterdir()) == []


def test_record_trace_on_a_full_disk_raises_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    from blockviz.commands.record import record_trace
    from blockviz.session.spec import EngineSpec
    from test_tui_fake_engine import FakeEngine

    def full(self, event) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(TraceWriter, "write", full)
    spec = EngineSpec.of(model="fake", prompts=("ROMEO: hi",), max_tokens=3)
    with pytest.raises(TraceError, match="No space left on device; no trace written"):
        record_trace(spec, tmp_path / "run.jsonl", engine=FakeEngine())
    assert list(tmp_path.iterdir()) == []


def _file_size_limit(limit: int):
    def apply() -> None:
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit a write fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_record_past_a_file_size_limit_is_one_line_exit_2_and_leaves_nothing(tmp_path, tiny_gpt2_dir):
    out = tmp_path / "traces"
    out.mkdir()
    argv = [sys.executable, "-m", "blockviz", "record", "--out", str(out / "run.jsonl"), "--model",
            str(tiny_gpt2_dir), "--prompt", "ROMEO: But soft, what light", "--max-tokens", "24"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
                            cwd=REPO, env=blockviz_env(), preexec_fn=_file_size_limit(4096))
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert last.startswith("blockviz: error: cannot write") and "File too large" in last, result.stderr[-2000:]
    assert list(out.iterdir()) == []


# ---------------------------------------------------------------- 6: the answer key keeps the students' work

from blockviz.lessons.key import KEY, main as key_main  # noqa: E402

LESSONS_DIR = REPO / "lessons"
LESSONS = sorted(LESSONS_DIR.glob("[0-9][0-9]_*.ipynb"))


def _key_refused(capsys, argv: list[str], *expected: str) -> str:
    code = key_main(argv)
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert captured.out == ""
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def _copy_lessons(tmp_path: Path) -> Path:
    source = tmp_path / "lessons"
    source.mkdir()
    for path in LESSONS:
        (source / path.name).write_bytes(path.read_bytes())
    return source


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and not p.is_symlink()}


@pytest.mark.parametrize("inside", [".", "solved", "solved/deeper"])
def test_the_key_refuses_a_destination_inside_its_source(tmp_path, capsys, inside):
    source = _copy_lessons(tmp_path)
    before = _snapshot(source)
    _key_refused(capsys, [str(source), str(source / inside)], "inside", "students' notebooks")
    _key_refused(capsys, ["--force", str(source), str(source / inside)], "inside")
    assert _snapshot(source) == before and sorted(p.name for p in source.iterdir()) == sorted(before)


def test_the_key_refuses_a_destination_reached_through_a_link_to_its_source(tmp_path, capsys):
    source = _copy_lessons(tmp_path)
    (tmp_path / "handout").symlink_to(source)
    _key_refused(capsys, [str(source), str(tmp_path / "handout")], "inside")


def test_the_key_asks_for_force_to_replace_and_replaces_whole_files(tmp_path, capsys):
    source, out = _copy_lessons(tmp_path), tmp_path / "solved"
    out.mkdir()
    mine = out / LESSONS[0].name
    mine.write_text("a student's own work\n")
    _key_refused(capsys, [str(source), str(out)], str(mine), "--force")
    assert mine.read_text() == "a student's own work\n" and [p.name for p in out.iterdir()] == [mine.name]
    assert key_main(["--force", str(source), str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == [p.name for p in LESSONS]  # no temporary file left
    assert any(cell["source"] == KEY[cell["metadata"]["blockviz"]["exercise"]]
               for cell in json.loads(mine.read_text())["cells"] if "answer" in cell["metadata"].get("tags", []))


def test_the_key_never_writes_through_a_link(tmp_path, capsys):
    source, out = _copy_lessons(tmp_path), tmp_path / "solved"
    out.mkdir()
    elsewhere = tmp_path / "precious.txt"
    elsewhere.write_text("not a notebook, not the key's\n")
    (out / LESSONS[1].name).symlink_to(elsewhere)
    for argv in ([str(source), str(out)], ["--force", str(source), str(out)]):
        _key_refused(capsys, argv, "symbolic link")
    assert elsewhere.read_text() == "not a notebook, not the key's\n"
    assert [p.name for p in out.iterdir()] == [LESSONS[1].name]  # nothing written beside it either


def test_the_key_refuses_a_destination_that_is_a_file(tmp_path, capsys):
    source, out = _copy_lessons(tmp_path), tmp_path / "solved"
    out.write_text("notes\n")
    _key_refused(capsys, [str(source), str(out)], "is not a directory")
    assert out.read_text() == "notes\n"


@pytest.mark.parametrize("damage", ["not json", "no cells", "unknown exercise"])
def test_a_bad_notebook_is_one_line_and_nothing_is_written(tmp_path, capsys, damage):
    source, out = _copy_lessons(tmp_path), tmp_path / "solved"
    last = source / LESSONS[-1].name  # the last one: a half-written destination would show before it
    if damage == "not json":
        last.write_text('{"cells": [')
        expected = "is not a readable notebook"
    elif damage == "no cells":
        last.write_text('{"cells": 3}')
        expected = "is not a notebook"
    else:
        notebook = json.loads(last.read_text())
        answer = next(c for c in notebook["cells"] if "answer" in c["metadata"].get("tags", []))
        answer["metadata"]["blockviz"]["exercise"] = "99.nothing"
        last.write_text(json.dumps(notebook))
        expected = "'99.nothing' has no answer in the key"
    _key_refused(capsys, [str(source), str(out)], str(last), expected)
    assert not out.exists()


def test_a_write_that_fails_part_way_leaves_the_old_file_whole(tmp_path, capsys, monkeypatch):
    source, out = _copy_lessons(tmp_path), tmp_path / "solved"
    assert key_main([str(source), str(out)]) == 0
    capsys.readouterr()
    before = _snapshot(out)
    real_replace = os.replace

    def disk_full_on_the_third(src, dst):
        if Path(dst).name == LESSONS[2].name:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", disk_full_on_the_third)
    line = _key_refused(capsys, ["--force", str(source), str(out)], "No space left on device")
    assert f"cannot write {out / LESSONS[2].name}:" in line  # the file, not the folder
    assert _snapshot(out)[LESSONS[2].name] == before[LESSONS[2].name]  # the old copy, whole
    assert sorted(p.name for p in out.iterdir()) == sorted(before)  # no temporary file left
    json.loads((out / LESSONS[2].name).read_text())



@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_the_key_writes_notebooks_with_the_users_umask(tmp_path, capsys, umask):
    source, out = _copy_lessons(tmp_path), tmp_path / "solved"
    old = os.umask(umask)
    try:
        assert key_main([str(source), str(out)]) == 0
        (tmp_path / "plain.txt").write_text("as open() makes it\n")
    finally:
        os.umask(old)
    expected = (tmp_path / "plain.txt").stat().st_mode & 0o777
    assert expected == 0o666 & ~umask
    assert {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()} == {p.name: expected for p in LESSONS}


def test_a_file_the_key_cannot_create_is_named(tmp_path, capsys, monkeypatch):
    """A temporary file refused (EACCES, as a folder the user may not write gives any user but
    root) is one line naming the notebook that was being written."""
    source, out = _copy_lessons(tmp_path), tmp_path / "solved"
    real_open = os.open

    def refused_for_the_second(path, flags, mode=0o777, **kwargs):
        if Path(path).name.startswith(f".{LESSONS[1].name}."):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real_open(path, flags, mode, **kwargs)

    monkeypatch.setattr(os, "open", refused_for_the_second)
    line = _key_refused(capsys, [str(source), str(out)], "Permission denied")
    assert f"cannot write {out / LESSONS[1].name}:" in line
    assert [p.name for p in out.iterdir()] == [LESSONS[0].name]  # no temporary file left


# ---------------------------------------------------------------- 5: exports bounded by the file

from blockviz.model import export as export_model  # noqa: E402
from blockviz.model.svg import MAX_POOL_CELLS  # noqa: E402
from blockviz.model.trace import MIN_POOL_BLOCKS  # noqa: E402
from test_trace_limits import HEADER as SMALL_HEADER, _allocated, _request, _write as _write_trace  # noqa: E402

BIG_SVG_BYTES = 4 << 20  # far more than a bounded picture needs, far less than one of 131,072 cells


def _huge_pools(tmp_path: Path) -> Path:
    """A trace of a few kilobytes whose header claims the most blocks any trace may have: 41 events,
    40 sequences each given a block far beyond the cells a picture draws."""
    header = {**SMALL_HEADER, "num_gpu_blocks": MIN_POOL_BLOCKS - 8, "num_cpu_blocks": 8}
    blocks = [_allocated(1 + i, block=MIN_POOL_BLOCKS - 100 - i, seq_ids=(i,)) for i in range(40)]
    return _write_trace(tmp_path / "huge.jsonl", header, _request(0, seq_ids=range(40)), *blocks)


def test_an_svg_of_a_huge_pool_is_bounded_and_draws_it_zoomed_out(tmp_path, capsys):
    trace = _huge_pools(tmp_path)
    assert main(["export", str(trace), "--out", str(tmp_path / "step.svg")]) == 0
    svg = (tmp_path / "step.svg").read_text()
    assert len(svg.encode()) < BIG_SVG_BYTES
    assert svg.count('class="block"') == 0 < svg.count('class="cell"') <= MAX_POOL_CELLS  # a cell per 128 blocks
    assert 'data-per-cell="128"' in svg and "1 cell = 128 blocks" in svg
    assert sum(map(int, re.findall(r'data-used="(\d+)"', svg))) == 40  # every used block counted in its cell


def test_frames_are_bounded_by_the_blocks_they_draw(tmp_path, capsys):
    trace = _huge_pools(tmp_path)
    code = main(["export", str(trace), "--frames", "0:40", "--out", str(tmp_path / "anim.svg")])
    _one_line_exit_2(capsys, code, "--frames 0:40 is 41 pictures of 131,072 pool blocks each", "blocks in all")
    assert list(tmp_path.glob("anim*")) == []


def test_frames_are_bounded_by_the_bytes_they_write(tmp_path, capsys, monkeypatch):
    from blockviz.commands import export as export_command

    monkeypatch.setattr(export_command, "MAX_EXPORT_BYTES", 50_000)  # fork-cow's pictures are about 20 KB each
    code = main(["export", "fork-cow", "--frames", "0:20", "--out", str(tmp_path / "anim.svg")])
    _one_line_exit_2(capsys, code, "MiB of pictures", "fewer frames")
    assert list(tmp_path.glob("anim*")) == []


def test_a_png_past_the_pixel_limit_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    with pytest.raises(export_model.ExportError, match="save it as .svg"):
        export_model.check_png_size('<svg xmlns="http://www.w3.org/2000/svg" width="1280" height="200000">')
    export_model.check_png_size('<svg xmlns="http://www.w3.org/2000/svg" width="1280" height="2000">')
    pytest.importorskip("resvg_py", reason="PNG export needs resvg-py (the [export] extra; CI installs it)")
    monkeypatch.setattr(export_model, "MAX_PNG_PIXELS", 1 << 16)
    code = main(["export", "fork-cow", "--frames", "3:5", "--out", str(tmp_path / "step.png")])
    _one_line_exit_2(capsys, code, "pixels as a PNG", "save it as .svg")
    assert list(tmp_path.iterdir()) == []


def test_a_png_of_a_huge_pool_is_drawn_within_the_limit(tmp_path, capsys):
    pytest.importorskip("resvg_py", reason="PNG export needs resvg-py (the [export] extra; CI installs it)")
    trace = _huge_pools(tmp_path)
    assert main(["export", str(trace), "--out", str(tmp_path / "step.png")]) == 0
    data = (tmp_path / "step.png").read_bytes()
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width * height <= export_model.MAX_PNG_PIXELS
