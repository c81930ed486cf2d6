"""Ctrl-C during `h3bench run`: one line on stderr saying what it stopped and that nothing was written for it,
exit 130, and nothing the run made for that op left behind (no evidence file, no library log, no folder it
made); a folder that was there stays, and so do the files of ops that finished before."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

from h3bench.harness import runner, schema
from tests.helpers import require_prior_art

SMALL = ("run", "--op", "norm_modulate", "--device", "cpu", "--quick", "--set", "hidden=16",
         "--adapters", "torch_rms_norm", "--no-render")
STOPPED = "interrupted while running norm_modulate; nothing was written"


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


def test_an_interrupted_run_says_so_and_leaves_nothing_it_made(invoke, monkeypatch, tmp_path):
    monkeypatch.setattr(runner, "measure_control", _interrupt)   # the op's rows measured, its file not written
    kept = tmp_path / "kept"
    kept.mkdir()
    for out in (tmp_path / "new" / "deeper" / "x.json", kept / "x.json"):
        result, text = invoke(*SMALL, "--out", str(out))
        assert result.exit_code == 130, text
        assert result.output.strip().splitlines()[-1] == STOPPED, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"] and list(kept.iterdir()) == []


def test_an_interrupted_run_of_several_ops_keeps_the_finished_ones(invoke, monkeypatch, tmp_path):
    finished = schema.load(require_prior_art())

    def first_finishes(request, observer=None):
        if request.config.op != "timestep_sinusoid":
            raise KeyboardInterrupt
        schema.save(finished, request.out)
        return finished

    monkeypatch.setattr(runner, "run", first_finishes)
    folder = tmp_path / "all"
    result, text = invoke("run", "--op", "timestep_sinusoid,gate_residual,final_adaln_out", "--device", "cpu",
                          "--quick", "--no-control", "--no-render", "--out", str(folder))
    assert result.exit_code == 130, text
    assert result.output.strip().splitlines()[-1] == (
        f"interrupted while running gate_residual; nothing was written for it (the finished ops' files stay: "
        f"{folder / 'timestep_sinusoid.json'})")
    assert [p.name for p in folder.iterdir()] == ["timestep_sinusoid.json"]


# The child stops in the run's last step before its file is written, says so on stderr, and waits for a signal.
CHILD = """
import signal, sys
from h3bench.harness import runner

def wait_for_the_signal(*args, **kwargs):
    print("READY", file=sys.stderr, flush=True)
    signal.pause()

runner.measure_control = wait_for_the_signal
from h3bench.cli import main
sys.argv = ["h3bench", *sys.argv[1:]]
main()
"""


def test_sigint_to_a_running_program(tmp_path):
    """A real SIGINT, as a terminal's Ctrl-C sends: the default out folder (runs/) is not left behind."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, *SMALL, "--quiet"], cwd=tmp_path,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "TRITON_INTERPRET": "1"})
    try:
        said = []
        for line in child.stderr:
            said.append(line)
            if line.strip() == "READY":
                break
        assert (tmp_path / "runs").is_dir(), "".join(said)   # the run had made its folder
        child.send_signal(signal.SIGINT)
        _, rest = child.communicate(timeout=120)
    finally:
        child.kill()
    assert child.returncode == 130, "".join(said) + rest
    assert rest.strip().splitlines() == [STOPPED]
    assert list(tmp_path.iterdir()) == []
