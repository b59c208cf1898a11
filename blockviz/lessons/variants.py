"""Variants of a lesson: the same exercises on other figures (block size, token budget, pool size),
one variant per student, so that answers cannot be copied from a neighbour.

A variant is a seed. `seed_of(student, lesson)` derives it from the student's id, so the teacher's
roster alone fixes every student's figures; `use(seed)` makes it the variant this process computes
with (the notebook's first code cell calls it; None is the lesson as stored). A lesson with variants
registers a function of the seed returning its figures, an object whose `fields()` is a dict of
them by name (`register`); its checks, hints and slips
read `figures(lesson)`, and the truths are kept per variant (checks.Exercise.truth).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

_ACTIVE: int | None = None
_FIGURES: dict[str, Callable[[int | None], Any]] = {}


def seed_of(student: str, lesson: str) -> int:
    """The variant seed of `student` for `lesson`: a stable 32-bit number from their id (never 0)."""
    digest = hashlib.sha256(f"blockviz-lesson-{lesson}:{student.strip()}".encode()).digest()
    return int.from_bytes(digest[:4], "big") or 1


def use(seed: int | None) -> None:
    """Compute every check in this process on variant `seed` (None: the lesson as stored)."""
    global _ACTIVE
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
        raise ValueError(f"a variant seed is a non-negative integer, got {seed!r}")
    _ACTIVE = seed


def active() -> int | None:
    """The variant seed this process computes with (None: the lesson as stored)."""
    return _ACTIVE


def register(lesson: str, figures_of: Callable[[int | None], Any]) -> None:
    """Declare that `lesson` has variants: `figures_of(seed)` gives its figures (seed None: as stored)."""
    _FIGURES[lesson] = figures_of


def has_variants(lesson: str) -> bool:
    return lesson in _FIGURES


def figures(lesson: str) -> Any:
    """The figures of `lesson` in the active variant."""
    return _FIGURES[lesson](_ACTIVE)


def fields(lesson: str) -> dict[str, Any]:
    """The active variant's figures of `lesson` as a dict (what hints are formatted with), {} for a
    lesson without variants."""
    if lesson not in _FIGURES:
        return {}
    return figures(lesson).fields()
