"""Pictures for slides (issue 29 item 5): `viz.save("step.svg")`, `moment.save(...)` and `blockviz
export TRACE --at N --out step.svg` write the frame the notebook draws at a cursor as SVG (or PNG).
The SVG is read back with xml.etree: every block's state and ref count, every pool, every block
table and the hashed blocks equal the reducer state at that cursor; the command and the notebook
write the same bytes; bad input is one line and exit code 2."""

from __future__ import annotations

import struct
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from blockviz.cli import main
from blockviz.jupyter import Visualizer
from blockviz.model.svg import MAX_HASH_ROWS
from blockviz.model.timeline import Timeline
from blockviz.model.trace import load_trace, shipped_traces
from blockviz.model.view import block_state

SVG = "{http://www.w3.org/2000/svg}"


def read_svg(path):
    return ET.parse(path).getroot()


def check_picture(root: ET.Element, state) -> None:
    """The picture's blocks, pools, tables and hash chains are the reducer state's."""
    pools = {g.get("data-device"): g for g in root.iter(f"{SVG}g") if g.get("class") == "pool"}
    assert set(pools) == {device for device, pool in state.pools.items() if pool}
    for device, pool in state.pools.items():
        if not pool:
            continue
        g = pools[device]
        assert int(g.get("data-n")) == len(pool)
        assert [int(r) for r in g.get("data-refs").split(",")] == [b.ref_count for b in pool]
        blocks = [b for b in g.iter(f"{SVG}g") if b.get("class") == "block"]
        if g.get("data-collapsed") == "true":  # one line: the pool holds nothing
            assert not blocks and all(block_state(b) in ("free", "null") for b in pool)  # a CPU tier's block 0
            continue
        assert [int(b.get("data-block")) for b in blocks] == list(range(len(pool)))
        for element, block in zip(blocks, pool):
            assert element.get("data-state") == block_state(block)
            assert int(element.get("data-ref")) == block.ref_count
            if block_state(block) != "free":
                assert int(element.get("data-fill")) == len(block.token_ids)
    tables = {}  # (seq, group) -> its logical blocks; a run with one group draws no group sections
    for g in root.iter(f"{SVG}g"):
        if g.get("class") == "table":
            sections = [s for s in g.iter(f"{SVG}g") if s.get("class") == "group-table"] or [g]
            for section in sections:
                tables[int(g.get("data-seq")), int(section.get("data-group", 0))] = [
                    (b.get("data-device"), int(b.get("data-block")), int(b.get("data-ref")))
                    for b in section.iter(f"{SVG}g") if b.get("class") == "lblock"]
    for group in range(state.num_kv_cache_groups):
        for seq_id, table in state.tables_of(group).items():
            assert tables[seq_id, group] == [(d, n, state.pools[d][n].ref_count) for d, n in table], (seq_id, group)
    hashed = {b.number for b in state.pools["gpu"] if b.block_hash is not None}
    drawn = {int(g.get("data-block")) for g in root.iter(f"{SVG}g") if g.get("class") == "hash"}
    assert drawn <= hashed and len(drawn) == min(len(hashed), MAX_HASH_ROWS)


