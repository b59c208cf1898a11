"""Real-browser fixtures: a JupyterLab server and Debian's chromium driven by Playwright.

The recipe of /work/shared/DESIGN.md ("Tests in tiers"): JupyterLab on 127.0.0.1 and a free port,
configured by `jupyterlab.galata.configure_jupyter_server` (no token, no XSRF, `window.jupyterapp`
exposed), allow_root, news and update checks off; chromium at /usr/bin/chromium launched with
`executable_path` (never `playwright install`) through Playwright's sync API, one browser for the
whole session (see Chromium.in_use: between browser tests other asyncio users run as usual). Under
CI (CI=true) a missing chromium fails the test; elsewhere it skips with the line that installs it.

Reuse them from any test module under tests/ (tests/conftest.py imports them):

    def test_my_notebook(jupyter_server, lab_page, tmp_path):
        path = jupyter_server.add_notebook("mine.ipynb", ["from blockviz.jupyter import Visualizer", "viz = ..."])
        open_notebook(lab_page, jupyter_server, path)      # fresh workspace, kernel idle
        run_all_cells(lab_page)                            # fire-and-forget
        wait_for_visualizer(lab_page)
        click_and_wait(lab_page, "step")                   # a Controls button, until the cursor moves
        kernel_json(lab_page, "viz.position")              # evaluate in the notebook's kernel

The plain functions (start_jupyter_server, launch_chromium, open_notebook, ...) are what
scripts/make_screenshots.py and benchmarks/widgets.py use outside pytest.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest

CHROMIUM = os.environ.get("BLOCKVIZ_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]
SERVER_START_LIMIT_S = 180  # a limit for a cold start, not a measurement
UI_LIMIT_MS = 120_000  # Playwright waits (kernel start, widget render) before a test gives up
NOTIFICATION_SETTINGS = {"fetchNews": "false", "checkForUpdates": False}


def chromium_path() -> str:
    """Debian's chromium, or skip (fail under CI=true) when it is missing."""
    if shutil.which(CHROMIUM) or Path(CHROMIUM).is_file():
        return CHROMIUM
    message = f"chromium is not installed at {CHROMIUM} (apt-get install -y chromium)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


def launch_args() -> dict[str, Any]:
    """Keyword arguments for `playwright.chromium.launch`."""
    return {"executable_path": CHROMIUM, "args": list(CHROMIUM_ARGS), "headless": True}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class JupyterServer:
    """A running JupyterLab: its URL, the root directory notebooks go into, its process."""

    url: str
    root_dir: Path
    process: subprocess.Popen
    log_path: Path
    notebooks: list[Path] = field(default_factory=list)

    def add_notebook(self, name: str, cells: list[str]) -> Path:
        """Write a notebook of code cells (no outputs) into the root directory; returns its path."""
        import nbformat

        notebook = nbformat.v4.new_notebook()
        notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        notebook.cells = [nbformat.v4.new_code_cell(source) for source in cells]
        path = self.root_dir / name
        nbformat.write(notebook, path)
        self.notebooks.append(path)
        return path

    def copy_notebook(self, source: str | Path, name: str | None = None) -> Path:
        """A temporary copy of an existing notebook (a lesson) in the root directory."""
        path = self.root_dir / (name or Path(source).name)
        shutil.copy(source, path)
        self.notebooks.append(path)
        return path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@contextlib.contextmanager
