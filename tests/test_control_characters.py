"""No control character from data reaches a terminal, a browser terminal or a page (issue 50 item 1):
a trace's header and events, a publisher's KV events and a one-line error carry `ESC[2J`, OSC
titles and hyperlinks, `\\r`, backspace, bell and C1 controls, and what is drawn shows them as
escapes (blockviz/model/safe_text.py). Widened over every string field of every event kind and of
the header; checked on the replay and attach screens (Pilot) and in a real terminal (tmux)."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, strategies as st

from blockviz.kvevents.protocol import KNOWN_EVENTS, BlockRemoved, BlockStored, ProtocolError, decode_event
from blockviz.model.palette import show_token, show_tokens
from blockviz.model.safe_text import _text_fields, safe_header, safe_line, safe_struct, safe_text, safe_token
from blockviz.model.trace import HEADER_FIELDS, TRACES_DIR, TraceError, read_trace
from blockviz.session.spec import one_line
from engine import events as ev
from serve_fixtures import REPO, blockviz_env

PAYLOADS = {
    "clear": "\x1b[2J\x1b[H INJECTED",
    "OSC title": "\x1b]0;PWNED\x07",
    "OSC 8 link": "\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\",
    "CR": "kept\roverwritten",
    "backspace": "ab\b\bXY",
    "bell": "ding\x07",
    "C1": "\x9b2J\x9d0;PWNED\x9c\x85\x90",
    "bidi": "abc\u202edcba\u2028",
}
HOSTILE = "".join(PAYLOADS.values())
# What may never be drawn from data: C0 but tab, newline and carriage return; DEL; C1; bidi overrides
NEVER = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
ONE_LINE_NEVER = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def strings_in(value) -> list[str]:
    """Every string inside a value (an event, a dict, lists of them), dict keys too."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, msgspec.Struct):
        return [s for name in value.__struct_fields__ for s in strings_in(getattr(value, name))]
    if isinstance(value, dict):
        return [s for key, item in value.items() for s in strings_in(key) + strings_in(item)]
    if isinstance(value, (list, tuple)):
        return [s for item in value for s in strings_in(item)]
    return []


# ---------------------------------------------------------------- the escapes


@pytest.mark.parametrize("name", PAYLOADS)
def test_each_payload_is_written_visibly(name):
    payload = PAYLOADS[name]
    for safe, never in ((safe_line, ONE_LINE_NEVER), (safe_text, NEVER), (safe_token, NEVER)):
        assert never.search(safe(payload)) is None
    assert safe_line("\x1b[2J\x1b[H INJECTED") == "\\x1b[2J\\x1b[H INJECTED"
    assert safe_line("a\rb\bc\x07\x9b\u202e\n\t") == "a\\rb\\x08c\\x07\\x9b\\u202e\\n\\t"
    assert safe_text("line one\n\tline two\r") == "line one\n\tline two\\r"
    assert safe_token("\n\t\r\x1b") == "\n\t\r\\x1b"


@given(st.text())
def test_any_text_comes_out_with_no_control_character_and_plain_text_unchanged(text):
    assert ONE_LINE_NEVER.search(safe_line(text)) is None
    assert NEVER.search(safe_text(text)) is None and "\r" not in safe_text(text)
    assert NEVER.search(safe_token(text)) is None
    if ONE_LINE_NEVER.search(text) is None:
        assert safe_line(text) is text


@given(st.lists(st.text(), max_size=6))
def test_token_pieces_are_drawn_with_no_control_character(pieces):
    """show_tokens joins the bytes of split characters: a piece that completes one may be a C1."""
    for drawn in show_tokens([safe_token(p) for p in pieces]) + [show_token(p) for p in pieces]:
        assert NEVER.search(drawn) is None and "\r" not in drawn
    assert show_tokens(["\\xc2", "\\x9b"])[1] == "\\x9b"  # U+009B, CSI, from two byte pieces


def test_one_line_errors_write_control_characters_visibly():
    line = one_line(ValueError(f"unknown model {HOSTILE}"))
    assert ONE_LINE_NEVER.search(line) is None and "\\x1b[2J\\x1b[H INJECTED" in line


# ---------------------------------------------------------------- a trace: every string field


