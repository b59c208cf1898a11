"""Moments: a Visualizer's picture at one cursor, frozen, so that later steps leave it as it was.

A lesson's paragraph discusses the pool as it was after a fork; the live widget above it shows
whatever the cursor reached last. `viz.snapshot()` (or `viz.show(at=N)`) returns a `Moment`: the
frame the live widget draws at that cursor (blockviz.model.view.snapshot, the same records), a
copy of the reducer state it was drawn from, and its own views holding that one frame, with no
link to the engine, the timeline or the controls. Displayed, it draws the same pools, block
inspector, block tables and hash chains as the live widget, under a line naming its cursor;
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import ipywidgets

from blockviz.jupyter.widgets import BlockTableView, HashChainView, Inspector, MomentHeader, PoolView
from blockviz.model.export import save_frame
from blockviz.model.reducer import ReducerState

# The parts of a Visualizer frame a moment keeps: the picture, without the log or the insights.
MOMENT_PARTS = ("block_size", "pools", "touched", "selected", "tables", "hashes", "hash_summary", "inspector",
                "step", "step_kind", "num_preemptions", "num_tokens_generated", "cursor", "kv_cache_groups")


class Moment:
    """The picture of a Visualizer at one cursor, frozen: `frame` (the view records, a deep copy),
    `state` (a copy of the reducer state at that cursor), `position` and `length` (events applied,
    events known then), `title`; `widget` draws `frame` and nothing else ever changes it."""

    def __init__(self, frame: dict[str, Any], state: ReducerState, *, title: str = "", header: dict | None = None,
                 zoom: float = 1.0, projector: bool = False) -> None:
        self.frame = copy.deepcopy({key: frame[key] for key in MOMENT_PARTS if key in frame})
        self.state = state
        cursor = self.frame.get("cursor") or {}
        self.position = int(cursor.get("position", state.num_events))
        self.length = int(cursor.get("length", self.position))
        self.title = title
        self.header = dict(header or {})
        self.zoom = zoom
        self.projector = projector
        self._widget: ipywidgets.Widget | None = None
        self._views: tuple = ()

    @property
    def widget(self) -> ipywidgets.Widget:
        """The frozen views (made on first use): the cursor line, pools and inspector, tables and hash chains."""
        if self._widget is None:
            views = [MomentHeader(), PoolView(), Inspector(), BlockTableView(), HashChainView()]
            for view in views:
                view.set_look(self.zoom, self.projector)
                view.show(self.frame)
            header, pools, inspector, block_tables, hashes = views
            self._views = tuple(views)
            self._widget = ipywidgets.VBox([
                header,
                ipywidgets.HBox([pools, inspector], layout=ipywidgets.Layout(width="100%")),
                ipywidgets.HBox([block_tables, hashes], layout=ipywidgets.Layout(width="100%")),
            ], layout=ipywidgets.Layout(width="100%"))
            self._widget.add_class("blockviz")
            self._widget.add_class("blockviz-moment")
        return self._widget

    def save(self, path: str | Path, *, overwrite: bool = True) -> Path:
        """Write this picture to `path` for a slide: .svg, or .png with the [export] extra
        (blockviz.model.export: the same records drawn by blockviz.model.svg). Returns the path."""
        return save_frame(self.frame, path, title=self.title, projector=self.projector, overwrite=overwrite)

    def summary(self) -> str:
        """The moment in words: its cursor and what the last event did."""
        cursor = self.frame.get("cursor") or {}
        words = cursor.get("current") or "start: no event applied yet"
        return f"{self.title or 'blockviz'} · moment at event {self.position}/{self.length} · {words}"

    @property
    def views(self) -> tuple:
        """The views drawing the frame: header, pools, inspector, block tables, hash chains."""
        self.widget
        return self._views

    def close(self) -> None:
        if self._widget is not None:
            for view in self._views:
                view.close()
            self._widget.close()
            self._widget = None

    def __repr__(self) -> str:
        return self.summary()

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self.summary())

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        bundle = dict(self.widget._repr_mimebundle_(**kwargs) or {})
        bundle["text/plain"] = self.summary()
        return bundle
