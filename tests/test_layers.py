"""The layout shows the architecture: each layer imports only the layers below it, event names are
spelled only in the event module, and only the engine session steps an engine.

engine/ (the engine) < blockviz/model/ (the view model) < blockviz/session/ (the engine session)
< the front ends: blockviz/tui/, blockviz/jupyter/, blockviz/kvevents/, blockviz/commands/ + cli.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from engine.events import EVENT_TYPES

ROOT = Path(__file__).resolve().parents[1]
FRONT_ENDS = ("blockviz.tui", "blockviz.jupyter", "blockviz.kvevents", "blockviz.commands", "blockviz.cli",
              "blockviz.web", "blockviz.web_listener", "blockviz.webpage")
UI_LIBRARIES = ("textual", "ipywidgets", "anywidget")
# What each layer may not import (any module whose name starts with one of these).
FORBIDDEN = {
    "engine": ("blockviz",) + UI_LIBRARIES + ("rich",),
    "blockviz.model": ("blockviz.session",) + FRONT_ENDS + UI_LIBRARIES + ("torch",),
    "blockviz.session": FRONT_ENDS + UI_LIBRARIES,
    "blockviz.tui": ("blockviz.jupyter", "blockviz.commands", "ipywidgets", "anywidget"),
    "blockviz.jupyter": ("blockviz.tui", "blockviz.commands", "textual"),
    "blockviz.webpage": ("blockviz.tui", "blockviz.commands", "textual", "torch"),  # a page is made with no engine
}


def modules(package: str) -> list[tuple[str, Path]]:
    base = ROOT.joinpath(*package.split("."))
    return [(package + "." + ".".join(p.relative_to(base).with_suffix("").parts), p) for p in sorted(base.rglob("*.py"))]


def imported(path: Path) -> set[str]:
    """Every module a file imports, at the top or inside a function."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_no_layer_imports_one_above_it(layer):
    bad = []
    for name, path in modules(layer):
        for module in imported(path):
            if any(module == f or module.startswith(f + ".") for f in FORBIDDEN[layer]):
                bad.append(f"{path.relative_to(ROOT)} imports {module}")
    assert not bad, "\n".join(bad)


# "fork" is also the live command's name (vLLM's BlockSpaceManager.fork): the TUI's key binding, the
# engine process's call names and the help glossary say it as an operation, not as an event kind.
OPERATION_NAMES = {("blockviz/tui/keys.py", "fork"), ("blockviz/session/engine_process.py", "fork"),
                   ("blockviz/tui/widgets/screens.py", "fork")}


def test_event_names_are_spelled_only_in_the_event_module():
    """Consumers dispatch on an event's record class; a kind name as a string appears only in
    engine/events.py (trace files keep their "type" field, read and written there)."""
    names = set(EVENT_TYPES)
    found = []
    for _, path in modules("blockviz"):
        where = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names
                    and (where, node.value) not in OPERATION_NAMES):
                found.append(f"{where}:{node.lineno}: {node.value!r}")
    assert not found, "\n".join(found)


def test_only_the_engine_session_steps_an_engine():
    steppers = []
    for _, path in modules("blockviz"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "step"
                    and isinstance(node.func.value, (ast.Name, ast.Attribute))
                    and "engine" in ast.unparse(node.func.value)):
                steppers.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert {s.split(":")[0] for s in steppers} == {"blockviz/session/engine_session.py"}, steppers


def test_the_reducer_state_is_built_in_one_place():
    """ReducerState.from_header turns a run's header into an empty state (v0 or v1 pools): every
    timeline, insight, explanation and check in blockviz/ gets its state there."""
    builders = []
    for _, path in modules("blockviz"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "ReducerState":
                builders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert {b.split(":")[0] for b in builders} <= {"blockviz/model/reducer.py"}, builders


def _classes(path: Path) -> list[ast.ClassDef]:
    return [node for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ClassDef)]


def test_the_engine_drivers_live_in_the_session_layer():
    """The drivers are the session layer's: EngineDriver (engine_driver.py, stepping a session for a
    live view), EngineBridge (engine_thread.py, on a worker thread) and ProcessBridge
    (engine_process.py, in a child process). The front ends blockviz/tui and blockviz/jupyter step
    no session or engine and take no session's events themselves: they call a driver; a class there
    named as a driver (…Driver, …Bridge) is the UI's Protocol or a subclass of the session's
    EngineDriver (the notebook's PlayerDriver), never a second loop around EngineSession.step."""
    session = ROOT / "blockviz" / "session"
    defined = {path.name: {c.name for c in _classes(path)} for path in session.glob("engine_*.py")}
    assert {"EngineDriver", "Listener"} <= defined.get("engine_driver.py", set()), defined
    assert "EngineBridge" in defined.get("engine_thread.py", set()), defined
    assert "ProcessBridge" in defined.get("engine_process.py", set()), defined

    found = []
    for package in ("blockviz.tui", "blockviz.jupyter"):
        for _, path in modules(package):
            where = path.relative_to(ROOT)
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr in ("step", "take_events")
                        and any(word in ast.unparse(node.func.value) for word in ("session", "engine"))):
                    found.append(f"{where}:{node.lineno} calls {ast.unparse(node.func)}()")
            for cls in _classes(path):
                bases = {ast.unparse(base) for base in cls.bases}
                if cls.name.endswith(("Driver", "Bridge")) and not bases & {"Protocol", "EngineDriver"}:
                    found.append(f"{where}:{cls.lineno} defines the driver {cls.name}")
    assert not found, "\n".join(found)


def test_no_module_imports_a_private_name_from_the_cli():
    """blockviz/cli.py builds the parser and dispatches (it defines build_parser and main, nothing
    else); the option parsers the commands share are blockviz/commands/options.py's, under public
    names. No module of blockviz/ or tests/ imports a `_`-prefixed name from blockviz.cli or reads
    one off it (`cli._positive`)."""
    found = []
    paths = [path for _, path in modules("blockviz")] + sorted((ROOT / "tests").rglob("*.py"))
    for path in paths:
        where = path.relative_to(ROOT)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "blockviz.cli":
                found += [f"{where}:{node.lineno} imports {a.name}" for a in node.names if a.name.startswith("_")]
            elif (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and ast.unparse(node.value) in ("cli", "blockviz.cli")):
                found.append(f"{where}:{node.lineno} reads {ast.unparse(node)}")
    assert not found, "\n".join(found)
    cli = ast.parse((ROOT / "blockviz" / "cli.py").read_text())
    defined = {node.name for node in cli.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    assert defined == {"build_parser", "main"}, defined


def _imports_textual(path: Path) -> bool:
    return any(module == "textual" or module.startswith("textual.") for module in imported(path))


def test_the_tuis_modules_without_textual_run_no_engine():
    """A module of blockviz/tui that imports no textual (the playback controller, the Bridge
    protocol, styles, the live actions' mixin) is the TUI's policy, not an engine's driver: it
    starts no thread or process and builds no engine session (threading, multiprocessing, torch
    and blockviz.session.engine_session are the session layer's drivers' to import)."""
    engine_room = ("threading", "multiprocessing", "torch", "blockviz.session.engine_session")
    found = []
    for _, path in modules("blockviz.tui"):
        if _imports_textual(path):
            continue
        for module in imported(path):
            if any(module == name or module.startswith(name + ".") for name in engine_room):
                found.append(f"{path.relative_to(ROOT)} imports {module} and no textual")
    assert not found, "\n".join(found)
