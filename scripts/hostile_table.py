"""Every probe input of issue 50 (items 1-8 and the trace checker's list) through the CLI, as a
table: the input, the command, its exit code, the first line of its stderr, and whether a Python
traceback or a raw ESC character reached the output.

    python scripts/hostile_table.py              # every case (each a `python -m blockviz` process)
    python scripts/hostile_table.py --only config --markdown

The inputs are built in a temporary folder from the shipped traces and tiny-hybrid's checkpoint
(no download). A case that needs what is not installed (vLLM for `--kv-manager vllm`) says so in
its row. The inputs that reach blockviz through no CLI command (a publisher's frames for `attach`,
a paste into `serve`'s browser terminal, the answer key's files) are listed at the end with the
tests that feed them. Exit code 1 when a row shows a traceback or a raw ESC.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from engine.designs import V0, V1, VLLM  # noqa: E402  (the checkout's, not an installed copy)

ESC = "\x1b"
HOSTILE_PROMPT = "\x1b[2J\x1b[H INJECTED \x1b]0;title\x07\r\x08\x9b2J ROMEO:"
TIMEOUT_S = 600  # a limit for a slow shared machine, not a measurement
NOT_CLI = (
    ("item 1: control characters in a publisher's KV events (attach)", "tests/test_control_characters.py"),
    ("item 1: control characters through serve's websocket", "tests/test_control_characters.py, tests/test_serve_safety.py"),
    ("item 7 (attach): 300 frames of 1,000,000 token ids; a 4 MB medium per frame",
     "tests/test_kv_hostile.py::test_a_block_of_a_million_token_ids_per_frame_keeps_its_first_ones_and_counts_the_rest, "
     "::test_a_4mb_medium_per_frame_is_kept_cut_and_counted"),
    ("checker list: a 16,000-character paste into serve", "tests/test_serve_hostile.py"),
    ("checker list: the answer key's file mode and error naming the file", "tests/test_hostile_inputs.py"),
)


@dataclass
class Case:
    """One probe input: what it is, the blockviz arguments (built in `folder`), and how it runs."""

    group: str
    name: str
    argv: Callable[[Path], list[str]]
    needs_vllm: bool = False
    memory_limit: int | None = None  # RLIMIT_AS for the process, bytes
    sigterm_when: str | None = None  # SIGTERM once a file matching this glob appears in the folder
    results: dict = field(default_factory=dict)


# ------------------------------------------------------------------ inputs


def _lines(name: str) -> list[str]:
    from blockviz.model.trace import resolve_trace_path

    return resolve_trace_path(name).read_text(encoding="utf-8").splitlines()


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _first(lines: list[str], kind: str) -> int:
    return next(i for i, line in enumerate(lines) if i and json.loads(line)["type"] == kind)


def _edited(folder: Path, source: str, kind: str, **fields) -> Path:
    """Shipped trace `source` with its first `kind` event's fields replaced."""
    lines = _lines(source)
    index = _first(lines, kind)
    event = json.loads(lines[index])
    event.update(fields)
    lines[index] = json.dumps(event)
    return _write(folder / f"{source}-{kind}.jsonl", lines)


def _header(folder: Path, source: str, name: str, change: Callable[[dict], None]) -> Path:
    lines = _lines(source)
    header = json.loads(lines[0])
    change(header)
    return _write(folder / f"{name}.jsonl", [json.dumps(header), *lines[1:]])


def _moved_offload(folder: Path, source: str, kind: str) -> Path:
    """An offload event of the cpu-tier trace moved into `source` (renumbered)."""
    tier = _lines("cpu-tier")
    offload = json.loads(tier[_first(tier, kind)])
    lines = _lines(source)
    events = [json.loads(line) for line in lines[1:]]
    events.insert(1, offload)
    for number, event in enumerate(events):
        event["seq_no"] = number
    return _write(folder / f"{source}-{kind}-moved.jsonl", [lines[0], *map(json.dumps, events)])


def _control_trace(folder: Path) -> Path:
    """The v1 story with the probe's strings in the header's model and a finish's detail."""
    hostile = "\x1b[2J\x1b[H INJECTED \x1b]0;title\x07 \x1b]8;;http://x\x1b\\link\r\x08\x07\x9b2J"
    lines = _lines("v1-story")
    header = json.loads(lines[0])
    header["model"] = hostile
    lines[0] = json.dumps(header)
    index = _first(lines, "sequence_finished")
    event = json.loads(lines[index])
    event["detail"] = hostile
    lines[index] = json.dumps(event)
    return _write(folder / "control.jsonl", lines)


