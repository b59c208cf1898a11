"""`Record`: the base of the view records Python reads (dataclasses, read by attribute), which the
notebook sends to its page as plain JSON (`to_json()`), the shape its JavaScript draws."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any


class Record:
    """A view record: a dataclass Python reads by attribute, sent to the page as `to_json()`
    (dataclasses.asdict: nested records become dicts, lists stay lists)."""

    __slots__ = ()

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
