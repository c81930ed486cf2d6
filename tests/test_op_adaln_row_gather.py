"""adaln_row_gather (docs/operators.md, adaln_row_gather): inputs, float64 reference, CPU rows, the RFC's counts, floors, CUDA-only rows.

`outs = table[ti * 3 + tag].chunk(6, dim=1)`: a copy forward, and a table gradient that sums each table
row's upstream gradients (the only gradient: no per-row gradient).
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from h3bench.adapters.adaln_row_gather.diffusers import ADAPTER as DIFFUSERS
from h3bench.adapters.adaln_row_gather.rl_kernel import ADAPTER as RL_KERNEL
from h3bench.adapters.adaln_row_gather.torch_embedding import ADAPTER as TORCH_EMBEDDING
from h3bench.harness.adapter import Loaded, from_function
from h3bench.harness.config import ConfigError, load_config
from h3bench.harness.execute import as_bits
from h3bench.harness.ops import get_op
from h3bench.harness.ops.adaln_row_gather import CHUNK_NAMES, PARAM_SEED, AdaLNRowGatherParams
from h3bench.harness.probes.accuracy_latency import combined_rel_err, rel_err
from h3bench.harness.runner import RunRequest, run
from h3bench.harness.schema import UnavailableRow
from tests.helpers import (CPU, CUDA, RL_KERNEL_ON_CPU, against_reference, assert_clean_quick_verdict,
                           assert_evidence_round_trips, assert_no_differences, install, rl_kernel_reasons,
                           run_default_plan_counts, within)
from tests.helpers import no_rl_engine  # noqa: F401 (a fixture: pytest finds it in this module)

OP = get_op("adaln_row_gather")
DEFAULT = load_config("adaln_row_gather")
QUICK = load_config("adaln_row_gather", quick=True)
U = 2 ** -8  # bf16 unit roundoff: 8 significant bits, round to nearest
BUMP = 2 ** -5  # larger than a bf16 ulp: changes the bits of every non-zero element


def layout(rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The RFC's layout, written out again: tags first, then timesteps; the first rows get tags 0, 1, 2."""
    gen = torch.Generator().manual_seed(seed)
    tags = torch.randint(0, 3, (rows,), generator=gen)
    steps = torch.randint(0, 3, (rows,), generator=gen)
    tags[:min(rows, 3)] = torch.arange(min(rows, 3))
    return steps, tags


# --- parameters and configs ---------------------------------------------------------------------------------

def test_configs_hold_the_model_constants():
    assert DEFAULT.inputs == AdaLNRowGatherParams(hidden=5376, timesteps=3, modalities=3, chunks=6,
                                                  dtype="bfloat16")
    assert DEFAULT.plans == "token" and DEFAULT.quick is False and OP.plan_set == "token"
    assert QUICK.inputs == dataclasses.replace(DEFAULT.inputs, hidden=64)
    assert QUICK.plans == "quick" and QUICK.quick is True


@pytest.mark.parametrize("override,message", [("hidden=0", "hidden must be >= 1"),
                                              ("timesteps=0", "timesteps must be >= 1"),
                                              ("chunks=5", "chunks must be 6"),
                                              ("dtype=int8", "dtype must be one of")])