def start_jupyter_server(root_dir: str | Path | None = None) -> Iterator[JupyterServer]:
    """Start JupyterLab on 127.0.0.1 and a free port (galata's test configuration); stop it after."""
    base = Path(tempfile.mkdtemp(prefix="blockviz-jupyter-"))
    root = Path(root_dir) if root_dir is not None else base / "root"
    root.mkdir(parents=True, exist_ok=True)
    settings = base / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(json.dumps(NOTIFICATION_SETTINGS))
    port = free_port()
    config = base / "jupyter_server_config.py"
    config.write_text(
        "from jupyterlab.galata import configure_jupyter_server\n"
        "configure_jupyter_server(c)\n"
        "c.ServerApp.ip = '127.0.0.1'\n"
        f"c.ServerApp.port = {port}\n"
        f"c.ServerApp.root_dir = {str(root)!r}\n"
        "c.ServerApp.allow_root = True\n"
        "c.ServerApp.open_browser = False\n"
        f"c.LabApp.user_settings_dir = {str(base / 'settings')!r}\n"
        f"c.LabApp.workspaces_dir = {str(base / 'workspaces')!r}\n"
        "c.LabApp.news_url = None\n"
        "c.LabApp.check_for_updates_class = 'jupyterlab.NeverCheckForUpdate'\n"
    )
    env = dict(os.environ)
    env["JUPYTER_CONFIG_DIR"] = str(base / "config")  # no user config leaks in
    env["JUPYTER_RUNTIME_DIR"] = str(base / "runtime")
    repo = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = repo + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("HF_HUB_OFFLINE", "1")
    log_path = base / "server.log"
    log = open(log_path, "w")
    process = subprocess.Popen([sys.executable, "-m", "jupyterlab", f"--config={config}"], cwd=root, env=env,
                               stdout=log, stderr=subprocess.STDOUT)
    server = JupyterServer(f"http://127.0.0.1:{port}", root, process, log_path)
    try:
        _wait_until_up(server)
        yield server
    finally:
        stop_process(process, 30)
        log.close()
        shutil.rmtree(base, ignore_errors=True)


def stop_process(process: subprocess.Popen, limit_s: float) -> None:
    """SIGTERM `process`, SIGKILL it if it is still there after `limit_s`, and reap it."""
    process.terminate()
    try:
        process.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=limit_s)


def _wait_until_up(server: JupyterServer) -> None:
    wait_until_answering(f"{server.url}/api/status", server.process, server.log, "JupyterLab")


def wait_until_answering(url: str, process: subprocess.Popen, log, name: str,
                         limit_s: float = SERVER_START_LIMIT_S) -> None:
    """Wait until GET `url` answers 200; raise with the end of `log()` if `process` exits first
    or `limit_s` passes."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited ({process.returncode}): {log()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.25)
    raise RuntimeError(f"{name} did not answer within {limit_s} s: {log()[-2000:]}")


def only_local(page) -> None:
    """Abort every request that is not to 127.0.0.1 (the machine has no network; be explicit)."""
    def route(r):
        if r.request.url.startswith(("http://127.0.0.1", "ws://127.0.0.1", "data:", "blob:")):
            r.continue_()
        else:
            r.abort()

    page.route("**/*", route)


# ---------------------------------------------------------------------------- driving a notebook


def open_notebook(page, server: JupyterServer, path: Path) -> None:
    """Open `path` in a fresh workspace and wait until its kernel is connected and idle."""
    only_local(page)
    page.set_default_timeout(UI_LIMIT_MS)
    relative = Path(path).relative_to(server.root_dir).as_posix()
    workspace = f"blockviz-{uuid.uuid4().hex[:8]}"
    page.goto(f"{server.url}/lab/workspaces/{workspace}/tree/{relative}?reset")
    page.wait_for_function(
        """(name) => {
            const app = window.jupyterapp;
            const widget = app && app.shell && app.shell.currentWidget;
            const session = widget && widget.sessionContext && widget.sessionContext.session;
            const kernel = session && session.kernel;
            return !!(widget && widget.context && widget.context.path.endsWith(name) && kernel
                      && kernel.connectionStatus === 'connected' && kernel.status === 'idle');
        }""", arg=Path(relative).name, timeout=UI_LIMIT_MS)


def run_all_cells(page) -> None:
    """Start notebook:run-all-cells without awaiting it (awaiting it inside evaluate hangs)."""
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")


# Every pool block drawn on the page as [device, block, state, ref]: from each canvas's data-states
# and data-refs (written by the paint that drew them), or from each cell of the "cells" renderer.
DRAWN_BLOCKS_JS = """() => {
    const names = { u: "used", c: "cached", f: "free", n: "null" };
    const out = [];
    for (const pool of document.querySelectorAll('.bv-view-pool .bv-pool')) {
        const canvas = pool.querySelector('canvas.bv-pool-canvas[data-states]');
        if (canvas) {
            const refs = canvas.dataset.refs.split(',');
            const start = Number(canvas.dataset.start || 0);  // a range of a big pool: cell i is block start + i
            Array.from(canvas.dataset.states).forEach((code, i) =>
                out.push([canvas.dataset.device, start + i, names[code] || code, Number(refs[i])]));
        }
        for (const c of pool.querySelectorAll('.bv-cell')) {
            out.push([c.dataset.device, Number(c.dataset.block), c.dataset.state, Number(c.dataset.ref)]);
        }
    }
    return out;
}"""


def wait_for_visualizer(page, num_cells: int | None = None) -> None:
    """Wait until a Visualizer's controls and pools are drawn (and, given, `num_cells` pool blocks)."""
    page.wait_for_selector(".bv-view-controls[data-position]", timeout=UI_LIMIT_MS)
    if num_cells is not None:
        page.wait_for_function(f"(n) => ({DRAWN_BLOCKS_JS})().length === n", arg=num_cells, timeout=UI_LIMIT_MS)


