"""gate_residual (docs/operators.md, gate_residual): inputs, float64 reference, CPU rows, the RFC's counts, floors, CUDA-only row.

`out = res + gate[idx] * y`, with two per-row gradients (res, y) and the gate's parameter gradient.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from h3bench.adapters.gate_residual.diffusers import ADAPTER as DIFFUSERS
from h3bench.adapters.gate_residual.rl_kernel import ADAPTER as RL_KERNEL
from h3bench.adapters.gate_residual.torch_addcmul import ADAPTER as TORCH_ADDCMUL
from h3bench.harness.adapter import Loaded, from_function
from h3bench.harness.config import ConfigError, load_config
from h3bench.harness.execute import as_bits
from h3bench.harness.ops import get_op
from h3bench.harness.ops.gate_residual import GATE_CHUNK, PARAM_SEED, GateResidualParams
from h3bench.harness.probes.accuracy_latency import rel_err
from h3bench.harness.runner import RunRequest, run
from h3bench.harness.schema import UnavailableRow
from tests.helpers import (CPU, CUDA, RL_KERNEL_ON_CPU, GradBumpOnEvenBatches, against_reference,
                           assert_accuracy_within, assert_clean_quick_verdict, assert_evidence_round_trips,
                           assert_no_differences, even_sweep_comparisons, install, odd_sub_batches,
                           rl_kernel_reasons, run_default_plan_counts, within)
from tests.helpers import no_rl_engine  # noqa: F401 (a fixture: pytest finds it in this module)

OP = get_op("gate_residual")
DEFAULT = load_config("gate_residual")
QUICK = load_config("gate_residual", quick=True)
GRADS = ("res", "y", "gate")
U = 2 ** -8  # bf16 unit roundoff: 8 significant bits, round to nearest
BUMP = 1 + 2 ** -5  # larger than a bf16 ulp (<= 2^-7 relative): changes the bits of every non-zero


def layout(rows: int, seed: int) -> torch.Tensor:
    """The RFC's layout, written out again: tags first, then timesteps; the first rows get tags 0, 1, 2."""
    gen = torch.Generator().manual_seed(seed)
    tags = torch.randint(0, 3, (rows,), generator=gen)
    steps = torch.randint(0, 3, (rows,), generator=gen)
    tags[:min(rows, 3)] = torch.arange(min(rows, 3))
    return steps * 3 + tags


# --- parameters and configs ---------------------------------------------------------------------------------

def test_configs_hold_the_model_constants():
    assert DEFAULT.inputs == GateResidualParams(hidden=5376, timesteps=3, modalities=3, chunks=6, dtype="bfloat16")
    assert DEFAULT.plans == "token" and DEFAULT.quick is False and OP.plan_set == "token"
    assert QUICK.inputs == dataclasses.replace(DEFAULT.inputs, hidden=64)
    assert QUICK.plans == "quick" and QUICK.quick is True


@pytest.mark.parametrize("override,message", [("hidden=0", "hidden must be >= 1"),
                                              ("modalities=0", "modalities must be >= 1"),
                                              ("chunks=2", "chunks must be > 2"),
                                              ("dtype=int8", "dtype must be one of")])
