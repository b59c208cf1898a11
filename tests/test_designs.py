"""The registry of KV-cache designs (engine/designs.py) is the one place a design is told apart: no
source in engine/ or blockviz/ compares a design's name (argument parsing aside), probes a scheduler
with hasattr, or keeps a method that only raises; blockviz's traits are the engine's entries; the
engine refuses what its design cannot do in one line; and the registry imports without torch."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from blockviz.model.design import KV_DESIGNS, design_of
from engine.config import EngineConfig
from engine.designs import DEFAULT, DESIGNS, V0, V1, VLLM, get_design

ROOT = Path(__file__).resolve().parents[1]
NAMES = "|".join(re.escape(name) for name in DESIGNS)
# a design's name compared, in any of the idioms the code once used
NAME_SWITCHES = re.compile(
    rf"""kv_manager(_of\([^)]*\))?\s*(==|!=|\bin\b|\bnot in\b)"""  # kv_manager == ..., kv_manager in (...)
    rf"""|(==|!=)\s*["']({NAMES})["']|["']({NAMES})["']\s*(==|!=)"""  # == "v1", "vllm" != ...
    rf"""|\bin\s*[(\[{{]\s*["']({NAMES})["']"""  # in ("v1", "vllm")
    r"""|hasattr\(\s*[\w.]*scheduler"""  # hasattr(self.scheduler, "fork_seq")
)
# where the names may be read: the registry itself, and the command line's parsing of them
ALLOWED = {"engine/designs.py", "blockviz/commands/options.py", "blockviz/commands/compare.py"}


def sources() -> list[Path]:
    return sorted(p for top in ("engine", "blockviz") for p in (ROOT / top).rglob("*.py"))


def test_no_source_outside_the_registry_switches_on_a_design_name():
    found = []
    for path in sources():
        relative = path.relative_to(ROOT).as_posix()
        if relative in ALLOWED:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if NAME_SWITCHES.search(code):
                found.append(f"{relative}:{number}: {line.strip()}")
    assert not found, "compare the design's capabilities, not its name:\n" + "\n".join(found)


# where a test may switch on a name: the idioms above, written out; story names that are also designs' names
TESTS_ALLOWED = {"tests/test_designs.py", "tests/test_jupyter_card_screen_browser.py"}


