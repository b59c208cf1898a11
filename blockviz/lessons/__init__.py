"""The lessons' exercises (lessons/*.ipynb): one module per lesson, each exercise a check that
computes its own truth, so a stored notebook can hold blank answers and run as is.

    from blockviz.lessons import lesson02 as lesson
    my_blocks = ...                 # the student's answer
    lesson.check_blocks(my_blocks)  # a verdict box: not answered yet, correct, or a hint

The answer key lives apart, in blockviz/lessons/key.py (`python3 -m blockviz.lessons.key`).
"""

from blockviz.lessons.checks import EXERCISES, Exercise, Slip, Verdict, exercise

__all__ = ["EXERCISES", "Exercise", "Slip", "Verdict", "exercise", "load_all"]

LESSONS = ("01", "02", "03", "04", "05", "06", "07", "08", "09", "10", "11", "12", "13")


def load_all() -> dict[str, Exercise]:
    """Import every lesson module, so EXERCISES holds every exercise."""
    import importlib

    for number in LESSONS:
        importlib.import_module(f"blockviz.lessons.lesson{number}")
    return EXERCISES