def _checkpoint(folder: Path, name: str, text: str | None = None, **changes) -> Path:
    """tiny-hybrid's checkpoint with its config.json changed (or replaced by `text`)."""
    from blockviz.session.tiny_hybrid import tiny_hybrid_checkpoint

    path = folder / name
    if not path.exists():
        shutil.copytree(tiny_hybrid_checkpoint(), path)
    config_path = path / "config.json"
    if text is None:
        config = json.loads(config_path.read_text())
        config.update(changes)
        text = json.dumps(config)
    config_path.write_text(text)
    if text == "":
        config_path.chmod(0)  # unreadable (root reads it anyway: then it is empty)
    return path


def _export(path: Path, folder: Path) -> list[str]:
    return ["export", str(path), "--out", str(folder / f"{path.stem}.svg"), "--force"]


def _generate(*options: str) -> list[str]:
    return ["generate", *options, "--prompt", "ROMEO:", "--max-tokens", "2"]


def _config_case(name: str, text: str | None = None, **changes) -> Case:
    return Case("item 3: config.json", name, lambda f: _generate(
        "--model", str(_checkpoint(f, "model-" + name.replace(" ", "_")[:40], text, **changes)), "--kv-manager", "v1"))


def _checker_case(name: str, make: Callable[[Path], Path]) -> Case:
    return Case("checker list", name, lambda f: _export(make(f), f))


