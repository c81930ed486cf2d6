"""`h3bench -h` and every `h3bench CMD -h` at 80 columns, piped: nothing cut, every option whole; and the
commands that need no torch (`--help`, `report`) do not import it."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from h3bench.cli import SHORT_HELP, app

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = typer.main.get_command(app).commands


def _help(*args: str) -> str:
    result = CliRunner().invoke(app, [*args, "-h"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    return result.output


def _assert_readable(text: str) -> None:
    assert "…" not in text and "<bool>" not in text, text
    assert max(len(line) for line in text.splitlines()) <= 80, text


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_commands_help_names_every_option_whole_at_80_columns(command):
    text = _help(command)
    _assert_readable(text)
    options = [o for p in COMMANDS[command].params if not getattr(p, "hidden", False)
               for o in (*p.opts, *p.secondary_opts) if o.startswith("-")]
    assert options
    for option in options:
        assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text), (option, text)


def test_the_programs_help_lists_each_command_with_its_whole_line():
    text = _help()
    _assert_readable(text)
    listed = text[text.index("Commands:"):]
    for name, line in SHORT_HELP.items():
        assert re.search(rf"^  {name}\s+{re.escape(line)}$", listed, re.M), (name, listed)
    assert not re.search(r"\.\.\.$", listed, re.M)   # click's cut of a long first sentence


def test_run_help_gives_each_option_its_argument_and_default():
    text = _help("run")
    for shown in ("--op NAME[,NAME]", "--set KEY=VALUE", "--adapter [NAME=]MODULE:ATTR",
                  "--require-invariant ROW[,ROW]|all", "--out FILE|DIR"):
        assert shown in text, shown
    flat = " ".join(text.split())
    assert "[default: (configs/<op>/default.toml, and quick.toml for the quick plan)]" in flat


def _imports_torch(*args: str) -> bool:
    code = ("import sys\nfrom h3bench.cli import main\nsys.argv = ['h3bench', *sys.argv[1:]]\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\nprint('torch' in sys.modules, file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)
    return done.stderr.strip().splitlines()[-1] == "True"


def test_help_does_not_import_torch():
    """Help is instant. (Reading an evidence file does import torch: a probe's record is decoded by its
    specification, harness/probes/registry.py, whose module runs on torch.)"""
    assert not _imports_torch("--help")
    assert not _imports_torch("run", "--help")
    assert not _imports_torch("model", "--help")
