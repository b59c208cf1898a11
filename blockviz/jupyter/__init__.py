"""blockviz in Jupyter: anywidget views of the real engine's paged KV cache, and the Visualizer.

    from blockviz.jupyter import Visualizer
    viz = Visualizer.from_trace("fork-cow")                     # a shipped trace, no model needed
    viz = Visualizer.live({"block_size": 4, "num_gpu_blocks": 16}, prompts=["ROMEO:"])
    viz                                                          # the widget (or a text summary)
    viz.step(); viz.state.num_used("gpu")                        # one engine step, then assert
    viz.run_until("copy_on_write"); viz.back_to("fork")          # breakpoints, both ways
    viz.ledger_view                                              # also explain_view, memory_view
    moment = viz.snapshot()                                      # this picture, frozen (or viz.show(at=N))
    viz.save("step.svg")                                         # the picture for a slide (.png: [export])
    Visualizer.from_trace("fork-cow", projector=True)            # big cells, the projector palette
    compare(["ROMEO:"], block_size=[4, 16])                      # one workload, several settings

Never imports textual: the views draw `snapshot()`, a pure function of the reducer state.
"""

from blockviz.jupyter.compare_grid import CompareGrid, compare
from blockviz.model.view import snapshot
from blockviz.jupyter.moment import Moment
from blockviz.jupyter.visualizer import Visualizer
from blockviz.jupyter.widgets import (
    BlockTableView,
    BreakpointsView,
    Controls,
    EventLogView,
    ExplainView,
    HashChainView,
    Inspector,
    LedgerView,
    MemoryView,
    PoolView,
)

__all__ = ["Visualizer", "Moment", "PoolView", "BlockTableView", "HashChainView", "EventLogView", "Inspector", "Controls",
           "ExplainView", "LedgerView", "MemoryView", "BreakpointsView", "CompareGrid", "compare", "snapshot"]
