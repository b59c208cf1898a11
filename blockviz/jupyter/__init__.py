"""blockviz in Jupyter: anywidget views of the real engine's paged KV cache, and the Visualizer.

    from blockviz.jupyter import Visualizer
    viz = Visualizer.from_trace("fork-cow")                     # a shipped trace, no model needed
    viz = Visualizer.live({"block_size": 4, "num_gpu_blocks": 16}, prompts=["ROMEO:"])
    viz                                                          # the widget (or a text summary)
    viz.step(); viz.state.num_used("gpu")                        # one engine step, then assert

Never imports textual: the views draw `snapshot()`, a pure function of the reducer state.
"""

from blockviz.jupyter.snapshot import snapshot
from blockviz.jupyter.visualizer import Visualizer
from blockviz.jupyter.widgets import BlockTableView, Controls, EventLogView, HashChainView, Inspector, PoolView

__all__ = ["Visualizer", "PoolView", "BlockTableView", "HashChainView", "EventLogView", "Inspector", "Controls",
           "snapshot"]
