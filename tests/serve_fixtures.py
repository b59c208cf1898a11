"""`blockviz serve` started as a real server for a test, and always stopped with every process it
started (the per-visitor app processes included): it runs in a session of its own, and the whole
process group is signalled at the end."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from jupyter_fixtures import free_port, wait_until_answering

REPO = Path(__file__).resolve().parent.parent
START_LIMIT_S = 120  # limits for a cold start and a stop, not measurements
STOP_LIMIT_S = 30


@dataclass
class Served:
    """A running `blockviz serve`: its URL, its process, what it printed."""

    url: str
    process: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def app_processes(self) -> list[int]:
        """Ids of the processes in the server's group running a blockviz app (one per visitor)."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == self.process.pid:
                continue
            try:
                same_group = os.getpgid(int(entry.name)) == self.process.pid
                command = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if same_group and command[1:4] == [b"-m", b"blockviz", b"replay"]:
                found.append(int(entry.name))
        return found


def blockviz_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


@contextlib.contextmanager
def serve(*command: str, log_dir: Path, open_files: int | None = None) -> Iterator[Served]:
    """Run `blockviz serve COMMAND --port FREE` on 127.0.0.1 until the block ends; with `open_files`,
    the server may open no more files than that (its soft and hard RLIMIT_NOFILE)."""
    port = free_port()
    log_path = log_dir / "serve.log"

    def limit_open_files() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))

    with open(log_path, "w") as log:
        process = subprocess.Popen([sys.executable, "-m", "blockviz", "serve", *command, "--port", str(port)],
                                   cwd=REPO, env=blockviz_env(), stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True,
                                   preexec_fn=limit_open_files if open_files else None)
        served = Served(f"http://127.0.0.1:{port}", process, log_path)
        try:
            _wait_until_up(served)
            yield served
        finally:
            stop_group(process)


def _wait_until_up(served: Served) -> None:
    wait_until_answering(served.url + "/", served.process, served.log, "blockviz serve", START_LIMIT_S)


def stop_group(process: subprocess.Popen) -> None:
    """SIGTERM the server's whole process group, SIGKILL whatever is left after STOP_LIMIT_S."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=STOP_LIMIT_S)
    except subprocess.TimeoutExpired:
        pass
    deadline = time.monotonic() + STOP_LIMIT_S
    while group_alive(process.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=STOP_LIMIT_S)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