def _shipped_lines(name: str) -> list[str]:
    return (TRACES_DIR / f"{name}.jsonl").read_text().splitlines()


def _first_of_each_kind() -> dict[str, tuple[str, int]]:
    """For each event kind: a shipped trace holding it and the line of its first event there."""
    found: dict[str, tuple[str, int]] = {}
    for path in sorted(TRACES_DIR.glob("*.jsonl")):
        for number, line in enumerate(path.read_text().splitlines()[1:], 1):
            found.setdefault(json.loads(line)["type"], (path.stem, number))
    return found


FIRST = _first_of_each_kind()
EVENT_STRING_FIELDS = [(kind, name) for kind, cls in sorted(ev.EVENT_TYPES.items())
                       for name, _ in _text_fields(cls)]


def _check_read(path: Path, injected_into: str) -> bool:
    """Read `path`: either every string of the trace is safe, or the one-line error is; whether it was read."""
    try:
        trace = read_trace(path)
    except TraceError as exc:
        assert ONE_LINE_NEVER.search(str(exc)) is None, (injected_into, str(exc))
        return False
    for text in strings_in(trace.header) + strings_in(trace.events):
        assert NEVER.search(text) is None, (injected_into, text)
    return True


def test_every_event_kind_with_a_string_field_is_in_a_shipped_trace():
    assert {kind for kind, _ in EVENT_STRING_FIELDS} <= set(FIRST)
    assert len(EVENT_STRING_FIELDS) >= 25


@pytest.mark.parametrize(("kind", "field"), EVENT_STRING_FIELDS, ids=[f"{k}.{f}" for k, f in EVENT_STRING_FIELDS])
def test_every_string_field_of_every_event_kind_is_safe_once_read(tmp_path, kind, field):
    name, number = FIRST[kind]
    lines = _shipped_lines(name)[:number + 1]  # the trace up to that event: the checker reads a prefix
    event = json.loads(lines[number])
    event[field] = [HOSTILE, *event[field][1:]] if isinstance(event[field], list) else event[field] + HOSTILE
    lines[number] = json.dumps(event)
    path = tmp_path / "hostile.jsonl"
    path.write_text("\n".join(lines) + "\n")
    _check_read(path, f"{kind}.{field}")


HEADER_STRING_FIELDS = sorted(key for key, (test, _) in HEADER_FIELDS.items() if test("x") or test(["x"]))


def test_the_header_fields_that_take_text_are_known():
    assert {"model", "model_type", "device", "description", "scenario", "prompts"} <= set(HEADER_STRING_FIELDS)


@pytest.mark.parametrize("field", [*HEADER_STRING_FIELDS, "arrivals", "later_prompts", "unknown field", "a key"])
def test_every_string_field_of_the_header_is_safe_once_read(tmp_path, field):
    lines = _shipped_lines("cpu-tier")[:40]
    header = json.loads(lines[0])
    if field == "arrivals":
        header["arrivals"] = [{"step": 3, "prompt": HOSTILE, "n": 1}]
    elif field == "later_prompts":
        header["later_prompts"] = [[3, HOSTILE]]
    elif field == "unknown field":
        header["notes"] = {"by": HOSTILE, "tags": [HOSTILE]}
    elif field == "a key":
        header[HOSTILE] = 1
    elif HEADER_FIELDS[field][0](["x"]):
        header[field] = [HOSTILE]
    else:
        header[field] = HOSTILE
    lines[0] = json.dumps(header)
    path = tmp_path / "hostile.jsonl"
    path.write_text("\n".join(lines) + "\n")
    read = _check_read(path, field)
    assert read or field not in ("model", "description", "prompts", "arrivals", "unknown field", "a key")


