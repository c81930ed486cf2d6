"""tools/bench_memory_ops.py: its arguments, its refusal to time on a CPU, and a dry run of one op."""
import json

import pytest
import torch

from tests.helpers import needs_interpreter
from tools import bench_memory_ops as bench


def test_arguments():
    args = bench.parse_args(["--out", "x.json"])
    assert args.ops == list(bench.OPS) and args.sizes is None and (args.warmup, args.reps) == (20, 100)
    args = bench.parse_args(["--out", "x.json", "--ops", "gate_residual,adaln_row_gather,gate_residual",
                             "--sizes", "4097,32768", "--reps", "10", "--warmup", "0"])
    assert args.ops == ["gate_residual", "adaln_row_gather"] and args.sizes == [4097, 32768]
    assert (args.warmup, args.reps) == (0, 10)


def test_help_names_the_dry_run(capsys):
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(["--help"])
    assert exc.value.code == 0 and "--dry-run" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [
    [],                                                   # --out is required
    ["--out", "x.json", "--ops", "norm_modulate"],        # not one of the four
    ["--out", "x.json", "--sizes", "0"],
    ["--out", "x.json", "--sizes", "a,b"],
    ["--out", "x.json", "--reps", "0"],
])
def test_bad_arguments_exit(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(argv)
    assert exc.value.code == 2


def test_refuses_without_a_gpu(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        bench.main(["--out", str(tmp_path / "x.json")])
    assert not (tmp_path / "x.json").exists()


def test_every_op_has_its_default_row():
    """Every op times its default launch configuration; a kernel without variants under trial (each of
    them now) has that one row."""
    from h3bench.harness.config import load_config

    for op in bench.OPS:
        assert list(bench.variants(op, load_config(op).inputs)) == ["default"], op


@needs_interpreter("--dry-run checks the script on the CPU; on a GPU the bench itself runs")
def test_dry_run_of_one_op(tmp_path):
    out = tmp_path / "bench.json"
    report = bench.main(["--dry-run", "--ops", "timestep_sinusoid", "--sizes", "3", "--out", str(out)])
    written = json.loads(out.read_text())
    assert written["dry_run"] is True and written["bandwidth_gbps"] > 0
    rows = written["ops"]["timestep_sinusoid"]["sizes"]["3"]["rows"]
    assert rows["h3bench_triton[default]"]["fwd_err"] <= 1e-7
    assert rows["torch_diffusers"]["fwd_err"] <= 1e-6
    assert "unavailable" in rows["sglang"]  # a CUDA-only row
    assert report["ops"]["timestep_sinusoid"]["sizes"]["3"]["floor_us"]["fwd"] > 0
