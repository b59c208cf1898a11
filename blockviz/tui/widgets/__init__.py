"""Textual widgets of the blockviz TUI (and palette.py, the look they share)."""