def test_bad_parameters_are_config_errors(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config("adaln_row_gather", overrides=(override,))


def test_declarations():
    assert OP.input_names == ("table", "ti", "tag")  # H3AdaLNRowGatherCudaOp()(table, ti, tag)
    assert OP.row_inputs == ("ti", "tag") and OP.row_grads == () and OP.param_grads == ("table",)
    assert OP.outputs == CHUNK_NAMES == ("shift_msa", "scale_msa", "gate_msa", "shift_mlp", "scale_mlp",
                                         "gate_mlp")


# --- inputs ---------------------------------------------------------------------------------------------

def test_inputs_shapes_dtypes_and_layout():
    params, rows = QUICK.inputs, 50
    inputs = OP.make_inputs(params, rows, 3, CPU)
    assert list(inputs.tensors) == ["table", "ti", "tag"] and inputs.row_names == ("ti", "tag")
    assert inputs.rows == rows
    table, ti, tag = inputs.tensors.values()
    assert table.shape == (9, 6 * 64) and table.dtype == torch.bfloat16 and table.stride() == (6 * 64, 1)
    for t in (ti, tag):
        assert t.shape == (rows,) and t.dtype == torch.int64 and t.stride() == (1,)
    assert all(t.device == CPU for t in inputs.tensors.values())
    assert tag[:3].tolist() == [0, 1, 2]
    assert 0 <= int(ti.min()) and int(ti.max()) < 3 and 0 <= int(tag.min()) and int(tag.max()) < 3
    steps, tags = layout(rows, 3)
    assert torch.equal(ti, steps) and torch.equal(tag, tags)
    # the table: 0.1 randn rounded to bf16, from the fixed parameter seed
    gen = torch.Generator().manual_seed(PARAM_SEED)
    expected = (torch.randn(9, 6 * 64, generator=gen) * 0.1).to(torch.bfloat16)
    assert torch.equal(as_bits(table), as_bits(expected))


def test_inputs_are_seeded_and_the_table_is_the_same_for_every_case():
    params = QUICK.inputs
    a, again, b = (OP.make_inputs(params, 40, seed, CPU) for seed in (3, 3, 4))
    for name in OP.input_names:
        assert torch.equal(as_bits(a.tensors[name]), as_bits(again.tensors[name])), name
    assert torch.equal(as_bits(a.tensors["table"]), as_bits(b.tensors["table"]))
    assert not torch.equal(a.tensors["ti"], b.tensors["ti"]) or not torch.equal(a.tensors["tag"], b.tensors["tag"])
    # a sub-batch's inputs are the selected rows; the table is shared
    index = torch.tensor([5, 1, 7])
    sub = a.select_rows(index)
    assert sub.tensors["table"] is a.tensors["table"]
    assert torch.equal(sub.tensors["ti"], a.tensors["ti"][index])


def test_grad_outs_are_six_draws_of_one_generator():
    params = QUICK.inputs
    grads = OP.make_grad_outs(params, 10, 9, CPU)
    gen = torch.Generator().manual_seed(9)
    expected = [torch.randn(10, 64, generator=gen).to(torch.bfloat16) for _ in range(6)]
    assert len(grads) == 6
    for got, want in zip(grads, expected):
        assert got.dtype == torch.bfloat16 and torch.equal(as_bits(got), as_bits(want))
    assert not torch.equal(grads[0], grads[1])


# --- the float64 reference ------------------------------------------------------------------------------

def tiny_case():
    params = dataclasses.replace(QUICK.inputs, hidden=2)
    inputs = OP.make_inputs(params, 7, 5, CPU)
    grad_outs = OP.make_grad_outs(params, 7, 9, CPU)
    return params, inputs, grad_outs


def test_reference_against_a_hand_computation():
    params, inputs, grad_outs = tiny_case()
    table, ti, tag = (inputs.tensors[n] for n in ("table", "ti", "tag"))
    ref = OP.reference(params, inputs, grad_outs, ("table",), OP.name)
    h = params.hidden
    assert len(ref.outputs) == 6 and all(o.dtype == torch.float64 for o in ref.outputs)
    expected_grad = [[0.0] * (6 * h) for _ in range(9)]
    for r in range(7):
        row = int(ti[r]) * 3 + int(tag[r])
        for c in range(6):
            for k in range(h):
                assert ref.outputs[c][r, k].item() == table[row, c * h + k].item()
                expected_grad[row][c * h + k] += grad_outs[c][r, k].item()
    assert ref.grads["table"].dtype == torch.float64
    torch.testing.assert_close(ref.grads["table"], torch.tensor(expected_grad, dtype=torch.float64),
                               rtol=1e-14, atol=1e-14)


def test_reference_without_gradients_and_unknown_variant():
    params, inputs, grad_outs = tiny_case()
    assert OP.reference(params, inputs, None, ("table",), OP.name).grads == {}
    assert OP.reference(params, inputs, grad_outs, (), OP.name).grads == {}
    with pytest.raises(ValueError, match="unknown reference variant 'rms_norm'"):
        OP.reference(params, inputs, grad_outs, ("table",), "rms_norm")


# --- the CPU rows against the reference -------------------------------------------------------------------

def outcome(adapter, rows, params=QUICK.inputs):
    return against_reference(OP, QUICK, adapter.load(CPU, params).fn, adapter.grads, rows, params)


@pytest.mark.parametrize("rows", QUICK.accuracy.rows)
def test_diffusers_row_matches_the_reference(rows):
    inputs, grad_outs, out, ref = outcome(DIFFUSERS, rows)
    # The forward is a copy of bf16 table entries: exact.
    assert combined_rel_err(out.outputs, ref.outputs) == 0.0
    assert all(o.dtype == torch.bfloat16 and o.shape == (rows, 64) for o in out.outputs)
    # The table gradient is index_select's backward, an index_add. On the CPU it adds in fp32 and rounds
    # once to bf16 (observed: bitwise the float64 sum rounded, even at 4097 rows), so each element is within
    # one rounding, u = 2^-8 of itself, plus fp32 summation error (~rows * 2^-24): 1.01 u of max|ref|.
    assert rel_err(out.grads["table"], ref.grads["table"]) <= 1.01 * U


@pytest.mark.parametrize("rows", QUICK.accuracy.rows)
def test_torch_embedding_row_matches_the_reference(rows):
    inputs, grad_outs, out, ref = outcome(TORCH_EMBEDDING, rows)
    assert combined_rel_err(out.outputs, ref.outputs) == 0.0
    # F.embedding's CPU backward adds the k rows of each table row one by one in bf16 (observed): the
    # recursive-summation bound |err| <= gamma_(k-1) * sum|g_i|, gamma_n = n u / (1 - n u), per element.
    # It grows with k, so no fixed 2^-8 bound holds here; the bound is computed from the data.
    ti, tag = inputs.tensors["ti"], inputs.tensors["tag"]
    idx = ti * 3 + tag
    k = torch.bincount(idx, minlength=9).double()
    gamma = (k - 1).clamp_min(0) * U / (1 - (k - 1).clamp_min(0) * U)
    abs_sum = torch.zeros(9, 6 * 64, dtype=torch.float64).index_add_(
        0, idx, torch.cat([g.double().abs() for g in grad_outs], dim=1))
    assert within(out.grads["table"], ref.grads["table"], gamma[:, None] * abs_sum + 1e-300)
    assert rel_err(out.grads["table"], ref.grads["table"]) > 0  # it does round


def test_a_wrong_gather_is_far_outside_the_bounds():
    """The checks above would catch a wrong table row or a swapped chunk: those are off by O(1)."""
    inputs, _, out, ref = outcome(DIFFUSERS, 130)
    swapped = (out.outputs[1], out.outputs[0], *out.outputs[2:])
    assert combined_rel_err(swapped, ref.outputs) > 0.5
    wrong_row = OP.reference(QUICK.inputs, dataclasses.replace(
        inputs, tensors={**inputs.tensors, "tag": (inputs.tensors["tag"] + 1) % 3}), None, (), OP.name)
    assert combined_rel_err(out.outputs, wrong_row.outputs) > 0.5


# --- the RFC's counts, full default plan at hidden 8 -----------------------------------------------------------

def test_default_plan_counts_with_the_diffusers_row():
    found = run_default_plan_counts("adaln_row_gather", ("hidden=8",), DIFFUSERS)
    # Observed on the CPU: invariant. The forward is a copy (index_select), so no row can depend on its
    # batch; the table gradient is the CPU index_add, which adds in index order on one thread, so the same
    # batch gives the same bits run after run (params_repeatable). On CUDA the same backward is an atomic
    # scatter-add whose order varies: the RFC's B200 finding, not something a CPU run can show.
    assert_no_differences(found)


# --- memory floors -------------------------------------------------------------------------------------------

def test_floor_bytes_match_operators_md():
    params = DEFAULT.inputs
    per_row, table = 16 + 64512, 580608  # docs/operators.md, memory floors: 16 (indices) + 64512 per row; table 0.58 MB
    assert 6 * 5376 * 2 == 64512 and 9 * 6 * 5376 * 2 == table and round(table / 1e6, 2) == 0.58
    for rows in (0, 1, 4097, 131072):
        assert OP.floor_bytes(params, rows, backward=False) == rows * per_row + table
        # backward: the indices and the six upstream gradients again, the table gradient written once
        assert OP.floor_bytes(params, rows, backward=True) == 2 * (rows * per_row + table)


# --- the CUDA-only row ---------------------------------------------------------------------------------------

def test_rl_kernel_is_unavailable_on_cpu_with_a_reason():
    assert RL_KERNEL.try_load(CPU, QUICK.inputs) == RL_KERNEL_ON_CPU
    # rl-kernel hard-codes three modalities and six chunks: another layout is refused first, on any device
    reason = RL_KERNEL.try_load(CUDA, dataclasses.replace(QUICK.inputs, modalities=2))
    assert reason == ("ValueError: rl-kernel's row gather has 3 modalities and 6 chunks built in; this run has "
                      "modalities = 2, chunks = 6")


def test_rl_kernel_without_rl_engine(monkeypatch, no_rl_engine):
    missing, _ = rl_kernel_reasons(monkeypatch, RL_KERNEL, QUICK.inputs)
    assert missing.startswith("ModuleNotFoundError: ") and "rl_engine" in missing


def test_rl_kernel_plumbing_with_a_fake_rl_engine(monkeypatch, no_rl_engine):
    calls = []

    class H3AdaLNRowGatherCudaOp:
        def __call__(self, rows, timestep_indices, token_tags):
            calls.append((rows, timestep_indices, token_tags))
            return tuple(rows.index_select(0, timestep_indices * 3 + token_tags).chunk(6, dim=1))

    install(monkeypatch, "rl_engine", __version__="0.0.test")
    install(monkeypatch, "rl_engine.kernels.ops.cuda.h3.adaln_row_gather",
            H3AdaLNRowGatherCudaOp=H3AdaLNRowGatherCudaOp)
    loaded = RL_KERNEL.try_load(CUDA, QUICK.inputs)  # the device is only looked at; CPU tensors below
    assert isinstance(loaded, Loaded), loaded
    assert loaded.source == ("rl-kernel H3AdaLNRowGatherCudaOp (rl_engine.kernels.ops.cuda.h3.adaln_row_gather, "
                             "rl_engine 0.0.test)")
    inputs = OP.make_inputs(QUICK.inputs, 12, 3, CPU)
    outs = loaded.fn(*inputs.tensors.values())
    assert [t is inputs.tensors[n] for t, n in zip(calls[-1], ("table", "ti", "tag"))] == [True] * 3
    ref = OP.reference(QUICK.inputs, inputs, None, (), OP.name)
    assert combined_rel_err(outs, ref.outputs) == 0.0


# --- the quick plan through the runner ----------------------------------------------------------------------------

class _Perturb(torch.autograd.Function):
    """Identity whose forward adds BUMP * t on even batches; its gradient is passed through unchanged."""

    @staticmethod
    def forward(ctx, t):
        return t + t * BUMP if t.shape[0] % 2 == 0 else t.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad


_HONEST = DIFFUSERS.load(CPU, QUICK.inputs).fn


def output5_on_even_batches(table, ti, tag):
    outs = list(_HONEST(table, ti, tag))
    outs[5] = _Perturb.apply(outs[5])
    return tuple(outs)


def test_quick_plan_through_the_runner():
    planted = from_function(output5_on_even_batches, name="planted", op=OP.name, differentiable=("table",))
    evidence = run(RunRequest(config=QUICK, device=CPU, adapters=[DIFFUSERS, TORCH_EMBEDDING, RL_KERNEL, planted],
                              modes=["plain"], out=None, measure_bandwidth=False))
    rows = evidence.results["plain"]
    assert list(rows) == ["diffusers", "torch_embedding", "rl_kernel", "planted"]
    assert rows["rl_kernel"] == UnavailableRow(unavailable=RL_KERNEL_ON_CPU, wall_s=rows["rl_kernel"].wall_s)
    for name in ("diffusers", "torch_embedding"):
        row = rows[name]
        assert_clean_quick_verdict(row, QUICK)
        assert row.has_backward is True
        assert sorted(row.accuracy_latency, key=int) == [str(r) for r in QUICK.accuracy.rows]
        for size in row.accuracy_latency.values():
            assert size.fwd_rel_err == 0.0 and set(size.grad_rel_err) == {"table"}
    assert rows["diffusers"].source.startswith("diffusers MiniMax-H3 composition replayed")
    # the planted row: only output 5 of 6 differs, only on even batches; the forward counts catch it
    inv = rows["planted"].batch_invariance
    assert {k: c.fwd_differ for k, c in inv.all_rows.items()} == {
        str(n): (n * len(QUICK.all_rows.seeds) if n % 2 == 0 else 0) for n in QUICK.all_rows.batch_sizes}
    assert all(c.rowgrad_differ == 0 for c in inv.all_rows.values())
    assert inv.full_vs_sub_batches.fwd_differ > 0 and inv.batch_size_sweep.differ > 0
    assert inv.params_repeatable is True and inv.batch_invariant is False
    assert_evidence_round_trips(evidence, OP.name, QUICK)
