"""The model layer: what every front end draws, computed from events alone.

reducer.py rebuilds pools, block tables, ref counts and hash chains from events; timeline.py keeps
the events and the reducer state at a cursor (time travel); player.py plays a timeline; view.py
turns the state at a cursor into the records every view draws (pools, tables, hash chains, the
inspector, the log); narration.py and palette.py say each event in words and give each sequence
its colour; insights.py and explain.py answer why (a prefix lookup's hits and misses, the
preemption ledger, memory truth); trace.py and trace_check.py are the event stream on disk.
No textual, no ipywidgets, no torch.
"""
