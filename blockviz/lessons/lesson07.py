"""Lesson 07 (lessons/07_free_and_eviction.ipynb): free-but-cached blocks and LRU eviction (vLLM v0
`CachedBlockAllocator` with its `LRUEvictor`; here engine.block_allocator)."""

from __future__ import annotations

from functools import cache

from blockviz.lessons.checks import Slip, exercise
from blockviz.lessons.engines import fresh

OPTIONS = {"block_size": 4, "num_gpu_blocks": 12, "num_cpu_blocks": 0, "enable_prefix_caching": True}
HAMLET, WINTER = "HAMLET: To be, or not to be,", "Now is the winter of our discontent"
AGAIN, CITIZEN = "HAMLET: To be, or not to be, that is", "First Citizen:\nBefore we proceed any further, hear me speak."


@cache
def _run() -> dict:
    """The lesson's four requests on a fresh engine: each one's table and the first block evicted."""
    from engine import events as ev
    from engine.sequence import SamplingParams

    params = SamplingParams(max_tokens=4, ignore_eos=True)
    tables = {}
    with fresh(OPTIONS) as viz:
        for name, prompt in (("hamlet", HAMLET), ("winter", WINTER), ("again", AGAIN)):
            request_id = viz.add_request(prompt, params)
            viz.step()
            tables[name] = viz.state.table_blocks(viz.state.requests[request_id][0])
            viz.run_to_completion()
        viz.add_request(CITIZEN, params)
        tables["evicted"] = viz.run_until(ev.BlockEvicted.type).block
    return tables


@exercise("07", "my_block", "Hamlet's blocks were used again later, so the other request's blocks are older; among "
                            "blocks freed at the same moment, the one deepest in the chain goes first.",
          slips=[Slip(lambda: _run()["hamlet"][0], "Hamlet's blocks were revived by the third request: they are the "
                                                   "most recently used."),
                 Slip(lambda: _run()["winter"][0], "within one chain the deepest block goes first, so a shared "
                                                   "opening lives longest.")])
def check_block():
    """The first block evicted when the 20-token request arrives."""
    return _run()["evicted"]
