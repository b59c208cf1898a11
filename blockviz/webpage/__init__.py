"""Pages that play a trace in a browser with no Python behind them (`blockviz export --html`).

frames.py computes every frame the notebook's Visualizer could draw; page.py writes one HTML file
holding them, the notebook's own front end (blockviz/jupyter/static/) and page.js, the controller
that answers the front end's messages in place of the kernel.
"""
