"""`blockviz compare`: one workload under several settings, side by side."""

from __future__ import annotations

import pytest

from blockviz.cli import main
from engine.designs import V0, get_design


def test_compare_two_block_sizes_same_text_different_blocks(tiny_gpt2_dir, capsys):
    import json

    assert main(["compare", "--model", str(tiny_gpt2_dir), "--block-size", "2,8", "--num-gpu-blocks", "64",
                 "--prompt", "To be, or not to be", "--prompt", "The quick brown", "--max-tokens", "10",
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    small, big = doc["runs"]
    assert (small["block_size"], big["block_size"]) == (2, 8)
    assert small["same_text_as_first"] and big["same_text_as_first"]  # greedy: the text does not depend on blocks
    assert small["peak_blocks"] > big["peak_blocks"]
    assert small["tokens"] == big["tokens"] == 20


def test_compare_refuses_a_bad_list_in_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["compare", "--prefix-caching", "maybe"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--prefix-caching takes on, off" in err


def test_compare_varies_only_what_it_is_given():
    from blockviz.session.compare import configurations
    from engine.config import EngineConfig

    base = EngineConfig(num_gpu_blocks=32)
    configs = configurations(base, block_size=[4, 16])
    assert [(c.block_size, c.num_gpu_blocks, c.enable_prefix_caching, c.kv_manager) for c in configs] == [
        (4, 32, False, "v0"), (16, 32, False, "v0")]
    both = configurations(base, kv_manager=["v0", "v1"])  # each manager's own prefix-caching default
    assert [(c.kv_manager, c.enable_prefix_caching) for c in both] == [("v0", False), ("v1", True)]
    cached = configurations(base, kv_manager=["v0", "v1"], enable_prefix_caching=[True])
    assert [(c.kv_manager, c.enable_prefix_caching) for c in cached] == [("v0", True), ("v1", True)]
    assert len(configurations(base, kv_manager=["v0", "v1"], block_size=[4, 16], enable_prefix_caching=[True, False])) == 8


def test_the_notebook_compare_defaults_are_single_values(tiny_gpt2_dir):
    from blockviz.jupyter import compare

    grid = compare(["To be, or not to be"], block_size=[4, 16], max_tokens=4, model=str(tiny_gpt2_dir),
                   num_gpu_blocks=32, num_cpu_blocks=4)
    assert [(r.config.block_size, r.config.enable_prefix_caching, r.config.kv_manager) for r in grid.runs] == [
        (4, False, "v0"), (16, False, "v0")]
    assert "tok/s" not in grid.figures_html() and "tok/s" not in repr(grid)
    assert all("tokens_per_s" not in run.figures for run in grid.runs)  # one short run's speed means nothing
    grid.close()


N2_OPTIONS = ["--prompt", "To be, or not to be, that is the question", "--n", "2", "--max-tokens", "6",
              "--block-size", "4", "--num-gpu-blocks", "64"]


def test_compare_v0_v1_rows_differ_where_the_designs_do(tiny_gpt2_dir, capsys):
    """n=2: v0 forks and copies the last block on write, v1 runs two requests that share the prompt
    through the prefix cache (vLLM v1 has no fork); greedy, so the texts are the same."""
    import json

    assert main(["compare", "--model", str(tiny_gpt2_dir), *N2_OPTIONS, "--kv-manager", "v0,v1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    v0, v1 = doc["runs"]
    assert (v0["kv_manager"], v0["prefix_caching"], v1["kv_manager"], v1["prefix_caching"]) == ("v0", False, "v1", True)
    assert v0["forks"] == 1 and v0["copies_on_write"] >= 1 and v0["prefix_hits"] == 0
    assert v1["forks"] == 0 and v1["copies_on_write"] == 0 and v1["prefix_hits"] > 0
    assert v0["same_text_as_first"] and v1["same_text_as_first"]
    differ = doc["differences"]
    assert differ["forks"] == [1, 0] and differ["prefix hits"] == [0, v1["prefix_hits"]]
    assert "same text" not in differ and "tokens_per_s" not in v0
    # issue 39 item 6: v1 computes more tokens despite its hits, and a line says why
    if v1["tokens_computed"] > v0["tokens_computed"]:
        (why,) = doc["why"]
        assert f"{v1['tokens_computed'] - v0['tokens_computed']} more tokens" in why and "forks" in why
        assert "full blocks" in why
    else:
        assert doc["why"] == []


def test_compare_v0_v1_table_names_what_differs(tiny_gpt2_dir, capsys):
    assert main(["compare", "--model", str(tiny_gpt2_dir), *N2_OPTIONS, "--kv-manager", "v0,v1"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    head = next(line for line in lines if line.split()[:2] == ["kv", "cache"])
    assert "tok/s" not in out and "forks" in head and "recomp" in head
    rows = lines[lines.index(head) + 1:][:2]
    assert [row.split()[:2] for row in rows] == [["v0", "off"], ["v1", "on"]]  # the settings that vary, per row
    assert "what differs, in the rows' order:" in out and "  forks: 1 | 0" in out
    assert ("why " in out) == ("tokens computed:" in out and int(out.split("tokens computed: ")[1].split(" | ")[0])
                                < int(out.split("tokens computed: ")[1].split(" | ")[1].split()[0]))


def _recompute_run(model, manager: str, num_gpu_blocks: int, prompts: list[str]):
    from blockviz.session.compare import configurations, run_all
    from blockviz.session.spec import EngineSpec

    spec = EngineSpec.of(model=str(model), kv_manager=manager, block_size=2, num_gpu_blocks=num_gpu_blocks,
                         num_cpu_blocks=0, preemption_mode="recompute", max_tokens=12, temperature=0.0)
    (run,) = run_all(prompts, configurations(spec.config), spec.sampling_params())
    return run.figures


@pytest.mark.parametrize("manager, prompts", [
    ("v0", ["To be, or not to be", "The quick brown fox"]),  # no cache: every lost token computed again
    ("v1", ["To be, or not to be", "The quick brown fox"]),  # no shared opening: only its own blocks hit again
])
def test_tokens_recomputed_are_the_extra_work_preemption_caused(tiny_gpt2_dir, manager, prompts):
    roomy = _recompute_run(tiny_gpt2_dir, manager, 64, prompts)
    tight = _recompute_run(tiny_gpt2_dir, manager, 10 if get_design(manager) is V0 else 12, prompts)
    assert roomy["preemptions"] == 0 and roomy["tokens_recomputed"] == 0
    assert tight["preemptions"] > 0 and tight["tokens_recomputed"] > 0
    assert tight["tokens_computed"] - roomy["tokens_computed"] == tight["tokens_recomputed"]


@pytest.mark.parametrize("argv, message", [
    (["--kv-manager", "v2"], "--kv-manager takes v0, v1, vllm, sglang or v0,v1"),
    (["--kv-manager", "v0,v1", "--preemption-mode", "swap"], "preempts by recompute only"),
])
def test_compare_refuses_bad_managers_in_one_line(tiny_gpt2_dir, capsys, argv, message):
    try:
        code = main(["compare", "--model", str(tiny_gpt2_dir), *argv])
    except SystemExit as exit_info:
        code = exit_info.code
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err



def test_the_hit_rate_says_its_unit_where_v0_and_v1_count_differently(tiny_gpt2_dir, capsys):
    """v0's hit rate counts prompt blocks, v1's tokens (vLLM's PrefixCacheStats): compared side by
    side, the table's hit% and the differences line name each run's unit."""
    assert main(["compare", "--model", str(tiny_gpt2_dir), *N2_OPTIONS, "--kv-manager", "v0,v1"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line.split()[:1] in (["v0"], ["v1"])}
    assert "% blo" in rows["v0"] and "% tok" in rows["v1"]
    assert "hit rate (of blocks | tokens):" in out
