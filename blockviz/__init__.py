"""blockviz: views (CLI, Textual TUI, Jupyter widgets, traces) over the engine's event stream."""

__version__ = "0.1.0"
