"""Text from data made safe to draw: no control character from a trace, a KV event, a model's
config or tokenizer, or a prompt reaches a terminal, a browser terminal, a page or an SVG.

A string from outside (a shared trace file, a publisher on the network, a tokenizer's pieces)
could carry `ESC[2J` (clear the screen), an OSC sequence (`ESC]0;...BEL` retitles the terminal,
`ESC]8;;url` makes a hyperlink), `\\r` or backspace (write over what is drawn), a bell, or their
8-bit C1 forms (U+009B is CSI). Each of these is written visibly instead, as Python's repr writes
it: `\\x1b`, `\\x07`, `\\r`, `\\x9b`; Unicode's bidirectional overrides and line separators too
(`\\u202e`, `\\u2028`), which reorder or break a line as drawn. An escape sequence is harmless
once its ESC is written out: the rest of it is plain text.

The boundary: data is made safe where it enters blockviz, once, so every view reads safe strings.
  - a trace's header and events, as they are read (blockviz/model/trace.py `read_trace`);
  - a live engine's header and events, as the session takes them (prompts typed, tokenizer pieces;
    blockviz/session/engine_session.py);
  - a KV event from a publisher, as it is decoded (blockviz/kvevents/protocol.py `decode_event`);
  - every one-line error (blockviz/session/spec.py `one_line`, the CLI's error line).
The front ends keep a last guard where they draw text of their own: token pieces (palette's
`show_token`) and the TUI's notifications.

Three kinds of field:
  - one-line fields (ids, names, kinds, a finish's detail, a model's name): every control
    character escaped, `\\n` and `\\t` too (`safe_line`);
  - text a view lays out on several lines (a prompt, a scenario's description): `\\n` and `\\t`
    kept (`safe_text`);
  - token pieces (a prompt's, a sampled token's): `\\n`, `\\t` and `\\r` kept, which `show_token`
    draws as '⏎', '⇥' and '␍' (`safe_token`).
"""

from __future__ import annotations

import functools
import re
import typing
from typing import Any

import msgspec

# DEL, C1 controls, line and paragraph separators, bidirectional embeddings, overrides and
# isolates (U+202A-U+202E, U+2066-U+2069); then C0 controls, less what a kind of field keeps
_OTHERS = "\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_UNSAFE_LINE = re.compile(f"[\x00-\x1f{_OTHERS}]")
_UNSAFE_TEXT = re.compile(f"[\x00-\x08\x0b-\x1f{_OTHERS}]")  # keeps \t, \n
_UNSAFE_TOKEN = re.compile(f"[\x00-\x08\x0b\x0c\x0e-\x1f{_OTHERS}]")  # keeps \t, \n, \r
_SHORT = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _escape(ch: str) -> str:
    if ch in _SHORT:
        return _SHORT[ch]
    return f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}"


def _table(unsafe: re.Pattern[str]) -> dict[int, str]:
    """str.translate's table for the characters `unsafe` matches: each to its visible escape (a
    translation runs in C, so a string of millions of control characters costs little)."""
    return {code: _escape(chr(code)) for code in range(0x2070) if unsafe.match(chr(code))}


_LINE_TABLE, _TEXT_TABLE, _TOKEN_TABLE = map(_table, (_UNSAFE_LINE, _UNSAFE_TEXT, _UNSAFE_TOKEN))


def safe_line(text: str) -> str:
    """`text` for one line: every control character written visibly (`\\x1b`, `\\n`, `\\u202e`)."""
    return text.translate(_LINE_TABLE) if _UNSAFE_LINE.search(text) else text


def safe_text(text: str) -> str:
    """`text` a view lays out on lines: as safe_line, keeping newlines and tabs."""
    return text.translate(_TEXT_TABLE) if _UNSAFE_TEXT.search(text) else text


def safe_token(text: str) -> str:
    """A token's piece: as safe_line, keeping the newline, tab and carriage return that
    palette.show_token draws as '⏎', '⇥' and '␍'."""
    return text.translate(_TOKEN_TABLE) if _UNSAFE_TOKEN.search(text) else text


def _safe_value(value: Any, safe: typing.Callable[[str], str]) -> Any:
    """`value` with every string inside it (in lists, tuples and dicts, keys too) made safe; the
    same object when nothing in it changed."""
    if isinstance(value, str):
        return safe(value)
    if isinstance(value, (list, tuple)):
        items = [_safe_value(item, safe) for item in value]
        if all(new is old for new, old in zip(items, value)):
            return value
        return type(value)(items)
    if isinstance(value, dict):
        items = {safe_line(key) if isinstance(key, str) else key: _safe_value(item, safe)
                 for key, item in value.items()}
        if all(key in value and items[key] is value[key] for key in items):
            return value
        return items
    return value


def _holds_text(annotation: Any) -> bool:
    """Whether a field of this type can hold a string (str, str | None, tuple[str, ...], Any)."""
    if annotation is str or annotation is Any:
        return True
    return any(_holds_text(arg) for arg in typing.get_args(annotation) if arg is not Ellipsis)


# Fields laid out over lines (safe_text) and token pieces (safe_token), by name; the rest are one line.
TEXT_FIELDS = frozenset({"prompt", "description"})
TOKEN_FIELDS = frozenset({"text", "prompt_tokens_text"})


def _safe_for(name: str) -> typing.Callable[[str], str]:
    if name in TOKEN_FIELDS:
        return safe_token
    return safe_text if name in TEXT_FIELDS else safe_line


@functools.lru_cache(maxsize=None)
def _text_fields(cls: type) -> tuple[tuple[str, typing.Callable[[str], str]], ...]:
    """The fields of a msgspec Struct class that can hold a string, each with its safe function."""
    return tuple((field.name, _safe_for(field.name)) for field in msgspec.structs.fields(cls)
                 if _holds_text(field.type))


StructT = typing.TypeVar("StructT", bound=msgspec.Struct)


def safe_struct(record: StructT) -> StructT:
    """An event (engine/events.py's, or a KV event of blockviz/kvevents/protocol.py) with every
    string field made safe; the same object when none needed it."""
    changes = {}
    for name, safe in _text_fields(type(record)):
        value = getattr(record, name)
        if value is not None:
            new = _safe_value(value, safe)
            if new is not value:
                changes[name] = new
    return msgspec.structs.replace(record, **changes) if changes else record


def safe_header(header: dict[str, Any]) -> dict[str, Any]:
    """A trace header (or a live run's) with every string in it made safe: the prompts (in
    `prompts`, `arrivals`, `later_prompts`) and the description keep their lines."""
    return {safe_line(key): _safe_value(value, safe_text if key in HEADER_TEXT_FIELDS else safe_line)
            for key, value in header.items()}


HEADER_TEXT_FIELDS = frozenset({"prompts", "arrivals", "later_prompts", "description"})
