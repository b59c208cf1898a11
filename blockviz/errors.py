"""Errors the CLI reports as one line with exit code 2."""


class UsageError(Exception):
    """A user mistake: printed as one line, exit code 2."""
