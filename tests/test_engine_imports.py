"""The engine never imports a UI; importing it pulls in neither torch nor any view library."""

import subprocess
import sys


def test_engine_imports_no_ui_and_no_torch():
    code = (
        "import sys, engine, engine.block_manager, engine.events, engine.invariants\n"
        "bad = [m for m in ('textual', 'rich', 'ipywidgets', 'blockviz', 'torch') if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
