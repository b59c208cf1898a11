"""The session layer: one engine session drives an engine for every front end.

spec.py says what to run (an EngineConfig plus the requests) and checks it before a model loads;
scenario.py holds the arrivals of the default story; engine_session.py owns an engine and its event
stream, steps it, plays arrivals, takes live commands and sets the K/V digest policy; the drivers
run a session for a live view: engine_driver.py steps it and reports to a Listener (the notebook
runs one under its lock), engine_thread.py runs that on a worker thread with backpressure (the
TUI's tests), engine_process.py in a child process (`blockviz run`); compare.py runs one workload
under several settings. No textual, no ipywidgets.
"""
