"""The GEMM tools' own logic on the CPU: tools/bench_gemm.py (its config notation, a dry run, its table),
tools/compile_gemm.py (the launches it compiles) and tools/gemm_kernel_times.py (its arguments)."""
import json

import pytest
import torch

from h3bench.kernels import adaln_projection_kernel as AP
from h3bench.kernels import gemm
from h3bench.kernels import timestep_mlp_kernel as TM
from h3bench.kernels.common import INTERPRETED


def _every_default_config():
    for configs in (TM.DEFAULT, AP.DEFAULT):
        for tiers in vars(configs).values():
            for _, cfg in tiers:
                yield cfg


def test_bench_gemm_reads_back_every_default_config_from_its_short_form():
    from tools.bench_gemm import parse_candidate, parse_config
    for cfg in _every_default_config():
        assert parse_config(cfg.short()) == cfg, cfg.short()
    assert parse_candidate("ada_dw:2048:128x256x64/w8/s3/P/TMA/TS") == (
        "ada_dw", 2048, gemm.LaunchConfig(128, 256, 64, num_warps=8, persistent=True, tma=True, tma_store=True))
    for bad, match in (("fwd2:1:64x16", "starts with"), ("fwd2:1:64x16x32/q3", "unknown part"),
                       ("fwd3:1:64x16x32", "unknown kernel"), ("fwd2:64x16x32", "KERNEL:T:CONFIG"),
                       ("fwd2:0:64x16x32", ">= 1"), ("fwd2:1:48x16x32", "power of two")):
        with pytest.raises(ValueError, match=match):
            parse_candidate(bad)


def test_bench_gemm_help_and_bad_arguments(capsys):
    from tools import bench_gemm
    with pytest.raises(SystemExit) as exc:
        bench_gemm.parse_args(["--help"])
    assert exc.value.code == 0 and "--candidate" in capsys.readouterr().out
    for argv in (["--out", "x.json", "--ops", "norm_modulate"], ["--out", "x.json", "--candidate", "fwd2:1:1x"], []):
        with pytest.raises(SystemExit) as exc:
            bench_gemm.parse_args(argv)
        assert exc.value.code == 2


@pytest.mark.skipif(not INTERPRETED, reason="the dry run is the CPU under the interpreter; on a GPU the bench itself "
                                            "runs (python -m tools.bench_gemm)")
def test_bench_gemm_dry_run_checks_the_op_and_a_candidate(tmp_path):
    from tools import bench_gemm
    out = tmp_path / "bench.json"
    report = bench_gemm.main(["--dry-run", "--out", str(out), "--ops", "timestep_mlp", "--rows", "1",
                              "--candidate", "dw1:3:32x64x16/w4/s2", "--candidate", "fwd2:1:32x16x32/w2/s3/fp16x3/L/S"])
    written = json.loads(out.read_text())
    assert written["dry_run"] is True and written["copy_gbps"] > 0
    section = written["timestep_mlp"]
    assert section["invariance"]["all_equal"] is True and all(section["repeat"].values())
    assert max(section["rows"]["1"]["ours_err"].values()) < 1e-6
    records = {(r["kernel"], r["config"]): r for r in report["candidates"]}
    # the FMA chains whatever the tile: the interpreter's fixed-order dot gives the default's bits
    assert records[("dw1", "32x64x16/w4/s2")]["bitwise_equal_default"] is True
    swapped = records[("fwd2", "32x16x32/w2/s3/fp16x3/L/S")]
    assert swapped["row_alone_equal"] is True and swapped["err"] < 1e-6 and "us" in swapped
    assert sum(r["default"] for r in report["candidates"]) == 2   # one reference per (kernel, T)


def test_bench_gemm_table_shows_a_failed_section_and_the_others():
    """tools/bench_gemm.py keeps a section's exception as {"error", "trace"} (`guard`); the table printed at
    the end of a GPU run names it beside the sections that ran, instead of failing on it after the JSON."""
    from tools import bench_gemm
    row = {"kernel": "ada_fwd", "rows": 1, "config": "128x256x64/w8/s3/P/TMA/TS/g16", "us": {"stream_us": [10.0, 9.0]},
           "bitwise_equal_default": True, "row_alone_equal": True, "default": False}
    text = bench_gemm.table({"copy_gbps": 4200.0, "adaln_projection": {"error": "RuntimeError: boom", "trace": "..."},
                             "candidates": [row]})
    assert "adaln_projection: ERROR RuntimeError: boom" in text
    assert "128x256x64/w8/s3/P/TMA/TS/g16" in text and "T1:9.0" in text and "=default True" in text
    assert "alone True" in text and "== timestep_mlp" not in text   # no timestep_mlp section ran
    failed = bench_gemm.table({"copy_gbps": 1.0, "candidates": {"error": "ValueError: x", "trace": ""}})
    assert "candidates: ERROR ValueError: x" in failed