def positions_of(trace) -> list[int]:
    """The start, the end, the middle, and just after the first event of each interesting kind."""
    kinds = {"copy_on_write", "prefix_cache_hit", "swap_out", "swap_in", "block_evicted", "fork"}
    firsts = {}
    for index, event in enumerate(trace.events):
        firsts.setdefault(event.type, index + 1)
    return sorted({0, len(trace.events), len(trace.events) // 2, *(firsts[k] for k in kinds if k in firsts)})


@pytest.mark.parametrize("name", shipped_traces())
def test_the_svg_blocks_equal_the_state_at_the_cursor(tmp_path, name):
    trace = load_trace(name)
    viz = Visualizer.from_trace(trace)
    reference = Timeline.for_trace(trace)
    for position in positions_of(trace):
        path = viz.save(tmp_path / f"{position}.svg", at=position)
        position = reference.landing(position)  # a picture of a state the engine can be in
        reference.seek(position)
        root = read_svg(path)
        assert root.get("data-position") == str(position)
        check_picture(root, reference.state)
    viz.close()


def test_the_command_writes_the_notebooks_picture_and_a_numbered_sequence(tmp_path, capsys):
    viz = Visualizer.from_trace("fork-cow")
    event = viz.run_until("copy_on_write")
    assert event is not None
    at = viz.position
    notebook = viz.save(tmp_path / "notebook.svg")
    moment = viz.snapshot()
    viz.run_to_completion()
    assert moment.save(tmp_path / "moment.svg").read_bytes() == notebook.read_bytes()  # frozen at `at`
    assert main(["export", "fork-cow", "--at", str(at), "--out", str(tmp_path / "cli.svg")]) == 0
    assert (tmp_path / "cli.svg").read_bytes() == notebook.read_bytes()
    assert "copy-on-write" in notebook.read_text()  # the cursor line says what the event did

    assert main(["export", "fork-cow", "--frames", f"{at - 2}:{at}", "--out", str(tmp_path / "anim.svg")]) == 0
    frames = sorted(tmp_path.glob("anim-*.svg"))
    assert [p.name for p in frames] == [f"anim-{p:04d}.svg" for p in range(at - 2, at + 1)]
    assert frames[-1].read_bytes() == notebook.read_bytes()
    reference = Timeline.for_trace(load_trace("fork-cow"))
    for position, path in zip(range(at - 2, at + 1), frames):
        reference.seek(position)
        check_picture(read_svg(path), reference.state)
    assert "3 pictures" in capsys.readouterr().out
    viz.close()


def test_projector_pictures_are_bigger_in_the_projector_palette(tmp_path):
    from blockviz.model.palette import SEQ_COLOURS_BOLD

    assert main(["export", "fork-cow", "--at", "40", "--projector", "--out", str(tmp_path / "big.svg")]) == 0
    assert main(["export", "fork-cow", "--at", "40", "--out", str(tmp_path / "small.svg")]) == 0
    big, small = read_svg(tmp_path / "big.svg"), read_svg(tmp_path / "small.svg")
    cell = lambda root: next(g for g in root.iter(f"{SVG}g") if g.get("class") == "block").find(f"{SVG}rect")
    assert float(cell(big).get("width")) > 1.4 * float(cell(small).get("width"))
    assert cell(big).get("fill") in SEQ_COLOURS_BOLD


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_png_is_the_svg_rasterized(tmp_path):
    pytest.importorskip("resvg_py", reason="PNG export needs resvg-py (the [export] extra; CI installs it)")
    viz = Visualizer.from_trace("swap")
    viz.run_until("swap_out")
    svg = read_svg(viz.save(tmp_path / "s.svg"))
    png = viz.save(tmp_path / "s.png").read_bytes()
    assert png_size(png) == (2 * int(svg.get("width")), 2 * int(svg.get("height")))
    assert main(["export", "swap", "--out", str(tmp_path / "cli.png")]) == 0
    assert png_size((tmp_path / "cli.png").read_bytes())[0] == 2 * int(svg.get("width"))
    viz.close()


def test_png_without_its_library_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "resvg_py", None)  # import resvg_py raises ImportError
    assert main(["export", "swap", "--out", str(tmp_path / "s.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "PNG export needs the resvg-py package" in err[0]
    assert not (tmp_path / "s.png").exists()
    viz = Visualizer.from_trace("swap")
    with pytest.raises(ValueError, match="resvg-py"):
        viz.save(tmp_path / "s.png")
    viz.close()


def _blockviz(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "blockviz", "export", *args], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize(("case", "args", "expected"), [
    ("no such trace", ["no-such-trace", "--out", "{tmp}/a.svg"], "no-such-trace"),
    ("at out of range", ["fork-cow", "--at", "100000", "--out", "{tmp}/a.svg"], "--at 100000 is out of range"),
    ("at not a number", ["fork-cow", "--at", "ten", "--out", "{tmp}/a.svg"], "--at must be an event position"),
    ("unknown extension", ["fork-cow", "--out", "{tmp}/a.gif"], "unknown picture format '.gif'"),
    ("existing out", ["fork-cow", "--out", "{tmp}/old.svg"], "already exists"),
    ("no directory", ["fork-cow", "--out", "{tmp}/none/a.svg"], "does not exist"),
    ("frames backwards", ["fork-cow", "--frames", "9:3", "--out", "{tmp}/a.svg"], "the end comes before the start"),
    ("frames and at", ["fork-cow", "--frames", "1:3", "--at", "2", "--out", "{tmp}/a.svg"], "not both"),
    ("frames not a range", ["fork-cow", "--frames", "7", "--out", "{tmp}/a.svg"], "--frames must be A:B"),
    ("no out", ["fork-cow"], "--out"),
], ids=lambda value: value if isinstance(value, str) else None)
def test_bad_input_is_one_line_exit_2(tmp_path, case, args, expected):
    (tmp_path / "old.svg").write_text("keep me")
    result = _blockviz(*(arg.format(tmp=tmp_path) for arg in args))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert (tmp_path / "old.svg").read_text() == "keep me"
    assert not (tmp_path / "a.svg").exists()
    if case == "existing out":  # --force overwrites it
        assert _blockviz("fork-cow", "--out", str(tmp_path / "old.svg"), "--force").returncode == 0
        assert (tmp_path / "old.svg").read_text().startswith("<svg")


def test_the_jupyter_install_brings_what_png_export_needs():
    """`pip install -e '.[jupyter]'` (the README's "In Jupyter" line) is enough for viz.save("step.png")."""
    import tomllib
    from pathlib import Path

    extras = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())[
        "project"]["optional-dependencies"]
    assert extras["export"] and set(extras["export"]) <= set(extras["jupyter"])
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    jupyter = readme[readme.index("## In Jupyter"):].split("\n## ", 1)[0]
    assert "pip install -e '.[jupyter]'" in jupyter


def test_a_picture_has_a_legend_and_the_whole_narration_as_its_caption(tmp_path):
    """A slide needs no narrator: the caption is the event's whole narration (never cut), and the
    legend names each block state the pools can show (the null block only where there is one)."""
    for name, null in (("swap", False), ("v1-story", True)):
        viz = Visualizer.from_trace(name)
        try:
            position = viz.run_until("preempted") and viz.position
            root = read_svg(viz.save(tmp_path / f"{name}.svg"))
            narration = viz.frame()["cursor"]["current"]
        finally:
            viz.close()
        caption = " ".join(t.text for t in root.iter(f"{SVG}text") if t.get("class") == "caption")
        assert position and caption == narration and len(narration) > 20
        (legend,) = [g for g in root.iter(f"{SVG}g") if g.get("class") == "legend"]
        swatches = [r.get("data-state") for r in legend.iter(f"{SVG}rect")]
        assert swatches == ["used", "cached", "free"] + (["null"] if null else [])


def test_the_pool_line_counts_free_as_the_tui_does(tmp_path):
    """Issue 45: the SVG's pool line says "13 free (13 cached)" as the TUI's status bar does (a
    cached block is free), not "0 free" beside "13 cached"."""
    from blockviz.model.view import pool_counts

    trace = load_trace("prefix-hit")
    viz = Visualizer.from_trace(trace)
    viz.seek(len(trace.events))
    used, cached, free = pool_counts(viz.state)["gpu"]
    assert cached  # the end of a prefix-caching run keeps its blocks cached
    root = read_svg(viz.save(tmp_path / "end.svg"))
    lines = ["".join(t.itertext()) for t in root.iter(f"{SVG}text") if "".join(t.itertext()).startswith("GPU pool")]
    assert lines == [f"GPU pool · {len(viz.state.pools['gpu'])} blocks · {used} used · {cached + free} free ({cached} cached)"]
    viz.close()