def test_no_script_benchmark_or_test_switches_on_a_design_name():
    """scripts/ and benchmarks/ compare no design's name; a test takes a name as input (a parameter,
    an option) but switches on the registry's entry (`engine.design is VLLM`) or a capability
    (`design.chunked_prefill`), never on a name: the `if` lines of tests/ are searched."""
    found = []
    for path in sorted(p for top in ("scripts", "benchmarks", "tests") for p in (ROOT / top).rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative in TESTS_ALLOWED:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if relative.startswith("tests/") and not re.search(r"\bif\b", code):
                continue
            if NAME_SWITCHES.search(code):
                found.append(f"{relative}:{number}: {line.strip()}")
    assert not found, "switch on the registry's entry or a capability, not a name:\n" + "\n".join(found)


@pytest.mark.parametrize("line", [
    'if config.kv_manager == "vllm":', "self._fans_out_n = config.kv_manager in V1_DESIGNS",
    'if not hasattr(self.scheduler, "fork_seq"):', 'mode = "v1" if name != "v0" else mode',
    'x = kv_manager_of(header) == "v0"', 'if name in ("v1", "vllm"):',
])
def test_the_check_finds_each_idiom(line):
    """The pattern above catches each way a name was compared (else the grep proves nothing)."""
    assert NAME_SWITCHES.search(line)


def test_no_scheduler_keeps_a_method_that_only_raises():
    """A design that cannot preempt by swap says so in its capabilities, not with a `preempt` that raises."""
    for path in ("engine/v1/scheduler.py", "engine/vllm_core/scheduler.py"):
        assert "def preempt(" not in (ROOT / path).read_text(), path


def test_blockviz_reads_the_engines_entries():
    assert KV_DESIGNS is DESIGNS
    assert design_of({}) is DEFAULT is V0  # a header naming no design: the traces made before v1
    assert design_of({"kv_manager": VLLM.name}) is VLLM


def test_capabilities_tell_the_designs_apart():
    """v0 forks, copies on write and swaps; v1 and vllm fan n out, keep a null block and a free queue,
    serve KV-cache groups; only vllm has vLLM's CPU tier and options."""
    assert (V0.fork, V0.copy_on_write, V0.swap, V0.fans_out_n, V0.null_block, V0.groups) == (True,) * 3 + (False,) * 3
    for design in (V1, VLLM):
        assert (design.fork, design.swap, design.fans_out_n, design.null_block, design.free_queue,
                design.chunked_prefill, design.groups) == (False, False, True, True, True, True, True)
    assert [d.name for d in DESIGNS.values() if d.cpu_tier] == [VLLM.name]
    assert [d.name for d in DESIGNS.values() if d.vllm_options] == [VLLM.name]


def test_a_config_resolves_its_design():
    assert EngineConfig(kv_manager=V1.name).design is V1
    assert EngineConfig(kv_manager=V1).kv_manager == V1.name  # an entry is taken as its name
    assert EngineConfig().design is DEFAULT
    assert EngineConfig(kv_manager=V1.name).enable_prefix_caching and not EngineConfig().enable_prefix_caching
    with pytest.raises(ValueError, match="kv_manager must be one of v0, v1, vllm, sglang, got 'v2'"):
        get_design("v2")
    with pytest.raises(ValueError, match="preempts by recompute only"):
        EngineConfig(kv_manager=V1.name, preemption_mode="swap")


def test_the_engine_refuses_what_its_design_cannot_do_in_one_line(tiny_gpt2_dir):
    from engine.llm_engine import LLMEngine
    from engine.sequence import SamplingParams

    engine = LLMEngine(EngineConfig(model=str(tiny_gpt2_dir), device="cpu", kv_manager=V1.name, num_gpu_blocks=20))
    assert engine.design is V1 and engine.kv_manager is engine.scheduler.kv_cache_manager
    engine.add_request([1, 2, 3, 4], SamplingParams(max_tokens=4))
    engine.step()
    (seq_id,) = engine._groups["0"].seq_ids
    with pytest.raises(ValueError, match=r"^kv_manager 'v1' has no fork: n > 1 runs as requests") as fork:
        engine.fork(seq_id)
    with pytest.raises(ValueError, match=r"^kv_manager 'v1' preempts by recompute only") as preempt:
        engine.preempt("0")
    assert "\n" not in str(fork.value) + str(preempt.value)


def test_the_registry_imports_without_torch():
    code = "import engine.designs, engine.config, sys; assert 'torch' not in sys.modules, 'torch imported'"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("design", [V0, V1, VLLM], ids=lambda d: d.name)
def test_a_step_is_schedule_run_then_one_update(design, tiny_gpt2_dir):
    """LLMEngine.step calls its scheduler twice, whatever the design: schedule() before the forward,
    then one update_from_output(plan, sampled_token_ids) after sampling (v0's n > 1 forks, appends,
    stops and frees all behind it); under vLLM's async scheduling (kv_manager "vllm"'s default) the
    last plan's update comes between the next plan's schedule and its forward, as vLLM's batch
    queue orders them. No scheduler has free_seq or free_finished_seq_groups, and the vLLM adapter
    keeps no output of vLLM's between the calls."""
    if design.requires:
        pytest.importorskip(design.requires)
    from engine.llm_engine import LLMEngine
    from engine.sequence import SamplingParams

    engine = LLMEngine(EngineConfig(model=str(tiny_gpt2_dir), device="cpu", kv_manager=design.name,
                                    block_size=4, num_gpu_blocks=40))
    calls: list[str] = []
    depth = [0]  # the engine's calls only, not a scheduler's calls to itself

    def record(name, method):
        def call(*args, **kwargs):
            if not depth[0]:
                calls.append(name)
            depth[0] += 1
            try:
                return method(*args, **kwargs)
            finally:
                depth[0] -= 1
        return call

    scheduler = engine.scheduler
    for name in [n for n in dir(scheduler) if not n.startswith("_") and callable(getattr(scheduler, n))]:
        setattr(scheduler, name, record(name, getattr(scheduler, name)))
    runner = engine.model_runner
    for name in ("execute_model", "sample"):
        setattr(runner, name, record(name, getattr(runner, name)))
    engine.add_request([5, 6, 7, 8, 9], SamplingParams(n=2, max_tokens=3, temperature=0.7, seed=1))
    steps, seen = 0, []
    while engine.has_unfinished_requests():
        del calls[:]
        outputs = engine.step()
        steps += 1
        seen.append(list(calls))
    run, update = ["execute_model", "sample"], ["update_from_output"]
    if engine.async_scheduling:  # vLLM's batch queue: the last plan's update between the next one's schedule and run
        assert seen[0] == ["schedule", *run] and seen[-1][:2] == ["schedule", *update], seen
        assert all(calls == ["schedule", *update, *run] for calls in seen[1:-1]), seen
        assert seen[-1][2:] in ([], update), seen  # a plan whose every row finished goes back unrun
    else:
        assert all(calls == ["schedule", *run, *update] for calls in seen), seen
    assert steps >= 3 and outputs[-1].finished and len(outputs[-1].outputs) == 2
    for name in ("free_seq", "free_finished_seq_groups", "_pending", "_samples"):
        assert not hasattr(scheduler, name), name


def test_an_sglang_runs_title_names_sglangs_parts_not_vllms():
    """The title line of an SGLang run names what drives it (SGLang's RadixCache and scheduling
    policy) and its page 0 as SGLang's padding page, never vLLM's KVCacheManager or null block."""
    from blockviz.model.trace import engine_title as title_of, load_trace

    sglang, v1 = load_trace("sglang-story").header, load_trace("v1-story").header
    assert "SGLang 0.5.23's own RadixCache and scheduling policy" in title_of(sglang)
    assert "KVCacheManager" not in title_of(sglang) and "null block" not in title_of(sglang)
    assert "+ SGLang's padding page" in title_of(sglang)
    assert "+ the null block" in title_of(v1) and "RadixCache" not in title_of(v1)