def hostile_trace(tmp_path: Path, name: str = "fork-cow") -> Path:
    """A shipped trace with the probe's fields made hostile: the header's model, prompts and
    description, each request's prompt and prompt pieces, every sampled token's text and each
    finish's detail."""
    lines = _shipped_lines(name)
    header = json.loads(lines[0])
    header["model"] = "tiny " + HOSTILE
    header["prompts"] = [p + HOSTILE for p in header["prompts"]]
    header["description"] = HOSTILE
    out = [json.dumps(header)]
    for line in lines[1:]:
        event = json.loads(line)
        if event["type"] == "request_added":
            event["prompt"] += HOSTILE
            event["prompt_tokens_text"] = [HOSTILE] + event["prompt_tokens_text"][1:]
        elif event["type"] == "token_generated":
            event["text"] = PAYLOADS["clear"] if event["position"] % 2 else PAYLOADS["OSC title"] + PAYLOADS["C1"]
        elif event["type"] == "sequence_finished":
            event["detail"] = HOSTILE
        out.append(json.dumps(event))
    path = tmp_path / f"hostile-{name}.jsonl"
    path.write_text("\n".join(out) + "\n")
    return path


def test_the_probes_trace_reads_with_every_string_safe(tmp_path):
    trace = read_trace(hostile_trace(tmp_path))
    assert trace.header["model"].startswith("tiny \\x1b[2J\\x1b[H INJECTED")
    details = [e.detail for e in trace.events if isinstance(e, ev.SequenceFinished)]
    assert details and all(d.startswith("\\x1b[2J\\x1b[H INJECTED") for d in details)
    for text in strings_in(trace.header) + strings_in(trace.events):
        assert NEVER.search(text) is None, text


# ---------------------------------------------------------------- KV events: every string field


KV_STRING_FIELDS = [(tag, name) for tag, cls in sorted(KNOWN_EVENTS.items()) for name, _ in _text_fields(cls)]


def _wire(event) -> list:
    """An event as a tagged array, as vLLM's encoder writes it."""
    return [type(event).__name__, *msgspec.to_builtins(msgspec.structs.astuple(event))]


@pytest.mark.parametrize(("tag", "field"), KV_STRING_FIELDS, ids=[f"{t}.{f}" for t, f in KV_STRING_FIELDS])
def test_every_string_field_of_a_kv_event_is_safe_once_decoded(tag, field):
    base = {"BlockStored": BlockStored((1,), None, (1, 2), 2), "BlockRemoved": BlockRemoved((1,))}[tag]
    value = (HOSTILE, [HOSTILE, 3]) if field == "extra_keys" else HOSTILE
    hostile = msgspec.structs.replace(base, **{field: value})
    decoded = decode_event(_wire(hostile))
    assert type(decoded) is type(base)
    texts = strings_in(decoded)
    assert texts and all(ONE_LINE_NEVER.search(text) is None for text in texts), texts
    assert any("\\x1b[2J\\x1b[H INJECTED" in text for text in texts)


def test_the_probes_kv_fields_and_an_unknown_tag_are_safe():
    stored = decode_event(_wire(BlockStored((1,), None, (1, 2), 2, medium=HOSTILE, kv_cache_spec_kind=HOSTILE,
                                            session_id=HOSTILE, group_idx=0)))
    assert stored.medium == stored.kv_cache_spec_kind == stored.session_id == safe_line(HOSTILE)
    assert ONE_LINE_NEVER.search(decode_event([PAYLOADS["clear"], 1]).type) is None
    with pytest.raises(ProtocolError) as bad:
        decode_event(["BlockStored", "not a list", None, [], 2])
    assert ONE_LINE_NEVER.search(str(bad.value)) is None


def test_a_struct_with_nothing_to_escape_is_returned_as_it_is():
    stored = BlockStored((1,), None, (1, 2), 2, medium="GPU", session_id="chat-7")
    assert safe_struct(stored) is stored
    header = {"model": "gpt2", "prompts": ["ROMEO:\n"]}
    assert safe_header(header) == header


# ---------------------------------------------------------------- the screens: Pilot


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _screen(app) -> str:
    return "\n".join("".join(seg.text for seg in strip) for strip in app.screen._compositor.render_strips())


@pytest.mark.anyio
async def test_the_replay_screen_shows_the_probes_strings_as_escapes(tmp_path):
    from blockviz.tui.app import BlockvizApp

    app = BlockvizApp(trace=read_trace(hostile_trace(tmp_path)), deterministic=True, play=False)
    screens = []
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        for keys in ((), ("s",) * 3, ("G",)):  # the start, a few steps in (prompts, tokens), the end (finishes)
            await pilot.press(*keys)
            await pilot.pause()
            screens.append((_screen(app), app.export_screenshot()))
    for text, svg in screens:
        assert NEVER.search(text) is None and NEVER.search(svg) is None
    drawn = " ".join(text for text, _ in screens)
    assert "INJECTED" in drawn and "\\x1b[2J" in drawn