def test_bad_parameters_are_config_errors(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config("gate_residual", overrides=(override,))


def test_declarations():
    # the RFC's op and script call order: H3GateResidualCudaOp()(residual, y, gate, index)
    assert OP.input_names == ("res", "y", "gate", "idx")
    assert OP.row_inputs == ("res", "y", "idx") and OP.row_grads == ("res", "y") and OP.param_grads == ("gate",)
    assert OP.outputs == ("out",)


# --- inputs ---------------------------------------------------------------------------------------------

def test_inputs_shapes_dtypes_strides_and_layout():
    params, rows = QUICK.inputs, 50
    inputs = OP.make_inputs(params, rows, 3, CPU)
    assert list(inputs.tensors) == ["res", "y", "gate", "idx"] and inputs.row_names == ("res", "y", "idx")
    res, y, gate, idx = inputs.tensors.values()
    for t in (res, y):
        assert t.shape == (rows, 64) and t.dtype == torch.bfloat16 and t.stride() == (64, 1)
    # the gate is the gate_msa column block of a [9, 6H] AdaLN table: a strided view, as in the model
    assert gate.shape == (9, 64) and gate.dtype == torch.bfloat16 and gate.stride() == (6 * 64, 1)
    assert not gate.is_contiguous()
    assert idx.shape == (rows,) and idx.dtype == torch.int64
    assert all(t.device == CPU for t in inputs.tensors.values())
    assert 0 <= int(idx.min()) and int(idx.max()) < 9
    assert (idx[:3] % 3).tolist() == [0, 1, 2]  # the first rows' tags
    assert torch.equal(idx, layout(rows, 3))
    # the draws: res then y from the case seed; the table, 0.1 randn, from the fixed parameter seed
    gen = torch.Generator().manual_seed(3)
    assert torch.equal(as_bits(res), as_bits(torch.randn(rows, 64, generator=gen).to(torch.bfloat16)))
    assert torch.equal(as_bits(y), as_bits(torch.randn(rows, 64, generator=gen).to(torch.bfloat16)))
    table = (torch.randn(9, 6 * 64, generator=torch.Generator().manual_seed(PARAM_SEED)) * 0.1).to(torch.bfloat16)
    assert torch.equal(as_bits(gate), as_bits(table[:, GATE_CHUNK * 64:(GATE_CHUNK + 1) * 64]))


def test_inputs_are_seeded_and_the_gate_is_the_same_for_every_case():
    params = QUICK.inputs
    a, again, b = (OP.make_inputs(params, 40, seed, CPU) for seed in (3, 3, 4))
    for name in OP.input_names:
        assert torch.equal(as_bits(a.tensors[name]), as_bits(again.tensors[name])), name
    assert torch.equal(as_bits(a.tensors["gate"]), as_bits(b.tensors["gate"]))
    for name in ("res", "y", "idx"):
        assert not torch.equal(a.tensors[name], b.tensors[name]), name
    index = torch.tensor([5, 1, 7])
    sub = a.select_rows(index)
    assert sub.tensors["gate"] is a.tensors["gate"]
    assert all(torch.equal(sub.tensors[n], a.tensors[n][index]) for n in ("res", "y", "idx"))


def test_grad_outs():
    grads = OP.make_grad_outs(QUICK.inputs, 10, 9, CPU)
    expected = torch.randn(10, 64, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    assert len(grads) == 1 and torch.equal(as_bits(grads[0]), as_bits(expected))


# --- the float64 reference ------------------------------------------------------------------------------

def tiny_case():
    params = dataclasses.replace(QUICK.inputs, hidden=3)
    return params, OP.make_inputs(params, 8, 5, CPU), OP.make_grad_outs(params, 8, 9, CPU)


def test_reference_against_a_hand_computation():
    params, inputs, (g,) = tiny_case()
    res, y, gate, idx = inputs.tensors.values()
    ref = OP.reference(params, inputs, (g,), GRADS, OP.name)
    out = [[0.0] * 3 for _ in range(8)]
    dres = [[0.0] * 3 for _ in range(8)]
    dy = [[0.0] * 3 for _ in range(8)]
    dgate = [[0.0] * 3 for _ in range(9)]
    for r in range(8):
        m = int(idx[r])
        for h in range(3):
            out[r][h] = res[r, h].item() + gate[m, h].item() * y[r, h].item()
            dres[r][h] = g[r, h].item()
            dy[r][h] = g[r, h].item() * gate[m, h].item()
            dgate[m][h] += g[r, h].item() * y[r, h].item()
    f64 = dict(dtype=torch.float64)
    assert ref.outputs[0].dtype == torch.float64
    torch.testing.assert_close(ref.outputs[0], torch.tensor(out, **f64), rtol=1e-15, atol=1e-15)
    for name, expected in (("res", dres), ("y", dy), ("gate", dgate)):
        assert ref.grads[name].dtype == torch.float64
        torch.testing.assert_close(ref.grads[name], torch.tensor(expected, **f64), rtol=1e-14, atol=1e-14)


def test_reference_gradients_subset_and_unknown_variant():
    params, inputs, grad_outs = tiny_case()
    assert set(OP.reference(params, inputs, grad_outs, ("y",), OP.name).grads) == {"y"}
    assert OP.reference(params, inputs, None, GRADS, OP.name).grads == {}
    with pytest.raises(ValueError, match="unknown reference variant 'x'"):
        OP.reference(params, inputs, grad_outs, GRADS, "x")


# --- the CPU rows against the reference -------------------------------------------------------------------

def outcome(adapter, rows):
    return against_reference(OP, QUICK, adapter.load(CPU, QUICK.inputs).fn, adapter.grads, rows)


@pytest.mark.parametrize("rows", QUICK.accuracy.rows)
def test_diffusers_row_matches_the_reference(rows):
    inputs, (g,), out, ref = outcome(DIFFUSERS, rows)
    res, y, gate, idx = (inputs.tensors[n].double() for n in OP.input_names)
    gy = gate[idx.long()] * y
    # Forward: two bf16 roundings, of the product and of the sum, each within u of the rounded value:
    # |err| <= u |g y| + u |out| (first order; the second-order term u^2 |g y| is covered by the 1 + u).
    # Relative to max|ref| this is ~2^-8; the bound is per element, from the data.
    assert within(out.outputs[0], ref.outputs[0], U * (1 + U) * (gy.abs() + ref.outputs[0].abs()))
    assert rel_err(out.outputs[0], ref.outputs[0]) <= 2 * U
    # dres is the upstream gradient itself: exact. dy = bf16(g * gate[idx]): one rounding.
    assert torch.equal(as_bits(out.grads["res"]), as_bits(g))
    assert within(out.grads["y"], ref.grads["y"], U * ref.grads["y"].abs())
    # dgate: index_add of the bf16-rounded products g * y (u |g y| each), summed in fp32 on the CPU and
    # rounded once (u |sum|), plus fp32 summation error (rows * 2^-24 of sum|g y|).
    g_abs_y = torch.zeros(9, 64, dtype=torch.float64).index_add_(0, idx.long(), (g.double() * y).abs())
    bound = (U * (1 + U) + rows * 2 ** -24) * g_abs_y + U * (1 + U) * ref.grads["gate"].abs()
    assert within(out.grads["gate"], ref.grads["gate"], bound)
    assert all(rel_err(out.grads[n], ref.grads[n]) <= 2 * U for n in GRADS)


@pytest.mark.parametrize("rows", QUICK.accuracy.rows)
def test_torch_addcmul_row_matches_the_reference(rows):
    inputs, (g,), out, ref = outcome(TORCH_ADDCMUL, rows)
    # addcmul computes res + g * y in fp32 and rounds once (observed on the CPU): within u of each element.
    # A bf16 product is exact in fp32; the fp32 add is within 2^-24, far below the bf16 rounding.
    assert within(out.outputs[0], ref.outputs[0], (U + 2 ** -23) * ref.outputs[0].abs())
    assert rel_err(out.outputs[0], ref.outputs[0]) <= U
    assert torch.equal(as_bits(out.grads["res"]), as_bits(g))
    assert within(out.grads["y"], ref.grads["y"], U * ref.grads["y"].abs())
    assert all(rel_err(out.grads[n], ref.grads[n]) <= 2 * U for n in GRADS)
    # and it is a different rounding from the diffusers expression's two
    diffusers = outcome(DIFFUSERS, rows)[2]
    assert not torch.equal(as_bits(out.outputs[0]), as_bits(diffusers.outputs[0]))


def test_a_wrong_composition_is_far_outside_the_bounds():
    inputs, _, out, ref = outcome(DIFFUSERS, 130)
    res, y, gate, idx = inputs.tensors.values()
    assert rel_err(res + y, ref.outputs[0]) > 0.5                        # gate left out
    assert rel_err(res + gate[(idx + 1) % 9] * y, ref.outputs[0]) > 0.05  # wrong gate row (gate is 0.1 randn)


# --- the RFC's counts, full default plan at hidden 8 -----------------------------------------------------------

def test_default_plan_counts_with_the_diffusers_row():
    found = run_default_plan_counts("gate_residual", ("hidden=8",), DIFFUSERS)
    # Observed on the CPU: invariant. Forward, dres and dy are elementwise, one row at a time; dgate is the
    # CPU index_add of index_select's backward, which adds in index order, so it repeats run to run. (On
    # CUDA that index_add is an atomic scatter-add: the RFC's reason for rl-kernel's own op.)
    assert_no_differences(found)


# --- memory floors -------------------------------------------------------------------------------------------

def test_floor_bytes_match_operators_md():
    params = DEFAULT.inputs
    row, gate = 5376 * 2, 9 * 5376 * 2  # 10752 bytes; gate 96768 bytes (97 KB)
    assert row == 10752 and round(gate / 1e3) == 97
    for rows in (0, 1, 4097, 131072):
        forward = rows * (3 * row + 8) + gate  # 3 x 10752 (+ index) per row
        assert OP.floor_bytes(params, rows, backward=False) == forward
        # backward: reads dy and y, writes dres, dy (4 x 10752) + the index; the gate again and its gradient
        assert OP.floor_bytes(params, rows, backward=True) == forward + rows * (4 * row + 8) + 2 * gate


# --- the CUDA-only row ---------------------------------------------------------------------------------------

def test_rl_kernel_is_unavailable_on_cpu_with_a_reason():
    assert RL_KERNEL.try_load(CPU, QUICK.inputs) == RL_KERNEL_ON_CPU


def test_rl_kernel_without_rl_engine_or_without_the_op(monkeypatch, no_rl_engine):
    missing, reason = rl_kernel_reasons(monkeypatch, RL_KERNEL, QUICK.inputs)
    assert missing.startswith("ModuleNotFoundError: ") and "rl_engine" in missing
    assert reason.startswith("ImportError: rl_engine has no H3GateResidualCudaOp: tried "
                             "rl_engine.kernels.ops.cuda.h3.gate_residual ("), reason
    assert "rl_engine.backends.cuda.model_specific.minimax_h3.gate_residual (" in reason


@pytest.mark.parametrize("leaf", ["kernels.ops.cuda.h3", "backends.cuda.model_specific.minimax_h3"])
def test_rl_kernel_plumbing_with_a_fake_rl_engine(leaf, monkeypatch, no_rl_engine):
    calls = []

    class H3GateResidualCudaOp:
        def __call__(self, residual, y, gate, index):
            calls.append((residual, y, gate, index))
            return residual + gate.index_select(0, index) * y

    install(monkeypatch, "rl_engine", __version__="0.0.test")
    install(monkeypatch, f"rl_engine.{leaf}.gate_residual", H3GateResidualCudaOp=H3GateResidualCudaOp)
    loaded = RL_KERNEL.try_load(CUDA, QUICK.inputs)  # the device is only looked at; CPU tensors below
    assert isinstance(loaded, Loaded), loaded
    assert loaded.source == f"rl-kernel H3GateResidualCudaOp (rl_engine.{leaf}.gate_residual, rl_engine 0.0.test)"
    inputs = OP.make_inputs(QUICK.inputs, 12, 3, CPU)
    loaded.fn(*inputs.tensors.values())
    assert all(t is inputs.tensors[n] for t, n in zip(calls[-1], OP.input_names))


# --- the quick plan through the runner ----------------------------------------------------------------------------

_HONEST = DIFFUSERS.load(CPU, QUICK.inputs).fn


def planted(*faulty: str):
    def fn(res, y, gate, idx):
        args = {"res": res, "y": y}
        for name in faulty:
            args[name] = GradBumpOnEvenBatches.apply(args[name], BUMP)
        return _HONEST(args["res"], args["y"], gate, idx)
    name = "planted_" + "_".join(faulty)
    return from_function(fn, name=name, op=OP.name, differentiable=GRADS)


def test_quick_plan_through_the_runner():
    rows_in = [DIFFUSERS, TORCH_ADDCMUL, RL_KERNEL, planted("y"), planted("res"), planted("res", "y")]
    evidence = run(RunRequest(config=QUICK, device=CPU, adapters=rows_in, modes=["plain"], out=None,
                              measure_bandwidth=False))
    rows = evidence.results["plain"]
    assert list(rows) == [a.name for a in rows_in]
    assert isinstance(rows["rl_kernel"], UnavailableRow)
    assert rows["rl_kernel"].unavailable == RL_KERNEL_ON_CPU
    for name in ("diffusers", "torch_addcmul"):
        row = rows[name]
        assert_clean_quick_verdict(row, QUICK)
        assert all(c.rowgrad_differ == 0 for c in row.batch_invariance.all_rows.values())
        assert_accuracy_within(row, QUICK, 2 * U, GRADS)
    # Parity faults in one per-row gradient, in the other, and in both: each per-row gradient is compared
    # on its own and the counts add up (docs/operators.md, "Common to all": "each compared bitwise, summed into rowgrad_differ").
    subs = odd_sub_batches(QUICK.full_vs_sub)
    for name, faults in (("planted_y", 1), ("planted_res", 1), ("planted_res_y", 2)):
        inv = rows[name].batch_invariance
        assert {k: c.rowgrad_differ for k, c in inv.all_rows.items()} == {
            str(n): faults * (n * len(QUICK.all_rows.seeds) if n % 2 == 0 else 0) for n in QUICK.all_rows.batch_sizes}
        assert all(c.fwd_differ == 0 for c in inv.all_rows.values())
        assert inv.full_vs_sub_batches.rowgrad_differ == faults * subs > 0
        assert inv.full_vs_sub_batches.fwd_differ == 0
        # a sweep comparison differs when any gradient of the probe row differs: counted once
        assert inv.batch_size_sweep.differ == even_sweep_comparisons(QUICK.sweep) > 0
        assert inv.params_repeatable is True and inv.batch_invariant is False
    assert_evidence_round_trips(evidence, OP.name, QUICK)
