"""Exercise checks for the lessons (lessons/*.ipynb): pure, re-runnable, with a hint in a box.

A lesson module declares each exercise as a function that computes the true answer on its own
(building its own engine when it needs one, never stepping the lesson's), decorated with
`exercise(...)`. The decorator turns it into the check the notebook calls:

    my_blocks = ...                # the stored notebook: a blank (Python's Ellipsis)
    lesson.check_blocks(my_blocks) # "Not answered yet", "Correct: ..." or "Not quite. Hint: ..."

The truth is computed once per kernel and kept, so a check gives the same verdict in any order,
any number of times. A verdict is shown as a styled box in Jupyter (text/html with a text/plain
twin) and as plain text elsewhere; a wrong answer never raises. Known slips (the wrong answers a
student is likely to give) carry their own hint; any other wrong answer gets the exercise's hint.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

CORRECT, WRONG, UNANSWERED = "correct", "wrong", "unanswered"
# the box's border and background per verdict
_COLOURS = {CORRECT: ("#2a9d8f", "#e8f6f3"), WRONG: ("#e76f51", "#fdf0ec"), UNANSWERED: ("#8d99ae", "#f2f4f7")}


@dataclass(frozen=True, slots=True)
class Slip:
    """A likely wrong answer and the hint it earns. `value` is the answer itself, or a function
    of no arguments computing it (for answers that depend on the model, like a hash)."""

    value: Any
    hint: str

    def resolve(self) -> Any:
        return self.value() if callable(self.value) else self.value


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a check says: `status` is CORRECT, WRONG or UNANSWERED; `text` the sentence shown."""

    exercise: str
    status: str
    text: str

    @property
    def correct(self) -> bool:
        return self.status == CORRECT

    def __str__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        border, background = _COLOURS[self.status]
        return (f"<div class='blockviz-verdict blockviz-verdict-{self.status}' style='border-left:6px solid "
                f"{border};background:{background};color:#1d1d1d;padding:8px 12px;margin:4px 0;"
                f"font-family:sans-serif;font-size:14px;border-radius:3px'>{html.escape(self.text)}</div>")


@dataclass(frozen=True)
class Exercise:
    """One exercise: its id ("02.blocks"), the notebook variable holding the answer, the function
    computing the truth, the hint for a wrong answer, the known slips, what a correct answer is
    told, and how answers compare (`same`, equality unless given)."""

    id: str
    variable: str
    truth_of: Callable[[], Any]
    hint: str
    slips: tuple[Slip, ...] = ()
    praise: str = ""
    same: Callable[[Any, Any], bool] | None = None
    unit: str = ""
    other_unit: tuple[str, Callable[[], Any]] | None = None

    @property
    def lesson(self) -> str:
        return self.id.split(".", 1)[0]

    def truth(self) -> Any:
        """The true answer in the active variant (blockviz.lessons.variants), computed once each."""
        from blockviz.lessons import variants

        return _truth(self.truth_of, variants.active())

    def slip_of(self, answer: Any) -> Slip | None:
        """The known slip `answer` matches, or None (a right answer matches none). A right number
        given as text, and the right count in the other unit, are slips of their own."""
        truth = self.truth()
        if _agrees(self.same, answer, truth):
            return None
        if _is_number(truth) and not _is_number(answer):
            return Slip(answer, _GIVE_A_NUMBER)
        if self.other_unit is not None:
            other, in_other = self.other_unit
            if _agrees(self.same, answer, in_other()) and not _agrees(self.same, in_other(), truth):
                return Slip(answer, f"that number counts {other}; the question asks for {self.unit}.")
        return next((s for s in self.slips if not _agrees(self.same, s.resolve(), truth)
                     and _agrees(self.same, answer, s.resolve())), None)

    def verdict(self, answer: Any) -> Verdict:
        """The verdict on `answer`, shown nowhere (the check shows it)."""
        if answer is Ellipsis:
            return Verdict(self.id, UNANSWERED, f"Not answered yet: put your answer in `{self.variable}` (in place "
                                                f"of ...) and run this cell again.")
        if _agrees(self.same, answer, self.truth()):
            return Verdict(self.id, CORRECT, "Correct" + (f": {self.fill_in(self.praise)}" if self.praise else "."))
        slip = self.slip_of(answer)
        hint = self.fill_in(slip.hint if slip is not None else self.hint)
        return Verdict(self.id, WRONG, f"Not quite ({self.variable} = {_short(answer)}). Hint: {hint}")

    def fill_in(self, text: str) -> str:
        """`text` with the active variant's figures put in its {fields} (a lesson with variants)."""
        from blockviz.lessons import variants

        return text.format_map(variants.fields(self.lesson)) if variants.has_variants(self.lesson) else text

    def __call__(self, answer: Any) -> None:
        """Check `answer` and show the verdict (a box in Jupyter, a line of text elsewhere)."""
        show(self.verdict(answer))


EXERCISES: dict[str, Exercise] = {}


def exercise(lesson: str, variable: str, hint: str, slips: tuple[Slip, ...] | list[Slip] = (),
             praise: str = "", same: Callable[[Any, Any], bool] | None = None, unit: str = "",
             other_unit: tuple[str, Callable[[], Any]] | None = None) -> Callable[[Callable[[], Any]], Exercise]:
    """Decorate a lesson's truth function `check_NAME` (no arguments): it becomes the Exercise
    "LESSON.NAME", registered in EXERCISES, which a notebook calls with the student's answer.
    `unit` names what a count counts ("blocks", "tokens"); `other_unit` is the other unit's name and
    a function giving the true count in it, so that a right count in the wrong unit is told so."""

    def wrap(truth_of: Callable[[], Any]) -> Exercise:
        name = truth_of.__name__.removeprefix("check_")
        ex = Exercise(f"{lesson}.{name}", variable, truth_of, hint, tuple(slips), praise, same, unit, other_unit)
        EXERCISES[ex.id] = ex
        return ex

    return wrap


def close_to(answer: Any, truth: Any) -> bool:
    """Numbers equal to three decimal places (a fraction typed as 0.75 or 3/4)."""
    return isinstance(answer, (int, float)) and not isinstance(answer, bool) and math.isclose(answer, truth, abs_tol=5e-4)


def show(verdict: Verdict) -> None:
    """Display the verdict: the styled box under IPython, plain text otherwise."""
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        get_ipython = None
    if get_ipython is not None and get_ipython() is not None:
        display({"text/html": verdict._repr_html_(), "text/plain": verdict.text}, raw=True)
    else:
        print(verdict.text)


@cache
def _truth(truth_of: Callable[[], Any], variant: int | None) -> Any:
    """The truth, computed once per process and variant: every later check compares with the same value."""
    return truth_of()


_GIVE_A_NUMBER = "give a number, written without quotes (3, not \"3\")."


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _agrees(same: Callable[[Any, Any], bool] | None, answer: Any, truth: Any) -> bool:
    try:
        return bool(same(answer, truth) if same is not None else type(answer) is not bool and answer == truth)
    except Exception:  # an answer of some other kind is simply not the answer
        return False


def _short(answer: Any) -> str:
    text = repr(answer)
    return text if len(text) <= 40 else text[:37] + "..."
