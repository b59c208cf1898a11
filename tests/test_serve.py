"""`blockviz serve` without a browser: bad input and a busy port are one line and exit 2 before any
server starts; the command each visitor runs; the server process never imports torch; the page
names nothing outside the server. (tests/test_serve_browser.py drives it in chromium.)"""

from __future__ import annotations

import shlex
import socket
import subprocess
import sys

import pytest
from serve_fixtures import REPO, blockviz_env

CLI_LIMIT_S = 120  # a limit, so a check that let a server start fails instead of hanging


def _serve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "blockviz", "serve", *args], capture_output=True, text=True,
                          timeout=CLI_LIMIT_S, stdin=subprocess.DEVNULL, cwd=REPO, env=blockviz_env())


def _one_line_exit_2(result: subprocess.CompletedProcess, expected: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


@pytest.mark.parametrize(("args", "expected"), [
    ([], "serve needs a command to serve: run or replay"),
    (["generate"], "not 'generate'"),
    (["replay", "no-such-trace"], "does not exist"),
    (["replay", "fork-cow", "--no-such-option"], "unrecognized arguments: --no-such-option"),
    (["replay"], "the following arguments are required"),
    (["run", "--device", "tpu"], "--device must be cpu, cuda or cuda:N"),
    (["run", "--prompt", ""], "--prompt is empty"),
    (["run", "--model", "./no/such/dir"], "does not exist"),
    (["replay", "fork-cow", "--port", "0"], "--port must be at least 1"),
    (["--port", "http", "replay", "fork-cow"], "--port must be an integer"),
    (["replay", "fork-cow", "--port=70000"], "--port must be at most 65535"),
    (["replay", "fork-cow", "--host", "no.such.host.invalid"], "--host no.such.host.invalid"),
], ids=["nothing", "not a TUI", "no trace", "bad option", "no trace named", "bad device", "empty prompt",
        "no model", "port 0", "port text", "port too big", "bad host"])
def test_bad_input_is_one_line_exit_2(args, expected):
    _one_line_exit_2(_serve(*args), expected)


@pytest.mark.parametrize("before", [True, False], ids=["--port before", "--port after"])
def test_a_busy_port_is_one_line_exit_2(before):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        args = ["--port", port, "replay", "fork-cow"] if before else ["replay", "fork-cow", "--port", port]
        _one_line_exit_2(_serve(*args), f"port {port} on 127.0.0.1 is in use")


def test_help_says_how_to_open_it_to_the_lan():
    result = _serve("--help")
    assert result.returncode == 0
    assert "--host 0.0.0.0" in result.stdout and "LAN" in result.stdout


def test_address_options_come_out_of_the_served_command():
    from blockviz.commands.serve import split_command

    address, argv = split_command(["replay", "fork-cow", "--host", "0.0.0.0", "--projector", "--port=9000"])
    assert (address.host, address.port, argv) == ("0.0.0.0", 9000, ["replay", "fork-cow", "--projector"])
    address, argv = split_command(["run", "--prompt", "ROMEO: --port"])
    assert (address.host, address.port, argv) == (None, None, ["run", "--prompt", "ROMEO: --port"])


def test_each_visitor_runs_this_python_on_the_served_command():
    from blockviz.commands.serve import visitor_command

    line = visitor_command(["run", "--prompt", "ROMEO: it's; $(rm -rf /)"])
    assert line.startswith("exec ")  # the shell becomes the app: stopping it stops the app
    assert shlex.split(line)[1:] == [sys.executable, "-m", "blockviz", "run", "--prompt", "ROMEO: it's; $(rm -rf /)"]


def test_the_server_never_imports_torch():
    code = ("import sys\n"
            "from blockviz.commands.serve import check_command, visitor_command\n"
            "from blockviz.web import BlockvizServer\n"
            "check_command(['run', '--device', 'cpu']); check_command(['replay', 'fork-cow'])\n"
            "BlockvizServer(visitor_command(['run']), title='t', host='127.0.0.1', port=8000, on_ready=print)\n"
            "print(','.join(m for m in ('torch', 'transformers', 'textual.app') if m in sys.modules))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=CLI_LIMIT_S,
                            cwd=REPO, env=blockviz_env(), check=True)
    assert result.stdout.strip() == ""


def test_the_page_names_nothing_outside_the_server():
    from blockviz.web import PAGE

    page = PAGE.format(title="t", websocket_url="ws://127.0.0.1:8000/ws", font_size=16)
    assert "http" not in page.replace("ws://127.0.0.1:8000/ws", "")
    assert 'src="/static/js/textual.js"' in page and "/static/fonts/RobotoMono" in page


def test_a_wildcard_host_prints_this_machine_and_its_lan_address(monkeypatch):
    from blockviz import web

    monkeypatch.setattr(web, "lan_address", lambda: "192.168.1.20")
    assert web.urls("0.0.0.0", 8000) == ["http://127.0.0.1:8000", "http://192.168.1.20:8000"]
    assert web.urls("127.0.0.1", 8080) == ["http://127.0.0.1:8080"]
    assert web.urls("::1", 8080) == ["http://[::1]:8080"]


def test_the_servers_terminal_keeps_its_urls_not_a_line_per_request(tmp_path):
    """Loading the page and its script writes no access-log line under the printed URL."""
    import urllib.request

    from serve_fixtures import serve

    with serve("replay", "fork-cow", log_dir=tmp_path) as served:
        for path in ("/", "/static/js/textual.js", "/static/css/xterm.css"):
            with urllib.request.urlopen(served.url + path, timeout=30) as response:
                assert response.status == 200
        log = served.log()
    assert f"open {served.url}" in log
    assert "GET /" not in log