def cases() -> list[Case]:
    deep = "[" * 5000 + "]" * 5000
    layer_types = ["sliding_attention", "full_attention"] * 4
    return [
        # item 1: control characters from a trace (the TUI's screen is checked in the tests)
        Case("item 1: control characters", "header model and finish detail: ESC[2J, OSC, CR, BS, BEL, C1",
             lambda f: _export(_control_trace(f), f)),
        Case("item 1: control characters", "a prompt carrying ESC[2J, OSC, BEL (generate)",
             lambda f: ["generate", "--prompt", HOSTILE_PROMPT, "--max-tokens", "2"]),
        Case("item 1: control characters", "the same prompt twice (explain)",
             lambda f: ["explain", "--prompt", HOSTILE_PROMPT, "--prompt", HOSTILE_PROMPT, "--max-tokens", "2"]),
        # item 2: the vLLM adapter's double free
        Case("item 2: record loads", "tiny-hybrid, vllm, block 4, 33 blocks, budget 16, 4 requests, 120 tokens",
             lambda f: ["record", "--out", str(f / "n1.jsonl"), "--force", "--model", "tiny-hybrid",
                        "--kv-manager", "vllm", "--block-size", "4", "--num-gpu-blocks", "33",
                        "--vllm-option", "max_num_batched_tokens=16", "--max-tokens", "120",
                        *[arg for p in ("ROMEO: But soft", "JULIET: O Romeo", "ROMEO: It is", "NURSE: Madam")
                          for arg in ("--prompt", p)]], needs_vllm=True),
        # item 3: pools past memory
        Case("item 3: pool sizes", "--kv-offloading-size 8 under a 4 GiB address-space limit",
             lambda f: _generate("--kv-manager", "vllm", "--kv-offloading-size", "8"), needs_vllm=True,
             memory_limit=4 << 30),
        Case("item 3: pool sizes", "--kv-offloading-size 1e12",
             lambda f: _generate("--kv-manager", "vllm", "--kv-offloading-size", "1e12"), needs_vllm=True),
        *[Case("item 3: pool sizes", f"--num-gpu-blocks 1000000000, {design.name}",
               lambda f, design=design: _generate("--kv-manager", design.name, "--num-gpu-blocks", "1000000000"),
               needs_vllm=design is VLLM) for design in (V0, V1, VLLM)],
        Case("item 3: pool sizes", "record --num-gpu-blocks 1000000000",
             lambda f: ["record", "--out", str(f / "big.jsonl"), "--force", "--num-gpu-blocks", "1000000000",
                        "--prompt", "ROMEO:", "--max-tokens", "2"]),
        Case("item 3: pool sizes", "--num-cpu-blocks 1000000000000 (swap pool)",
             lambda f: _generate("--num-gpu-blocks", "8", "--num-cpu-blocks", "1000000000000")),
        # item 3: --vllm-option
        Case("item 3: --vllm-option", "max_num_batched_tokens=16 alone (runs)",
             lambda f: _generate("--kv-manager", "vllm", "--vllm-option", "max_num_batched_tokens=16"), needs_vllm=True),
        Case("item 3: --vllm-option", "max_num_seqs=64 with max_num_batched_tokens=16",
             lambda f: _generate("--kv-manager", "vllm", "--vllm-option", "max_num_seqs=64",
                                 "--vllm-option", "max_num_batched_tokens=16"), needs_vllm=True),
        Case("item 3: --vllm-option", "enable_chunked_prefill=false with max_num_batched_tokens=16",
             lambda f: _generate("--kv-manager", "vllm", "--vllm-option", "enable_chunked_prefill=false",
                                 "--vllm-option", "max_num_batched_tokens=16"), needs_vllm=True),
        Case("item 3: --vllm-option", "a value nested 5,000 deep",
             lambda f: _generate("--kv-manager", "vllm", "--vllm-option", "watermark=" + deep)),
        Case("item 3: --vllm-option", "a 100 KB key",
             lambda f: _generate("--kv-manager", "vllm", "--vllm-option", "k" * 100_000 + "=1"), needs_vllm=True),
        Case("item 3: --vllm-option", "a 100 KB value",
             lambda f: _generate("--kv-manager", "vllm", "--vllm-option", "policy=" + "x" * 100_000)),
        # item 3: config.json
        _config_case('num_hidden_layers "4"', num_hidden_layers="4"),
        _config_case("num_hidden_layers 2.0", num_hidden_layers=2.0),
        _config_case("num_hidden_layers null", num_hidden_layers=None),
        _config_case('max_position_embeddings "256"', max_position_embeddings="256"),
        _config_case('use_sliding_window "yes"', use_sliding_window="yes"),
        _config_case("num_attention_heads 0", num_attention_heads=0),
        _config_case("num_key_value_heads 0", num_key_value_heads=0),
        _config_case("head_dim -16", head_dim=-16),
        _config_case("num_hidden_layers 10^9", num_hidden_layers=10**9),
        _config_case("a config nested 100,000 deep", "[" * 100_000 + "]" * 100_000),
        _config_case("a config that is a JSON list", "[1, 2]"),
        _config_case("a config that is not JSON", "not json"),
        _config_case("an unreadable config", ""),
        _config_case("8 layers named, the weights hold 4", num_hidden_layers=8, layer_types=layer_types),
        # item 6: KV-cache groups a header declares
        Case("item 6: groups declared", "84,001 groups (a 4 MB header)", lambda f: _export(_header(
            f, "hybrid", "groups-84001", lambda h: h["kv_cache_groups"].extend(
                [{"kind": "full_attention", "layer_names": []}] * 83_999)), f)),
        Case("item 6: groups declared", "64 groups declared, 2 used (export)", lambda f: _export(_header(
            f, "hybrid", "groups-64", lambda h: h["kv_cache_groups"].extend(
                [{"kind": "full_attention", "layer_names": []}] * 62)), f)),
        # item 8: record stopped
        Case("item 8: record stopped", "SIGTERM while recording",
             lambda f: ["record", "--out", str(f / "stopped.jsonl"), "--force", "--max-tokens", "400",
                        "--prompt", "ROMEO:"], sigterm_when=".stopped.jsonl*"),
        # the checker's list
        _checker_case("blocks_skipped listing a block twice", lambda f: _doubled_skip(f)),
        _checker_case("offload_load num_tokens 2^62", lambda f: _edited(f, "cpu-tier", "offload_load", num_tokens=1 << 62)),
        _checker_case("offload_load num_tokens 0", lambda f: _edited(f, "cpu-tier", "offload_load", num_tokens=0)),
        _checker_case("offload_load request_id not the sequence's",
                      lambda f: _edited(f, "cpu-tier", "offload_load", request_id="someone-else")),
        _checker_case('offload_store medium "DISK"', lambda f: _edited(f, "cpu-tier", "offload_store", medium="DISK")),
        _checker_case("offload_store medium of 1 MB",
                      lambda f: _edited(f, "cpu-tier", "offload_store", medium="x" * 1_000_000)),
        _checker_case("offload_store in a v0 trace", lambda f: _moved_offload(f, "prefix-hit", "offload_store")),
        _checker_case("offload_load in a v1 trace", lambda f: _moved_offload(f, "v1-story", "offload_load")),
        _checker_case("a header window wider than the events let go", lambda f: _header(
            f, "hybrid", "window", lambda h: h["kv_cache_groups"][0].update(sliding_window=4096))),
        _checker_case("a group field on sequence_finished",
                      lambda f: _edited(f, "hybrid", "sequence_finished", group=1)),
        Case("checker list", "--kv-offloading-size 1e-12 (a tier of 0 blocks)",
             lambda f: _generate("--kv-manager", "vllm", "--kv-offloading-size", "1e-12"), needs_vllm=True),
    ]


