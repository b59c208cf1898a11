"""Hostile trace files: each is refused by `blockviz replay` in one line naming the line, exit 2, no
traceback, in bounded time and memory (a subprocess under an address-space limit and a timeout),
never by allocating what the file claims. A UTF-8 byte order mark and CRLF line ends are accepted.
The limits are blockviz/model/trace.py's and blockviz/model/trace_check.py's (docs/traces.md)."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from blockviz.model import trace as tr
from blockviz.model.trace import TraceError, read_trace, resolve_trace_path, shipped_traces
from blockviz.model.trace_check import MAX_SEQS_PER_REQUEST
from serve_fixtures import REPO, blockviz_env

MEMORY_LIMIT = 1536 << 20  # address space for the replay process: far below what the claims would need
TIME_LIMIT_S = 120  # a limit for a slow shared machine, not a measurement
HEADER = {"format": "blockviz-trace", "version": 1, "model": "tiny-shakespeare", "block_size": 4,
          "num_gpu_blocks": 8, "num_cpu_blocks": 4}


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _request(seq_no: int = 0, request_id: str = "0", seq_ids=(0,), token_ids=(1, 2), **fields) -> dict:
    return {"type": "request_added", "seq_no": seq_no, "request_id": request_id, "seq_ids": list(seq_ids),
            "prompt": "hi", "prompt_token_ids": list(token_ids), "prompt_tokens_text": ["t"] * len(token_ids),
            "n": 1, "max_tokens": 4, **fields}


def _allocated(seq_no: int, block: int = 0, seq_ids=(0,), token_ids=(1, 2)) -> dict:
    return {"type": "block_allocated", "seq_no": seq_no, "device": "gpu", "block": block, "seq_ids": list(seq_ids),
            "logical_index": 0, "ref_count": len(seq_ids), "block_hash": None, "token_ids": list(token_ids)}


def _write(path: Path, header: dict | str, *events: dict | str) -> Path:
    with open(path, "w", encoding="utf-8") as out:
        for item in (header, *events):
            out.write((item if isinstance(item, str) else json.dumps(item, separators=(",", ":"))) + "\n")
    return path


def _refused(path: Path, *expected: str) -> str:
    """`blockviz replay PATH` under the memory limit: exit 2 and one line holding each `expected`."""
    result = subprocess.run([sys.executable, "-m", "blockviz", "replay", str(path)], capture_output=True,
                            text=True, timeout=TIME_LIMIT_S, stdin=subprocess.DEVNULL, cwd=REPO,
                            env=blockviz_env(), preexec_fn=_limit_memory)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(lines) == 1 and "Traceback" not in result.stderr and result.stdout == "", result.stderr[-2000:]
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def test_a_header_claiming_a_billion_blocks_is_refused_without_allocating(tmp_path):
    header = {**HEADER, "num_gpu_blocks": 10**9, "description": "x" * 16_000}  # a 16 KB header
    message = _refused(_write(tmp_path / "claim.jsonl", header, _request()), "line 1", "1000000000 GPU")
    assert "more than a trace of this size may declare" in message


@pytest.mark.parametrize("claim", [10**6, 10**7])
def test_a_million_blocks_need_a_file_of_that_size(tmp_path, claim):
    _refused(_write(tmp_path / "claim.jsonl", {**HEADER, "num_cpu_blocks": claim}), "line 1", f"{claim} CPU")


def test_pools_larger_than_the_headers_own_memory_are_refused(tmp_path):
    header = {**HEADER, "num_gpu_blocks": 100_000, "block_bytes": 32768, "total_bytes": 256 << 20}
    _refused(_write(tmp_path / "budget.jsonl", header), "line 1", "do not fit in the 268435456 bytes")


def test_a_huge_block_size_is_refused(tmp_path):
    _refused(_write(tmp_path / "block.jsonl", {**HEADER, "block_size": 10**9}), "line 1", "block size 1000000000")


@pytest.mark.parametrize("depth", [20, 100_000])
def test_deep_nesting_is_refused_on_an_event_line(tmp_path, depth):
    nested = "[" * depth + "]" * depth
    line = json.dumps(_request(), separators=(",", ":")).replace('"seq_ids":[0]', f'"seq_ids":{nested}')
    assert nested in line
    _refused(_write(tmp_path / "deep.jsonl", HEADER, line), "line 2", f"nest more than {tr.MAX_NESTING} deep")


@pytest.mark.parametrize("depth", [20, 100_000])
def test_deep_nesting_is_refused_in_the_header(tmp_path, depth):
    header = json.dumps(HEADER)[:-1] + ',"prompts":' + "[" * depth + "]" * depth + "}"
    _refused(_write(tmp_path / "deep.jsonl", header), "line 1", f"nest more than {tr.MAX_NESTING} deep")


def test_a_line_of_five_million_sequence_ids_is_refused_by_the_line_limit(tmp_path):
    line = json.dumps(_request(seq_ids=range(5_000_000)), separators=(",", ":"))
    assert len(line) > tr.MAX_LINE_BYTES
    _refused(_write(tmp_path / "ids.jsonl", HEADER, line), "line 2", "longer than 4 MiB")


def test_a_header_line_without_an_end_is_refused_by_the_line_limit(tmp_path):
    path = tmp_path / "endless.jsonl"
    path.write_text(json.dumps(HEADER)[:-1] + ',"description":"' + "x" * (tr.MAX_LINE_BYTES + 10))
    _refused(path, "line 1", "longer than 4 MiB")


def test_a_line_within_the_limit_still_cannot_add_a_million_sequences(tmp_path):
    line = json.dumps(_request(seq_ids=range(400_000)), separators=(",", ":"))
    assert len(line) < tr.MAX_LINE_BYTES
    _refused(_write(tmp_path / "ids.jsonl", HEADER, line), "line 2", f"(1..{MAX_SEQS_PER_REQUEST})")


@pytest.mark.parametrize(("token_id", "header", "expected"), [
    (2**70, HEADER, "token id 1180591620717411303424 is outside 0..2147483647"),
    (-1, HEADER, "token id -1 is outside"),
    (320, {**HEADER, "vocab_size": 320}, "token id 320 is outside 0..319 (the vocabulary)"),
], ids=["2**70", "negative", "past the vocab"])
def test_token_ids_out_of_range_are_refused(tmp_path, token_id, header, expected):
    _refused(_write(tmp_path / "token.jsonl", header, _request(token_ids=(5, token_id))), "line 2", expected)


def test_a_token_id_inside_the_vocab_is_accepted(tmp_path):
    path = _write(tmp_path / "token.jsonl", {**HEADER, "vocab_size": 320}, _request(token_ids=(0, 319)))
    assert read_trace(path).events[0].prompt_token_ids == (0, 319)


@pytest.mark.parametrize(("field", "value"), [("seq_no", 2**64), ("block_hash", 2**64), ("ref_count", 2**63)])
def test_ids_and_hashes_past_64_bits_are_refused(tmp_path, field, value):
    events = [_request(), {**_allocated(1), field: value}]
    _refused(_write(tmp_path / "ids.jsonl", HEADER, *events), "line 3", str(value))


def test_a_block_allocated_before_its_request_was_added_is_refused(tmp_path):
    path = _write(tmp_path / "early.jsonl", HEADER, _allocated(0), {**_request(), "seq_no": 1})
    _refused(path, "line 2", "seq 0 was never added")


def test_forks_cannot_copy_a_long_prompt_past_the_files_size(tmp_path):
    """A 3 MB prompt forked again and again would copy it into every child: refused at a fork line."""
    header = {**HEADER, "block_size": 4096, "num_gpu_blocks": 4}
    prompt = [7] * 500_000
    events = [_request(token_ids=prompt), _allocated(1, token_ids=(7,) * 4096)]
    forks = [{"type": "fork", "seq_no": 2 + i, "parent_seq_id": 0, "child_seq_id": 1 + i, "device": "gpu",
              "blocks": [0]} for i in range(2_000)]
    message = _refused(_write(tmp_path / "forks.jsonl", header, *events, *forks), "forking seq 0")
    assert "more than a trace of this size may hold" in message


def test_a_utf8_byte_order_mark_and_crlf_line_ends_are_accepted(tmp_path):
    text = resolve_trace_path("fork-cow").read_bytes()
    path = tmp_path / "bom.jsonl"
    path.write_bytes(tr.BOM + text.replace(b"\n", b"\r\n"))
    assert len(read_trace(path).events) == len(read_trace(resolve_trace_path("fork-cow")).events)


@pytest.mark.parametrize("name", shipped_traces())
def test_shipped_traces_load_under_the_limits(name):
    trace = read_trace(resolve_trace_path(name))
    assert trace.events and trace.num_gpu_blocks + trace.num_cpu_blocks <= tr.MIN_POOL_BLOCKS


def test_the_pool_allowance_grows_with_the_file(tmp_path):
    """A header may declare more than MIN_POOL_BLOCKS when the file is large enough to fill them."""
    blocks = tr.MIN_POOL_BLOCKS + 1000
    path = _write(tmp_path / "big.jsonl", {**HEADER, "num_gpu_blocks": blocks},
                  *[" " * 1000] * (blocks * tr.FILE_BYTES_PER_BLOCK // 1000))  # blank lines, a long file
    assert read_trace(path).num_gpu_blocks == blocks
    small = _write(tmp_path / "small.jsonl", {**HEADER, "num_gpu_blocks": blocks})
    with pytest.raises(TraceError, match="more than a trace of this size may declare"):
        read_trace(small)