G, R, C, S, TMA = "_gemm_kernel", "_rowmax_kernel", "_colsum_kernel", "_silu_cast_kernel", "_gemm_tma_kernel"


@pytest.mark.parametrize("op,rows,nograd,train", [
    # GEMM1, GEMM2; GEMM1, the maxima of h and W2, GEMM2, dy's maxima, dW2, db2, dz1, dx, dW1, db1
    ("timestep_mlp", 2, [G, G], [G, R, G, R, G, C, G, G, G, C]),
    # silu_cast, forward, dtemb, dW: dW through TMA at every T, the forward and dtemb from TMA_FROM rows
    ("adaln_projection", 1, [S, G], [S, G, G, TMA]),
    ("adaln_projection", 2048, [S, TMA], [S, TMA, TMA, TMA]),
    # the projection's silu_cast (then torch's F.linear), its backward's two GEMMs
    ("final_adaln_out", 3, [S], [S, G, G]),
])
def test_compile_gemm_records_the_default_launches(monkeypatch, op, rows, nograd, train):
    """tools/compile_gemm.py runs each op's default path with the GPU's config sets on CPU tensors, every
    launch through kernels/gemm.py recorded instead of made: the kernels, in order."""
    from tools import compile_gemm
    monkeypatch.setattr(AP, "configs", lambda: AP.DEFAULT)
    monkeypatch.setattr(TM, "configs", lambda: TM.DEFAULT)
    found = {step: [kernel.fn.__name__ for kernel, *_ in compile_gemm.recorded(fn)]
             for step, fn in compile_gemm.launches(op, rows, small=True)}   # narrow widths: the same launches
    assert found == {"nograd": nograd, "train": train}


def test_compile_gemm_hashes_name_the_parameters():
    """`--hash`'s second hash reads a constant-bank operand by the parameter it holds: the same instructions
    with the parameters at other offsets hash alike; another instruction does not."""
    from tools.compile_gemm import sass_hashes

    def elf(offsets):
        return "".join(f"Ordinal : 0x{i:x} Offset : 0x{off:x} Size : 0x4\n" for i, off in enumerate(offsets))
    line = "        /*{:04x}*/   {} ;   /* 0x000000000000 */"
    first = "\n".join([line.format(0, "LDC R2, c[0x0][0x214]"), line.format(16, "IADD R3, R2, 0x1")])
    moved = "\n".join([line.format(0, "LDC R2, c[0x0][0x21c]"), line.format(16, "IADD R3, R2, 0x1")])
    other = "\n".join([line.format(0, "LDC R2, c[0x0][0x21c]"), line.format(16, "IADD R3, R2, 0x2")])
    a = sass_hashes(first, elf([0, 4]), ["A", "M"])
    b = sass_hashes(moved, elf([0, 4, 0xc]), ["A", "WLO", "M"])
    c = sass_hashes(other, elf([0, 4, 0xc]), ["A", "WLO", "M"])
    assert a[0] != b[0] and a[1] == b[1] and c[1] != b[1]


def test_tools_answer_help(capsys):
    from tools import compile_gemm, gemm_kernel_times
    for tool in (compile_gemm, gemm_kernel_times):
        with pytest.raises(SystemExit) as exc:
            tool.main(["--help"])
        assert exc.value.code == 0 and "--rows" in capsys.readouterr().out


def test_gemm_kernel_times_refuses_unknown_rows_and_runs_only_on_a_gpu(monkeypatch):
    from tools import gemm_kernel_times
    with pytest.raises(SystemExit) as exc:
        gemm_kernel_times.main(["--rows", "1", "--configs", "TF32X3"])
    assert exc.value.code == 2
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        gemm_kernel_times.main(["--rows", "1"])
