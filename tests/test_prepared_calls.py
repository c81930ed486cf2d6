"""The GPU calls prepared for the next session (reports/evidence/README.md, "What the next GPU session runs":
each `logs/<call>/cmd.sh` named there) still fit the code they will run against: every pytest selection picks
tests, every `tools` option exists, every variant or config-set name resolves, every run_h200.sh step exists.
A stale name found on the GPU costs a call's device time; found here it costs a CI run."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EVIDENCE = ROOT / "reports" / "evidence"


def _pending() -> list[str]:
    text = (EVIDENCE / "README.md").read_text()
    section = text.split("## What the next GPU session runs", 1)[1].split("\n## ", 1)[0]
    return sorted(set(re.findall(r"`logs/(session\d+-call-\d+)/cmd\.sh`", section)))


def _commands(call: str) -> list[str]:
    """cmd.sh's lines with continuations joined, comments dropped."""
    text = (EVIDENCE / "logs" / call / "cmd.sh").read_text().replace("\\\n", " ")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def _run(*args: str) -> str:
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    return done.stdout + done.stderr


def test_the_next_session_has_prepared_calls_and_none_has_run():
    pending = _pending()
    assert pending, "the README names no prepared call"
    for call in pending:
        assert (EVIDENCE / "logs" / call / "cmd.sh").is_file(), call
        assert not (EVIDENCE / "logs" / call / "COMMIT.txt").exists(), f"{call} has run: take it off the list"


@pytest.mark.parametrize("call", _pending())
def test_a_prepared_call_names_only_what_exists(call):
    from h3bench.kernels import adaln_projection as AP
    from h3bench.kernels import timestep_mlp as TM
    from tools.sweep_norm_modulate import _variant

    lines = _commands(call)
    assignments = dict(re.findall(r"^(\w+)=(\S+)$", "\n".join(lines), flags=re.M))
    checked = 0
    for line in lines:
        line = re.sub(r"\$(\w+)|\$\{(\w+)\}", lambda m: assignments.get(m.group(1) or m.group(2), m.group(0)), line)
        if "-m pytest" in line:
            paths = re.findall(r"(tests/\S+\.py)", line)
            select = re.search(r'-k "([^"]+)"', line)
            out = _run("-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *paths,
                       *(["-k", select.group(1)] if select else []))
            found = re.search(r"(\d+)(?:/\d+)? tests? collected", out)
            assert found and int(found.group(1)) > 0, f"{call}: {' '.join(paths)} -k {select and select.group(1)}: {out[-500:]}"
            checked += 1
        for module in re.findall(r"-m (tools\.\w+)", line):
            help_text = _run("-m", module, "--help")
            for flag in set(re.findall(r"\s(--[a-z][a-z0-9-]*)", line)):
                assert flag in help_text, f"{call}: {module} has no {flag}"
            checked += 1
        hidden = int((re.search(r"--hidden (\d+)", line) or re.search(r"(5376)", "5376")).group(1))
        for names in re.findall(r"--variants \"?([\w.,-]+)\"?", line):
            for name in filter(None, names.split(",")):
                if name != "default":
                    _variant(name, hidden)   # raises on an unknown preset
                    checked += 1
        for flag, module in (("--ada-variants", AP), ("--mlp-variants", TM)):
            for names in re.findall(flag + r" '?([\w,]*)'?", line):
                for name in filter(None, names.split(",")):
                    assert hasattr(module, name), f"{call}: {module.__name__} has no config set {name}"
                    checked += 1
        for step in re.findall(r"run_h200\.sh (\S+)", line):
            assert f"step_{step}()" in (EVIDENCE / "run_h200.sh").read_text(), f"{call}: run_h200.sh has no {step}"
            checked += 1
    assert checked, f"{call}: nothing to check (the parser no longer reads this cmd.sh)"