# Block `number`'s cell on its pool canvas as {x, y, w, h} in CSS pixels from the canvas's top-left
# (from the layout the canvas carries), after scrolling its row into view.
CELL_BOX_JS = """([device, number]) => {
    const canvas = document.querySelector(`.bv-view-pool canvas.bv-pool-canvas[data-device='${device}']`);
    const d = canvas.dataset, grid = canvas.closest('.bv-grid');
    const [w, h, gap, pad] = [d.cellWidth, d.cellHeight, d.gap, d.pad].map(Number);
    const i = number - Number(d.start || 0);  // a range of a big pool starts at data-start
    const col = i % Number(d.cols), row = Math.floor(i / Number(d.cols));
    const top = pad + row * (h + gap);
    if (top < grid.scrollTop || top + h > grid.scrollTop + grid.clientHeight) grid.scrollTop = top - pad;
    return { x: pad + col * (w + gap), y: top - grid.scrollTop, w, h };
}"""


def pool_canvas(device: str) -> str:
    return f".bv-view-pool canvas.bv-pool-canvas[data-device='{device}']"


def click_block(page, device: str, number: int) -> None:
    """Click the middle of block `number`'s cell on its pool canvas, as a person would."""
    box = page.evaluate(CELL_BOX_JS, [device, number])
    page.click(pool_canvas(device), position={"x": box["x"] + box["w"] / 2, "y": box["y"] + box["h"] / 2})


def hover_block(page, device: str, number: int) -> None:
    """Move the mouse over the middle of block `number`'s cell on its pool canvas."""
    box = page.evaluate(CELL_BOX_JS, [device, number])
    page.hover(pool_canvas(device), position={"x": box["x"] + box["w"] / 2, "y": box["y"] + box["h"] / 2})


def block_pixel(page, device: str, number: int, dx: float, dy: float) -> list[int]:
    """The RGBA painted on the pool canvas at (dx, dy) CSS pixels from block `number`'s cell's corner."""
    return page.evaluate("""([box, device, dx, dy]) => {
        const canvas = document.querySelector(`.bv-view-pool canvas.bv-pool-canvas[data-device='${device}']`);
        const scale = canvas.width / canvas.getBoundingClientRect().width;
        const x = Math.round((box.x + dx) * scale), y = Math.round((box.y + dy) * scale);
        return Array.from(canvas.getContext('2d').getImageData(x, y, 1, 1).data);
    }""", [page.evaluate(CELL_BOX_JS, [device, number]), device, dx, dy])


def cursor_position(page) -> int:
    return int(page.get_attribute(".bv-view-controls", "data-position"))


def click_and_wait(page, action: str) -> int:
    """Click a Controls button (data-action: step, step_event, back, ...) and wait until the
    cursor moves; returns the new position."""
    before = cursor_position(page)
    page.click(f".bv-view-controls button[data-action='{action}']")
    page.wait_for_function(
        "(before) => Number(document.querySelector('.bv-view-controls').dataset.position) !== before",
        arg=before, timeout=UI_LIMIT_MS)
    return cursor_position(page)


def kernel_json(page, expression: str) -> Any:
    """Evaluate a Python expression in the open notebook's kernel; returns its value through JSON."""
    code = f"import json as _bv_json\nprint(_bv_json.dumps({expression}))"
    text = page.evaluate(
        """async (code) => {
            const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
            const future = kernel.requestExecute({ code, silent: false, store_history: false });
            let out = '', error = '';
            future.onIOPub = (msg) => {
                if (msg.header.msg_type === 'stream') out += msg.content.text;
                if (msg.header.msg_type === 'error') error = msg.content.ename + ': ' + msg.content.evalue;
            };
            await future.done;
            if (error) throw new Error(error);
            return out;
        }""", code)
    return json.loads(text)


