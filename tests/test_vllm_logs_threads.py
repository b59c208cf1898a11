"""engine/vllm_core's quiet_vllm_logs changes one process-wide value, the "vllm" logger's level,
while vLLM's objects are built: engines built on two threads at once (blockviz's live views run
them on threads) leave it as it was, whichever thread leaves its block first."""

from __future__ import annotations

import logging
import threading

import pytest

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
