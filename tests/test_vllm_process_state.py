"""Building and running a `kv_manager="vllm"` engine changes nothing process-wide: no environment
variable, no global of any vLLM module, no logger's level (tests/test_vllm_tap.py runs a v1 and a
vllm engine on two threads at once). The one value engine/vllm_core changes for a while, the "vllm"
logger's level (quiet_vllm_logs, while vLLM's objects are built), is changed under one lock, so
engines built on two threads at once leave it as it was, whichever thread leaves its block first."""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import threading

import pytest

from engine.designs import VLLM
from engine.vllm_core import VLLM_LOGGER, quiet_vllm_logs


def _hold(entered: threading.Event, leave: threading.Event, seen: list) -> None:
    """One build: inside quiet_vllm_logs from `entered` until `leave` is set."""
    with quiet_vllm_logs():
        seen.append(logging.getLogger(VLLM_LOGGER).level)
        entered.set()
        assert leave.wait(30)


@pytest.mark.parametrize("first_out", ["first in", "second in"])
def test_two_threads_quieting_vllms_logger_leave_its_level_as_it_was(first_out):
    logger = logging.getLogger(VLLM_LOGGER)
    saved = logger.level
    logger.setLevel(logging.INFO)
    try:
        entered = [threading.Event(), threading.Event()]
        leave = [threading.Event(), threading.Event()]
        seen: list = []
        threads = [threading.Thread(target=_hold, args=(entered[i], leave[i], seen)) for i in range(2)]
        threads[0].start()
        assert entered[0].wait(30)
        threads[1].start()
        assert entered[1].wait(30)
        order = (0, 1) if first_out == "first in" else (1, 0)
        leave[order[0]].set()
        threads[order[0]].join(30)
        assert logger.level == logging.ERROR, "one build still runs: vLLM's logger stays quiet"
        leave[order[1]].set()
        threads[order[1]].join(30)
        assert seen == [logging.ERROR, logging.ERROR]
        assert logger.level == logging.INFO, f"left at {logging.getLevelName(logger.level)}"
    finally:
        for event in (*entered, *leave):
            event.set()
        logger.setLevel(saved)


def _vllm_globals() -> dict[tuple[str, str], int]:
    """(module, name) -> id of the value, for every global of every vLLM module imported."""
    return {(name, key): id(value) for name, module in list(sys.modules.items())
            if name.partition(".")[0] == VLLM.requires and module is not None
            for key, value in list(vars(module).items()) if not key.startswith("__")}


def _logger_levels() -> dict[str, int]:
    return {name: logger.level for name, logger in logging.Logger.manager.loggerDict.items()
            if isinstance(logger, logging.Logger)}


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_a_vllm_engine_with_its_cpu_tier_changes_no_environment_variable_vllm_global_or_logger(tiny_gpt2_dir):
    from engine import LLM, SamplingParams
    from tests.test_vllm_tap import GiB, OPENINGS, tiny_block_bytes

    def build_and_run():
        llm = LLM(str(tiny_gpt2_dir), kv_manager="vllm", device="cpu", block_size=4, num_gpu_blocks=40,
                  vllm_options={"kv_offloading_size": 16 * tiny_block_bytes(4) / GiB})
        llm.generate([OPENINGS[0], OPENINGS[0] + " one"], SamplingParams(max_tokens=6, ignore_eos=True))

    build_and_run()  # vLLM's modules imported: their globals exist before the run compared
    environ, known, levels = dict(os.environ), _vllm_globals(), _logger_levels()
    build_and_run()
    assert dict(os.environ) == environ
    now = _vllm_globals()
    changed = sorted(f"{module}.{name}" for (module, name), value in known.items() if now.get((module, name)) != value)
    assert not changed, f"vLLM globals assigned: {changed[:10]}"
    now_levels = _logger_levels()
    assert {name: now_levels[name] for name in levels} == levels