def page_cells(page) -> list[list]:
    """Every pool block drawn on the page as [device, block, state, ref] (DRAWN_BLOCKS_JS)."""
    return page.evaluate(DRAWN_BLOCKS_JS)


def drawn_blocks_in(page, root: str) -> list[list]:
    """The same, for the pools inside the first element matching `root` only (".blockviz-moment":
    a moment, viz.snapshot(); ".blockviz:not(.blockviz-moment)": a live Visualizer)."""
    scoped = DRAWN_BLOCKS_JS.replace("() => {", "(root) => {", 1).replace(
        "document.querySelectorAll('.bv-view-pool .bv-pool')",
        "document.querySelector(root).querySelectorAll('.bv-view-pool .bv-pool')", 1)
    return page.evaluate(scoped, root)


KERNEL_CELLS = ("[[b.device, b.number, __import__('blockviz.model.view', fromlist=['x']).block_state(b), "
                "b.ref_count] for p in {viz}.state.pools.values() for b in p]")


def kernel_cells(page, viz: str = "viz") -> list[list]:
    """The same, from the reducer state of the Visualizer named `viz` in the kernel."""
    return kernel_json(page, KERNEL_CELLS.format(viz=viz))


def wait_for_position(page, position: int) -> None:
    """Wait until the page's controls show cursor `position` (frames arrive within a frame interval)."""
    page.wait_for_function(
        "(p) => Number(document.querySelector('.bv-view-controls').dataset.position) === p",
        arg=position, timeout=UI_LIMIT_MS)


# ---------------------------------------------------------------------------- pytest fixtures


@pytest.fixture(scope="session")
def jupyter_server() -> Iterator[JupyterServer]:
    """One JupyterLab server for the whole test session (notebooks go into its root_dir)."""
    chromium_path()
    with start_jupyter_server() as server:
        yield server


@dataclass
class Chromium:
    """Debian's chromium through Playwright's sync API, and the event loop that API runs on."""

    browser: Any
    loop: asyncio.AbstractEventLoop

    @contextlib.contextmanager
    def in_use(self) -> Iterator[Any]:
        """The browser, with Playwright's loop marked running in this thread only inside the block.

        Playwright's sync API runs its loop in a greenlet of its own and, after each call, marks it
        as this thread's running loop (playwright/_impl/_greenlets.py `wait_for_future`), which
        blocks every other asyncio user here (Textual's run_test, nbclient: "cannot be called from a
        running event loop"). Between browser tests nothing waits on that loop, so the mark is set
        for a browser test and cleared after it: one chromium serves the whole session."""
        asyncio.events._set_running_loop(self.loop)
        try:
            yield self.browser
        finally:
            asyncio.events._set_running_loop(None)


@contextlib.contextmanager
def launch_chromium() -> Iterator[Chromium]:
    """Launch Debian's chromium (launch_args) through Playwright's sync API; close it after."""
    from playwright.sync_api import sync_playwright

    playwright = sync_playwright().start()
    try:
        browser = playwright.chromium.launch(**launch_args())
        chromium = Chromium(browser, asyncio.events.get_running_loop())
    except BaseException:
        playwright.stop()
        raise
    asyncio.events._set_running_loop(None)
    try:
        yield chromium
    finally:
        with chromium.in_use():
            browser.close()
            playwright.stop()


@pytest.fixture(scope="session")
def chromium_session() -> Iterator[Chromium]:
    """One chromium for the whole test session (under pytest-xdist: one per worker that runs a browser
    test; tests/conftest.py spreads the browser tests over the workers)."""
    chromium_path()
    with launch_chromium() as chromium:
        yield chromium


@pytest.fixture
def chromium_browser(chromium_session):
    """The session's chromium (a Playwright Browser), usable for the length of one test: open
    contexts and pages on it and close them in the test (lab_page does)."""
    with chromium_session.in_use() as browser:
        yield browser


@pytest.fixture
def lab_page(chromium_browser):
    """A page in a fresh browser context (1400x1000), every request kept on 127.0.0.1."""
    context = chromium_browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(UI_LIMIT_MS)
    try:
        yield page
    finally:
        context.close()