def _doubled_skip(folder: Path) -> Path:
    lines = _lines("hybrid")
    event = json.loads(lines[_first(lines, "blocks_skipped")])
    return _edited(folder, "hybrid", "blocks_skipped", blocks=event["blocks"] * 2,
                   logical_indices=event["logical_indices"] * 2)


# ------------------------------------------------------------------ running


def _first_line(stderr: str) -> str:
    """blockviz's first line on stderr ("blockviz: ..."), else the first that is not a library's
    warning (torch and transformers write some) or a progress line ("loading ...")."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    for line in lines:
        if line.startswith("blockviz: ") or line.startswith("recorded "):
            return line
    for line in lines:
        if "Warning" not in line and not line.startswith(" "):
            return line
    return lines[0] if lines else ""


def run(case: Case, folder: Path) -> dict:
    if case.needs_vllm and importlib.util.find_spec("vllm") is None:
        return {"code": "-", "command": "-", "first": "skipped: vLLM is not installed", "traceback": "-", "esc": "-"}
    argv = [arg.replace(f"{folder}{os.sep}", "") for arg in case.argv(folder)]  # paths relative to the cwd
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    limit = case.memory_limit

    def limited() -> None:
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    process = subprocess.Popen([sys.executable, "-m", "blockviz", *argv], cwd=folder, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=limited,
                               errors="backslashreplace")
    if case.sigterm_when:
        deadline = time.monotonic() + TIMEOUT_S
        while process.poll() is None and not list(folder.glob(case.sigterm_when)) and time.monotonic() < deadline:
            time.sleep(0.05)
        if process.poll() is None:
            time.sleep(0.5)
            process.send_signal(signal.SIGTERM)
    try:
        stdout, stderr = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        return {"code": "timeout", "command": argv[0], "first": _first_line(stderr),
                "traceback": "Traceback" in stderr, "esc": False}
    return {"code": process.returncode, "command": argv[0], "first": _first_line(stderr),
            "traceback": "Traceback (most recent call last)" in stderr, "esc": ESC in stdout or ESC in stderr}


def _cell(value: object, width: int) -> str:
    text = str(value).replace("|", "\\|")
    return text if len(text) <= width else text[:width - 1] + "…"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="run only the cases whose group or name holds this text")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = parser.parse_args(argv)
    chosen = [case for case in cases() if args.only.lower() in f"{case.group} {case.name}".lower()]
    bad = 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="hostile-table-") as tmp:
        for number, case in enumerate(chosen):
            folder = Path(tmp) / str(number)
            folder.mkdir()
            result = run(case, folder)
            rows.append((case.group, case.name, result["command"], result["code"], result["first"],
                         "yes" if result["traceback"] is True else "no" if result["traceback"] is False else "-",
                         "yes" if result["esc"] is True else "no" if result["esc"] is False else "-"))
            bad += result["traceback"] is True or result["esc"] is True
            print(" · ".join(map(str, rows[-1])), file=sys.stderr, flush=True)
    head = ("group", "input", "command", "exit", "first line of stderr", "traceback", "raw ESC")
    if args.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for row in rows:
            print("| " + " | ".join(_cell(value, 110) for value in row) + " |")
    else:
        for row in rows:
            print("  ".join(_cell(value, width) for value, width in zip(row, (22, 48, 8, 7, 140, 5, 5))))
    print(f"\n{len(rows)} inputs, {bad} with a traceback or a raw ESC.")
    print("Not through the CLI (each fed by its tests):")
    for what, where in NOT_CLI:
        print(f"  {what}: {where}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
