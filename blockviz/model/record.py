"""`Record`: the base of the view records Python reads (dataclasses, read by attribute), which the
notebook sends to its page as plain JSON (`to_json()`), the shape its JavaScript draws."""

from __future__ import annotations

from dataclasses import fields
from typing import Any


class Record:
    """A view record: a dataclass Python reads by attribute, sent to the page as `to_json()`: a dict
    of its fields, in order, with the records inside it (alone, in a list or as a dict's values)
    turned into dicts too; other values are passed as they are (lists of plain values are not copied)."""

    __slots__ = ()

    def to_json(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}


def _plain(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_json()
    if isinstance(value, list) and value and isinstance(value[0], Record):
        return [item.to_json() for item in value]
    if isinstance(value, dict) and value and isinstance(next(iter(value.values())), Record):
        return {key: item.to_json() for key, item in value.items()}
    return value
