"""Lesson 08 (lessons/08_why_paging.ipynb): the share of a reservation that holds no token."""

from __future__ import annotations

from blockviz.lessons.checks import Slip, close_to, exercise


@exercise("08", "my_fraction", "what share of the slots reserved holds no token?",
          slips=[Slip(0.25, "that is the share used: 64 of 256 slots hold a token."),
                 Slip(192, "the question asks for a fraction of the slots reserved, between 0 and 1, not a count of slots.")],
          praise="paging would hold exactly 16 blocks of 4 for it: nothing wasted.", same=close_to)
def check_fraction():
    """A reservation of 256 slots for a request that ends at 64 tokens."""
    reserved, used = 256, 64
    return (reserved - used) / reserved
