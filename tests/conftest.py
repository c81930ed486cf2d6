"""Tests run on the CPU; Triton kernels run under its interpreter, which must be switched on before
triton is first imported. H3BENCH_TEST_DEVICE=cuda runs the device-parametrised tests on a GPU."""
import os

DEVICE = os.environ.get("H3BENCH_TEST_DEVICE", "cpu")
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture
def device() -> torch.device:
    return torch.device(DEVICE)


@pytest.fixture
def invoke(monkeypatch):
    """Run the `h3bench` program (reports.cli: every command) in this process; returns (result, text)."""
    from rich.console import Console
    from typer.testing import CliRunner

    from harness import cli
    from reports.cli import app

    # error messages go to a console made at import time: make it wide so messages stay on one line
    monkeypatch.setattr(cli, "err", Console(stderr=True, width=1000))
    runner = CliRunner()

    def call(*args: str):
        result = runner.invoke(app, list(args), env={"COLUMNS": "1000"})
        return result, " ".join(result.output.split())
    return call
