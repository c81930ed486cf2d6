"""Every tool in tools/ answers --help (its arguments, exit 0) on any machine: a tool that no longer imports
after a change in the package fails here, not on the GPU machine."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOLS = sorted(p.stem for p in (ROOT / "tools").glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("tool", TOOLS)
def test_tool_answers_help(tool):
    env = dict(os.environ, TRITON_INTERPRET="1")  # the child's: GPU tools import their kernels on a CPU too
    done = subprocess.run([sys.executable, "-m", f"tools.{tool}", "--help"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "usage:" in done.stdout.lower(), done.stderr[-2000:]
