"""`Record`: the base of the view records Python reads (dataclasses, read by attribute), which the
notebook sends to its page as plain JSON (`to_json()`), the shape its JavaScript draws."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

# Each record class's field names, in order, read from dataclasses.fields the first time one of its
# records is turned into JSON (a page's export turns hundreds of thousands of records into JSON).
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}
# Values `_plain` passes as they are without looking inside them.
_LEAVES = frozenset({int, float, str, bool, type(None), tuple})


class Record:
    """A view record: a dataclass Python reads by attribute, sent to the page as `to_json()`: a dict
    of its fields, in order, with the records inside it (alone, in a list or as a dict's values)
    turned into dicts too; other values are passed as they are (lists of plain values are not copied)."""

    __slots__ = ()

    def to_json(self) -> dict[str, Any]:
        names = _FIELD_NAMES.get(type(self))
        if names is None:
            names = _FIELD_NAMES[type(self)] = tuple(f.name for f in fields(self))
        return {name: _plain(getattr(self, name)) for name in names}


def _plain(value: Any) -> Any:
    kind = type(value)
    if kind in _LEAVES:
        return value
    if isinstance(value, Record):
        return value.to_json()
    if isinstance(value, list) and value and isinstance(value[0], Record):
        return [item.to_json() for item in value]
    if isinstance(value, dict) and value and isinstance(next(iter(value.values())), Record):
        return {key: item.to_json() for key, item in value.items()}
    return value