@pytest.mark.anyio
async def test_the_attach_screen_shows_a_publishers_strings_as_escapes():
    """The probe's attach fields (kv_cache_spec_kind, medium, session_id) from a real publisher,
    through the wire's decoding, on the screen."""
    from blockviz.kvevents.publisher import KVEventPublisher
    from blockviz.tui.attach_app import AttachApp
    from test_kv_round_trip import WAIT_S, free_ports

    endpoint = f"tcp://127.0.0.1:{free_ports(1)[0]}"
    events = [BlockStored((0xAB << 56,), None, (31, 32), 2, medium="GPU", group_idx=0,
                          kv_cache_spec_kind=HOSTILE, session_id=HOSTILE),
              BlockStored((0xCD << 56,), 0xAB << 56, (33, 34), 2, medium=HOSTILE, group_idx=1,
                          kv_cache_spec_kind="sliding_window", session_id="chat-7")]
    with KVEventPublisher(endpoint) as publisher:
        app = AttachApp(endpoint)
        async with app.run_test(size=(180, 40)) as pilot:
            assert await asyncio.to_thread(publisher.wait_for_subscribers, 1, WAIT_S)
            publisher.publish(events)
            deadline = time.monotonic() + WAIT_S
            while app.state.num_batches < 1 and time.monotonic() < deadline:
                await pilot.pause(0.05)
            await pilot.pause()
            text, svg = _screen(app), app.export_screenshot()
    assert app.state.num_batches == 1
    assert NEVER.search(text) is None and NEVER.search(svg) is None
    assert "session \\x1b[2J" in text and "\\x1b[2J\\x1b[H INJECTED" in text


# ---------------------------------------------------------------- a real terminal: tmux

SGR = re.compile(r"\x1b\[[0-9;:]*m")
TMUX_LIMIT_S = 120  # a cold start of blockviz replay on a loaded machine: a limit, not a measurement
INJECTED_DRAWN = re.compile(r"\\x1b\[2J\\x1b\[H[ ·]INJE")  # the escapes as text, on one row


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install -y tmux)")
def test_a_real_terminal_running_replay_is_neither_cleared_nor_retitled(tmp_path):
    """`blockviz replay` of the probe's trace in tmux at 100x30: the pane shows the escapes as text,
    its title is not the trace's, and every escape sequence tmux keeps is its own colouring (SGR)."""
    trace = hostile_trace(tmp_path)
    socket = f"blockviz-test-{tmp_path.name}"
    env = {**blockviz_env(), "TERM": "xterm-256color"}

    def tmux(*args: str) -> str:
        return subprocess.run(["tmux", "-L", socket, *args], capture_output=True, text=True, env=env,
                              timeout=30, check=True).stdout

    tmux("new-session", "-d", "-x", "100", "-y", "30", "-s", "replay",
         f"cd {REPO} && {sys.executable} -m blockviz replay {trace} ; sleep 600")
    try:
        deadline = time.monotonic() + TMUX_LIMIT_S
        while "Quit" not in tmux("capture-pane", "-p", "-t", "replay"):  # the footer: the app is up
            assert time.monotonic() < deadline, tmux("capture-pane", "-p", "-t", "replay")
            time.sleep(0.5)
        screens = []
        for keys in ((), ("s", "s", "s"), ("G",)):
            if keys:
                tmux("send-keys", "-t", "replay", *keys)
                time.sleep(2)
            screens.append((tmux("capture-pane", "-p", "-t", "replay"), tmux("capture-pane", "-p", "-e", "-t", "replay")))
        # the injected strings are drawn once the replay has stepped to them; a loaded machine may
        # take longer than the sleeps above: keep stepping and capturing until they are (a limit)
        while (not any(INJECTED_DRAWN.search(plain) for plain, _ in screens)
               and time.monotonic() < deadline + TMUX_LIMIT_S):
            tmux("send-keys", "-t", "replay", "s")  # keys a busy app dropped: step on until they show
            time.sleep(1)
            screens.append((tmux("capture-pane", "-p", "-t", "replay"), tmux("capture-pane", "-p", "-e", "-t", "replay")))
        title = tmux("display-message", "-p", "-t", "replay", "#{pane_title}")
        tmux("send-keys", "-t", "replay", "q")
    finally:
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True, env=env, timeout=30)
    assert "PWNED" not in title
    for plain, coloured in screens:
        assert NEVER.search(plain) is None
        assert NEVER.search(SGR.sub("", coloured)) is None, [m.group() for m in re.finditer(r"\x1b.{0,12}", coloured)]
    drawn = "\n".join(plain for plain, _ in screens)
    # on rows of the panels that draw them (a token's spaces as '·'), the screen around them whole
    assert any(INJECTED_DRAWN.search(line) for line in drawn.splitlines()), drawn
    assert all("Quit" in plain and "GPU pool" in plain for plain, _ in screens), drawn


