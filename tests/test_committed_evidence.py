"""The committed evidence (reports/evidence/) keeps to the contract and says what it claims: each file
validates, names the GPU it ran on and the commit it ran, and norm_modulate's H200 file has every seed
row measured (issue 9). The B200 copies validate too, so the verdict comparisons can be rerun."""
from __future__ import annotations

from pathlib import Path

import pytest

from h3bench.harness.schema import RowResult, load

EVIDENCE = Path(__file__).resolve().parent.parent / "reports" / "evidence"
H200 = sorted(EVIDENCE.glob("*_h200.json"))
B200 = sorted((EVIDENCE / "b200").glob("*.json"))
NOT_RUN_BY_H3BENCH = {"sweep_norm_modulate_h200.json"}   # the sweep tool's own format


def test_there_is_evidence():
    assert len(H200) >= 7 and len(B200) == 7


@pytest.mark.parametrize("path", [p for p in H200 if p.name not in NOT_RUN_BY_H3BENCH], ids=lambda p: p.name)
def test_h200_file_validates_and_names_its_gpu_and_commit(path):
    evidence = load(path)
    assert evidence.environment.gpu == "NVIDIA H200"
    assert evidence.h3bench_commit and evidence.h3bench_commit != "unknown"
    assert not evidence.quick


@pytest.mark.parametrize("path", B200, ids=lambda p: p.name)
def test_b200_copy_validates(path):
    assert load(path).environment.gpu == "NVIDIA B200"


def test_norm_modulate_h200_has_all_ten_rows_measured():
    evidence = load(EVIDENCE / "norm_modulate_h200.json")
    rows = evidence.results["plain"]
    assert len(rows) == 10 and all(isinstance(r, RowResult) for r in rows.values()), \
        {k: getattr(r, "unavailable", None) for k, r in rows.items()}
    assert "rl-kernel-h3" in evidence.rl_kernel_commit


SEVEN = ("norm_modulate", "timestep_sinusoid", "timestep_mlp", "adaln_projection", "adaln_row_gather",
         "gate_residual", "final_adaln_out")


def _all_run_file(op: str) -> Path:
    """Where the `--op all` run's file of `op` is: current, or under history/21b136e/ where a later
    per-op run of changed kernels replaced it."""
    current = EVIDENCE / f"{op}_h200.json"
    return current if "--op all" in (load(current).command or "") else EVIDENCE / "history" / "21b136e" / current.name


def test_every_op_has_full_plan_h200_evidence_from_one_run():
    """Issue 10: the seven ops' files of one `h3bench run --op all` (one commit) are all kept."""
    files = {op: load(_all_run_file(op)) for op in SEVEN}
    assert len({e.h3bench_commit for e in files.values()}) == 1
    assert all(e.command and "--op all" in e.command for e in files.values())


def test_current_files_are_full_plan_runs_with_our_row_measured():
    """Every op's current file is a full-plan run (mode plain) in which our row and every row the RFC
    compares are measured or unavailable with a reason; adaln_projection (out of memory at 86fad52, kept
    under defects/) has both its rows measured."""
    for op in SEVEN:
        evidence = load(EVIDENCE / f"{op}_h200.json")
        assert evidence.op == op and not evidence.quick
        rows = evidence.results["plain"]
        assert isinstance(rows.get("h3bench_triton"), RowResult), op
        for name, row in rows.items():
            assert isinstance(row, RowResult) or getattr(row, "unavailable", None), (op, name)
    rows = load(EVIDENCE / "adaln_projection_h200.json").results["plain"]
    assert set(rows) == {"diffusers[plain]", "h3bench_triton"}
    assert all(isinstance(r, RowResult) for r in rows.values())


@pytest.mark.parametrize("op", ["timestep_mlp", "adaln_projection"])
def test_gemm_ops_have_every_mode(op):
    """Issue 12: each of the RFC's seven modes is measured or unavailable with its reason."""
    modes = load(EVIDENCE / f"{op}_modes_h200.json").results
    assert set(modes) == {"plain", "vllm", "sglang", "sglang_ieee", "megatron_te_native", "megatron_triton",
                          "megatron_triton_ieee"}
