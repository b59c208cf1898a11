"""A trace that parses but does not make sense is refused at load, naming the line: every shipped
trace mutated (a line dropped, repeated, moved, retyped; with the event numbers mended too, so the
state checks alone must catch it) is rejected, and `blockviz replay` says so in one line, exit 2."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from blockviz.cli import main
from blockviz.model.trace import TraceError, read_trace, resolve_trace_path, shipped_traces

SAMPLES = 6  # mutated lines per trace and mutation


def _lines(name: str) -> list[str]:
    return resolve_trace_path(name).read_text().splitlines()


def _renumber(lines: list[str]) -> list[str]:
    out = [lines[0]]
    for number, line in enumerate(lines[1:]):
        data = json.loads(line)
        data["seq_no"] = number
        out.append(json.dumps(data))
    return out


def _write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "mutated.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _rejected(tmp_path: Path, lines: list[str], line_number: int | None = None) -> str:
    path = _write(tmp_path, lines)
    with pytest.raises(TraceError) as info:
        read_trace(path)
    message = str(info.value)
    assert "\n" not in message and "is corrupted" in message
    if line_number is not None:
        assert f"line {line_number} " in message
    return message


def _picks(lines: list[str], seed: int, kinds: set[str] | None = None) -> list[int]:
    """Indexes of event lines (never the header, never the last line) of the given kinds."""
    candidates = [i for i, line in enumerate(lines[:-1]) if i > 0
                  and (kinds is None or json.loads(line)["type"] in kinds)]
    return random.Random(seed).sample(candidates, min(SAMPLES, len(candidates)))


@pytest.mark.parametrize("name", shipped_traces())
def test_shipped_traces_pass_the_checks(name):
    trace = read_trace(resolve_trace_path(name))
    assert len(trace.events) == len(_lines(name)) - 1


@pytest.mark.parametrize("name", shipped_traces())
def test_a_dropped_repeated_or_moved_line_is_rejected_at_that_line(tmp_path, name):
    lines = _lines(name)
    for i in _picks(lines, 1):
        _rejected(tmp_path, lines[:i] + lines[i + 1:], i + 1)  # dropped: the next line is out of sequence
        _rejected(tmp_path, lines[:i + 1] + lines[i:], i + 2)  # repeated
        _rejected(tmp_path, lines[:i] + [lines[i + 1], lines[i]] + lines[i + 2:], i + 1)  # moved


@pytest.mark.parametrize("name", shipped_traces())
def test_a_retyped_field_is_rejected(tmp_path, name):
    lines = _lines(name)
    for i in _picks(lines, 2):
        data = json.loads(lines[i])
        field = next(k for k in data if k not in ("type", "seq_no"))
        value = data[field]
        data[field] = "x" if not isinstance(value, str) else 5
        message = _rejected(tmp_path, lines[:i] + [json.dumps(data)] + lines[i + 1:], i + 1)
        assert field in message


@pytest.mark.parametrize("name", shipped_traces())
def test_block_events_out_of_place_are_rejected_even_with_consecutive_numbers(tmp_path, name):
    lines = _lines(name)
    kinds = {"block_allocated", "block_freed", "slot_appended", "copy_on_write", "prefix_cache_hit",
             "swap_out", "swap_in", "fork", "block_evicted", "sequence_freed"}
    picked = _picks(lines, 3, kinds)
    assert picked
    for i in picked:
        dropped = _renumber(lines[:i] + lines[i + 1:])
        _rejected(tmp_path, dropped)
        repeated = _renumber(lines[:i + 1] + lines[i:])
        _rejected(tmp_path, repeated)


def _first(lines: list[str], kind: str) -> int:
    return next(i for i, line in enumerate(lines) if i and json.loads(line)["type"] == kind)


def _edit(lines: list[str], i: int, **fields) -> list[str]:
    data = json.loads(lines[i])
    data.update(fields)
    return lines[:i] + [json.dumps(data)] + lines[i + 1:]


@pytest.mark.parametrize(("case", "expected"), [
    ("seq_ids: 5", "seq_ids"),
    ("offset: 99", "offset 99"),
    ("a logical-index gap", "logical index"),
    ("a negative ref count", "ref count -1"),
    ("a free moved before its allocate", "does not hold"),
    ("a double free", "does not hold"),
    ("an eviction of a block in use", "eviction"),
])
def test_the_cases_from_the_issue_each_name_what_is_wrong(tmp_path, capsys, case, expected):
    lines = _lines("fork-cow")
    alloc = _first(lines, "block_allocated")
    slot = _first(lines, "slot_appended")
    freed = _first(lines, "block_freed")
    if case == "seq_ids: 5":
        mutated = _edit(lines, alloc, seq_ids=5)
    elif case == "offset: 99":
        mutated = _edit(lines, slot, offset=99)
    elif case == "a logical-index gap":
        mutated = _edit(lines, alloc, logical_index=json.loads(lines[alloc])["logical_index"] + 1)
    elif case == "a negative ref count":
        mutated = _edit(lines, freed, ref_count=-1)
    elif case == "a free moved before its allocate":
        data = json.loads(lines[freed])
        first_alloc = next(i for i, line in enumerate(lines) if i and json.loads(line)["type"] == "block_allocated"
                           and json.loads(line)["block"] == data["block"])
        mutated = _renumber(lines[:first_alloc] + [lines[freed]] + lines[first_alloc:freed] + lines[freed + 1:])
    elif case == "a double free":
        mutated = _renumber(lines[:freed + 1] + lines[freed:])
    else:
        data = json.loads(lines[alloc])
        mutated = _renumber(lines[:alloc + 1] + [json.dumps(
            {"type": "block_evicted", "seq_no": 0, "device": data["device"], "block": data["block"], "block_hash": 1})]
            + lines[alloc + 1:])
    message = _rejected(tmp_path, mutated)
    assert expected in message, message
    assert main(["replay", str(tmp_path / "mutated.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "is corrupted" in err