# ---------------------------------------------------------------- serve's websocket stream

CSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
POINTER_SHAPE = re.compile(r"\x1b\]22;[\w-]*(?:\x07|\x1b\\)")  # Textual's own OSC 22: the mouse pointer's shape
SERVE_LIMIT_S = 60  # limits on waits, never measurements


def test_serve_sends_a_browser_terminal_none_of_the_traces_control_characters(tmp_path):
    """`blockviz serve replay` of the probe's trace: what the visitor's terminal receives (the app's
    screen, over the websocket) holds the probe's strings as escapes, and no escape sequence but
    the app's own (CSI, and OSC 22 for the pointer's shape)."""
    import aiohttp
    from serve_fixtures import serve

    trace = hostile_trace(tmp_path)

    async def visit(url: str) -> bytes:
        received = []
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(url + "/ws?width=120&height=40", origin=url) as ws:
                for keys in ("", "sss", "G"):
                    if keys:
                        await ws.send_str(json.dumps(["stdin", keys]))
                    deadline = time.monotonic() + (SERVE_LIMIT_S if not keys else 3)
                    while time.monotonic() < deadline:
                        try:
                            message = await ws.receive(timeout=1 if received else SERVE_LIMIT_S)
                        except asyncio.TimeoutError:
                            if received:
                                break
                            continue
                        if message.type == aiohttp.WSMsgType.BINARY:
                            received.append(message.data)
                        elif message.type != aiohttp.WSMsgType.TEXT:
                            break
        return b"".join(received)

    with serve("replay", str(trace), log_dir=tmp_path) as served:
        stream = asyncio.run(asyncio.wait_for(visit(served.url), SERVE_LIMIT_S * 3)).decode("utf-8", "replace")
    assert "\x1b[H INJECTED" not in stream and "\x1b]0;PWNED" not in stream and "\x1b]8;;" not in stream
    bare = POINTER_SHAPE.sub("", CSI.sub("", stream))
    assert re.search("[\x07\x08\x1b\x7f-\x9f\u202a-\u202e]", bare) is None, \
        [m.group() for m in re.finditer(r"[\x07\x08\x1b\x7f-\x9f\u202a-\u202e].{0,16}", bare)][:5]
    assert "INJECTE" in bare and "x1b[2J" in bare


# ---------------------------------------------------------------- the notebook's frames and the SVG


