"""`--kv-manager sglang` on the command line: a run records a trace whose header names SGLang's
release and options, which loads, exports and reduces to SGLang's tree; bad input (no SGLang, an
unknown --sglang-option, a page_size SGLang refuses, a pool with no page to hand out) is one line
on stderr, exit 2."""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys

import pytest

from blockviz.cli import main


@pytest.fixture(autouse=True)
def _needs_sglang(request):
    if "without_sglang" not in request.node.name and importlib.util.find_spec("sglang") is None:
        pytest.skip("SGLang is not installed")


def _blockviz(*args: str, hide_sglang: bool = False):
    hide = "import sys; sys.modules['sglang'] = None; " if hide_sglang else "import sys; "
    code = hide + "from blockviz.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize(("args", "expected"), [
    (["--sglang-option", "page_sise=4"], "unknown sglang option 'page_sise'"),
    (["--sglang-option", "page_size=0"], "sglang option page_size must be a positive integer"),
    (["--sglang-option", "page_size=2.5"], "sglang option page_size must be a positive integer"),
    (["--sglang-option", "schedule_policy=fastest"], "sglang option schedule_policy must be one of"),
    (["--sglang-option", "page_size"], "--sglang-option takes KEY=VALUE"),
    (["--num-gpu-blocks", "1"], "needs --num-gpu-blocks >= 2"),
], ids=["unknown", "page-size-0", "page-size-float", "policy", "no-value", "no-page"])
def test_bad_sglang_input_is_one_line_exit_2(tmp_path, args, expected):
    result = _blockviz("record", "--out", str(tmp_path / "t.jsonl"), "--kv-manager", "sglang", *args)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and expected in lines[0], result.stderr
    assert not (tmp_path / "t.jsonl").exists()


def test_sglang_option_belongs_to_sglang(tmp_path):
    result = _blockviz("record", "--out", str(tmp_path / "t.jsonl"), "--kv-manager", "v1",
                       "--sglang-option", "page_size=4")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "--sglang-option applies to --kv-manager sglang" in lines[0]


def test_without_sglang_the_command_line_names_the_install_command():
    result = _blockviz("generate", "--kv-manager", "sglang", "--prompt", "A", hide_sglang=True)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "pip install -e '.[vllm,sglang]'" in lines[0] and "sglang==0.5.23" in lines[0]


def test_record_replays_exports_and_reduces_to_the_tree(tiny_gpt2_dir, tmp_path):
    from blockviz.model.reducer import CACHED, ReducerState
    from blockviz.model.trace import read_trace

    out = tmp_path / "sglang.jsonl"
    assert main(["record", "--out", str(out), "--model", str(tiny_gpt2_dir), "--kv-manager", "sglang",
                 "--sglang-option", "page_size=2", "--sglang-option", "schedule_policy=lpm", "--num-gpu-blocks", "40",
                 "--prompt", "All the world's a stage, and all", "--prompt", "All the world's a stage, the quick",
                 "--max-tokens", "4", "--temperature", "0"]) == 0
    trace = read_trace(out)
    header = trace.header
    assert header["kv_manager"] == "sglang" and header["sglang_version"] == "0.5.23"
    assert header["sglang_options"] == {"page_size": 2, "schedule_policy": "lpm"} and header["block_size"] == 2
    kinds = {e.type for e in trace.events}
    assert {"radix_node_inserted", "radix_node_split", "radix_lock_ref", "prefix_cache_hit"} <= kinds
    state = ReducerState.from_header(header).apply_all(trace.events)
    assert state.radix_nodes and all(node.lock_ref == 0 for node in state.radix_nodes.values())
    cached = {slot // 2 for node in state.radix_nodes.values() for slot in node.slots}
    assert {b.number for b in state.pools["gpu"] if b.state == CACHED} == cached
    svg = tmp_path / "end.svg"
    assert main(["export", str(out), "--out", str(svg)]) == 0
    assert svg.read_text().count("<rect") >= header["num_gpu_blocks"]
    used = max(range(len(trace.events) + 1), key=lambda at: ReducerState.from_header(header)
               .apply_all(trace.events[:at]).num_used("gpu"))
    asyncio.run(_replay_every_event(trace, used))


async def _replay_every_event(trace, busiest: int) -> None:
    """The TUI replays the trace event by event at 80x24; at the busiest cursor its pool line counts
    the blocks in use the reducer counts."""
    from blockviz.model.reducer import ReducerState
    from blockviz.tui.app import BlockvizApp

    app = BlockvizApp(trace=trace, deterministic=True, source_name="sglang")
    async with app.run_test(size=(80, 24)) as pilot:
        for at in range(len(trace.events) + 1):
            app.player.timeline.seek(at)
            app.render_views()
        app.player.timeline.seek(busiest)
        app.render_views()
        await pilot.pause()
        text = "\n".join("".join(seg.text for seg in strip) for strip in app.screen._compositor.render_strips())
        used = ReducerState.from_header(trace.header).apply_all(trace.events[:busiest]).num_used("gpu")
        assert f"GPU pool · {used}/{trace.header['num_gpu_blocks'] - 1} used" in text, text  # page 0: the null block


def test_compare_shows_sglang_hitting_a_partial_blocks_tokens(tiny_gpt2_dir, capsys):
    """Two prompts sharing 15 tokens, the second admitted after the first (SGLang's max_prefill_tokens):
    vLLM's hit stops at its last full block of 4, SGLang's tree at page_size 1 serves every shared
    token, and the table says so."""
    assert main(["compare", "--model", str(tiny_gpt2_dir), "--kv-manager", "vllm,sglang", "--block-size", "4",
                 "--sglang-option", "page_size=1", "--sglang-option", "max_prefill_tokens=16",
                 "--num-gpu-blocks", "64", "--prompt", "All the world's a stage, and all the men",
                 "--prompt", "All the world's a stage, and all the women merely", "--max-tokens", "4",
                 "--temperature", "0"]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.strip().startswith("r1 "))
    vllm_hit, sglang_hit = (int(part) for part in line.split(": ", 1)[1].split("  ")[0].split(" | "))
    assert vllm_hit % 4 == 0 and sglang_hit > vllm_hit, line
    assert f"sglang/1 hits {sglang_hit - vllm_hit} more: tokens of a partial block vllm/4 cannot share" in line


def test_compare_refuses_an_sglang_option_without_an_sglang_run(capsys):
    assert main(["compare", "--kv-manager", "v1,vllm", "--sglang-option", "page_size=1"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--sglang-option applies to --kv-manager sglang only" in lines[0]