def test_the_notebooks_frames_and_the_exported_picture_hold_only_escapes(tmp_path):
    from blockviz.jupyter.visualizer import Visualizer
    from blockviz.model.export import trace_frame, trace_title
    from blockviz.model.svg import frame_svg
    from blockviz.model.timeline import Timeline

    trace = read_trace(hostile_trace(tmp_path))
    viz = Visualizer.from_trace(trace)
    timeline = Timeline.for_trace(trace)
    drawn = []
    for position in (len(trace.events) // 3, len(trace.events) // 2, len(trace.events)):
        viz.timeline.seek(position)
        timeline.seek(position)
        frame = trace_frame(timeline, trace.header, trace_title(trace))
        drawn += [json.dumps(viz.frame(), ensure_ascii=False), frame_svg(frame, title=trace_title(trace))]
    for text in drawn:
        assert NEVER.search(text) is None
    assert any("INJECTE" in text and "\\x1b[2J" in text for text in drawn[1::2])  # the picture
    assert any("INJECTE" in text for text in drawn[0::2])  # the notebook's frame


# ---------------------------------------------------------------- a live run: a user's prompt, a tokenizer's pieces


def test_a_live_sessions_events_and_header_hold_only_escapes():
    from blockviz.session.engine_session import EngineSession
    from blockviz.session.spec import EngineSpec
    from test_tui_fake_engine import FakeEngine

    spec = EngineSpec.of(model="fake", prompts=("ROMEO: " + HOSTILE,), n=2, max_tokens=4, seed=7)
    session = EngineSession(spec, engine=FakeEngine())
    batches = []
    session.start()
    session.run_to_completion(on_events=batches.append)
    session.close()
    events = [e for batch in batches for e in batch]
    added = [e for e in events if isinstance(e, ev.RequestAdded)]
    assert added and all(e.prompt.startswith("ROMEO: \\x1b[2J\\x1b[H INJECTED") for e in added)
    for text in strings_in(events) + strings_in(session.header):
        assert NEVER.search(text) is None, text


@pytest.mark.anyio
async def test_a_toast_quoting_data_holds_only_escapes():
    """The TUI's last guard: a notification (an engine's refusal quotes the prompt) is made safe."""
    from blockviz.model.trace import load_trace
    from blockviz.tui.app import BlockvizApp

    app = BlockvizApp(trace=load_trace("fork-cow"), deterministic=True, play=False)
    async with app.run_test(size=(120, 30)) as pilot:
        app.notify(f"the engine refused {HOSTILE}", title=PAYLOADS["OSC title"], severity="error", markup=False)
        await pilot.pause()
        shown = [(n.message, n.title) for n in app._notifications]
    assert len(shown) == 1 and shown[0][0].startswith("the engine refused \\x1b[2J\\x1b[H INJECTED")
    assert all(NEVER.search(text) is None for text in shown[0])


def test_attachs_tokenizer_pieces_are_drawn_with_escapes():
    from blockviz.kvevents.tokens import TokenText

    pieces = {1: PAYLOADS["clear"], 2: PAYLOADS["C1"], 3: PAYLOADS["bidi"], 4: " ok\n"}
    drawn = TokenText(pieces.__getitem__, "hostile").text([1, 2, 3, 4])
    assert NEVER.search(drawn) is None and "\r" not in drawn
    assert drawn.startswith("\\x1b[2J\\x1b[H·INJECTED") and drawn.endswith("·ok⏎")


@pytest.mark.parametrize("piece", ["\u2028", "\u2029", "\u202e", "\u2066"])
def test_a_token_piece_holding_a_line_separator_or_bidi_control_is_drawn_escaped(piece):
    """Hypothesis found U+2028 drawn raw in a token piece: line separators and bidi controls are
    drawn as their escapes, as the other control characters are."""
    from blockviz.model.palette import show_token, show_tokens

    assert show_token(piece) == f"\\u{ord(piece):04x}" and show_tokens([piece]) == [f"\\u{ord(piece):04x}"]


def test_generate_prints_a_prompt_and_its_completion_with_escapes(capsys):
    """`blockviz generate` prints the engine's outputs (the prompt as given, the completion's
    text), which no trace reader has made safe: they are written visibly there."""
    from blockviz.cli import main

    assert main(["generate", "--prompt", HOSTILE + "ROMEO:", "--max-tokens", "2"]) == 0
    out = capsys.readouterr().out
    assert not NEVER.search(out) and "\\x1b[2J" in out and "ROMEO:" in out, out[:300]


def test_a_string_of_millions_of_control_characters_is_made_safe_in_one_pass():
    """A 4 MiB trace line or KV event of ESC characters: escaped by str.translate (no Python call
    per character), the same text as the per-character escape gives."""
    text = "\x1b\u202e\x9b\r" * 1_000_000
    safe = safe_line(text)
    assert safe == "\\x1b\\u202e\\x9b\\r" * 1_000_000 and not ONE_LINE_NEVER.search(safe)
