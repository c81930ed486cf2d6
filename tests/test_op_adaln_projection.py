"""adaln_projection: inputs, float64 reference and its gradients, the diffusers replay's accuracy (bf16
bounds derived per element), the RFC's counts, the memory floor, and one quick run through the runner."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from h3bench.adapters import builtin_adapters
from h3bench.adapters.adaln_projection.diffusers import ADAPTER as DIFFUSERS
from h3bench.harness.config import ConfigError, load_config
from h3bench.harness.execute import bitwise_equal, execute
from h3bench.harness.ops import get_op
from h3bench.harness.ops.adaln_projection import AdaLNProjectionParams
from h3bench.harness.probes.accuracy_latency import combined_rel_err, rel_err
from h3bench.harness.runner import RunRequest, run
from h3bench.harness.schema import RowResult
from tests.helpers import (CPU, against_reference, assert_accuracy_within, assert_evidence_round_trips,
                           assert_reference_grads_match_finite_differences, run_default_plan_counts, within)
from tests.helpers import one_thread  # noqa: F401 (a fixture: pytest finds it in this module)

OP = get_op("adaln_projection")
DEFAULT = load_config(OP.name)
QUICK = load_config(OP.name, quick=True)
GRADS = ("temb", "w", "b")
U16, U32 = 2.0 ** -8, 2.0 ** -24  # unit roundoffs of bf16 (8 significant bits) and fp32
# Normwise, what the evidence file reports: the bf16 output rounding (<= u16 of max|ref|) plus the bf16
# cast of silu(temb) the implementation makes and the reference does not (<= u16 sum|W||silu|, which at
# these widths stays below max|ref|): 2 u16 = 2^-7. Observed <= 4.4e-3 at the quick widths.
NORMWISE_BOUND = 2 * U16


def test_declarations_and_configs():
    assert OP.input_names == GRADS and OP.row_inputs == ("temb",) and OP.differentiable == GRADS
    assert OP.row_grads == ("temb",) and OP.param_grads == ("w", "b")
    assert OP.outputs == ("table",) and OP.plan_set == "timestep"
    assert DEFAULT.plans == "timestep" and not DEFAULT.quick
    assert DEFAULT.inputs == AdaLNProjectionParams(hidden=5376, temb_dim=2688, chunks=6, modalities=3)
    assert DEFAULT.inputs.out_features == 18 * 5376 == 96768
    assert QUICK.quick and QUICK.plans == "quick" and QUICK.inputs.out_features == 144
    assert [a.name for a in builtin_adapters(OP.name)] == ["diffusers", "h3bench_triton", "torch_compile", "torch_compile_max_autotune"] and DIFFUSERS.grads == GRADS


@pytest.mark.parametrize("key", ["hidden", "temb_dim", "chunks", "modalities"])
def test_params_are_checked(key):
    with pytest.raises(ValueError, match=f"{key} must be >= 1"):
        dataclasses.replace(DEFAULT.inputs, **{key: 0})
    with pytest.raises(ConfigError, match=f"{key} must be >= 1"):
        load_config(OP.name, overrides=(f"{key}=0",))


# --- inputs ---------------------------------------------------------------------------------------------

def test_inputs(device):
    params = dataclasses.replace(DEFAULT.inputs, hidden=64)  # the model's temb width, a narrower table
    n = params.out_features
    inputs = OP.make_inputs(params, 64, 3, device)
    t = inputs.tensors
    assert list(t) == list(GRADS) and inputs.rows == 64
    expected = {"temb": ((64, 2688), torch.float32), "w": ((n, 2688), torch.bfloat16), "b": ((n,), torch.bfloat16)}
    for name, (shape, dtype) in expected.items():
        assert t[name].shape == shape and t[name].dtype == dtype, name
        assert t[name].is_contiguous() and t[name].device.type == device.type, name
    for name, scale in {"temb": 1.0, "w": 2688 ** -0.5, "b": 0.02}.items():
        assert t[name].float().std().item() == pytest.approx(scale, rel=0.1), name
    (g,) = OP.make_grad_outs(params, 64, 9, device)
    assert g.shape == (64, n) and g.dtype == torch.bfloat16


def test_inputs_are_seeded_and_parameters_drawn_once(device):
    params = QUICK.inputs
    a, again = OP.make_inputs(params, 50, 3, device), OP.make_inputs(params, 50, 3, device)
    other, fewer = OP.make_inputs(params, 50, 4, device), OP.make_inputs(params, 7, 4, device)
    assert all(bitwise_equal(a.tensors[name], again.tensors[name]) for name in GRADS)
    assert not torch.equal(a.tensors["temb"], other.tensors["temb"])
    for name in ("w", "b"):
        assert bitwise_equal(a.tensors[name], other.tensors[name]) and bitwise_equal(a.tensors[name],
                                                                                     fewer.tensors[name])


# --- reference ------------------------------------------------------------------------------------------

def test_reference_matches_a_hand_computation():
    """Pure float64 (no bf16 cast of silu(temb)): explicit loops for the forward, the chain rule for the
    gradients."""
    params = AdaLNProjectionParams(hidden=1, temb_dim=3, chunks=2, modalities=2)
    inputs = OP.make_inputs(params, 5, 3, CPU)
    (dy,) = OP.make_grad_outs(params, 5, 9, CPU)
    ref = OP.reference(params, inputs, (dy,), GRADS, OP.name)
    temb, w, b = (inputs.tensors[name].double() for name in GRADS)
    g = dy.double()
    sig = 1 / (1 + torch.exp(-temb))
    s = temb * sig
    table = torch.tensor([[sum(w[j, k].item() * s[r, k].item() for k in range(3)) + b[j].item() for j in range(4)]
                          for r in range(5)], dtype=torch.float64)
    (out,) = ref.outputs
    assert out.dtype == torch.float64 and out.shape == (5, 4)
    assert torch.allclose(out, table, rtol=1e-13, atol=1e-14)
    # not the bf16-cast composition: the reference keeps silu(temb) unrounded
    assert not torch.equal(out, s.bfloat16().double() @ w.T + b)
    expected = {"temb": (g @ w) * (sig + temb * sig * (1 - sig)), "w": g.T @ s, "b": g.sum(0)}
    for name, value in expected.items():
        assert ref.grads[name].dtype == torch.float64
        assert torch.allclose(ref.grads[name], value, rtol=1e-12, atol=1e-13), name
    assert set(OP.reference(params, inputs, (dy,), ("w",), OP.name).grads) == {"w"}
    with pytest.raises(ValueError, match="unknown reference variant"):
        OP.reference(params, inputs, (dy,), GRADS, "rms_norm")


def test_reference_gradients_match_finite_differences():
    assert_reference_grads_match_finite_differences(OP, AdaLNProjectionParams(hidden=1, temb_dim=3, chunks=2,
                                                                               modalities=2))


# --- the diffusers row ----------------------------------------------------------------------------------

def _bf16_bound(ref, through_cast, exact, terms):
    """Per element, for a bf16 result of an fp32-accumulated sum of `terms` products of bf16 numbers
    (exact in fp32) that the reference computes in float64: the result's rounding, twice when a bias is
    added after the product is rounded (2 u16 |ref|, + u16 |exact| for that bias); the bf16 rounding of
    a factor the reference keeps unrounded (silu(temb): u16 + a few fp32 ulps of silu, on `through_cast`
    = sum |terms| made through it); the fp32 additions ((terms + 2) u32 on every term's magnitude)."""
    u_in = U16 + 8 * U32
    return 1.01 * (2 * U16 * ref.abs() + U16 * exact + u_in * through_cast
                   + (terms + 2) * U32 * (through_cast + exact))


def test_diffusers_row_is_within_bf16_rounding(device):
    """Every element of the table and of each gradient against its own bound (`_bf16_bound`), and the
    normwise errors the evidence file reports against 2^-7."""
    params = QUICK.inputs
    fn = DIFFUSERS.load(device, params).fn
    for rows in QUICK.accuracy.rows:
        inputs, (dy,), out, ref = against_reference(OP, QUICK, fn, GRADS, rows, device=device)
        temb, w, b = (inputs.tensors[name].double() for name in GRADS)
        g = dy.double()
        sig = torch.sigmoid(temb)
        s = temb * sig
        (table,) = out.outputs
        assert table.dtype == torch.bfloat16 and table.shape == (rows, params.out_features)
        # table = fl(W fl(silu(temb)) + b): D products through the cast, then the bias
        bound = _bf16_bound(ref.outputs[0], s.abs() @ w.abs().T, b.abs(), params.temb_dim)
        assert within(table, ref.outputs[0], bound)
        # dW = fl(dy^T fl(silu(temb))): T products through the cast; db = fl(sum dy): T exact terms
        bound = _bf16_bound(ref.grads["w"], g.abs().T @ s.abs(), 0.0, rows)
        assert out.grads["w"].dtype == torch.bfloat16
        assert within(out.grads["w"], ref.grads["w"], bound)
        bound = _bf16_bound(ref.grads["b"], 0.0, g.abs().sum(0), rows)
        assert within(out.grads["b"], ref.grads["b"], bound)
        # dtemb = silu'(temb) * fl(dy W) in fp32: the bf16 product of N exact terms (no cast on the way),
        # scaled by |silu'| <= sig (1 + |temb| (1 - sig)) = m; silu's backward adds a few fp32 ulps
        m = sig * (1 + temb.abs() * (1 - sig))
        through = g.abs() @ w.abs()
        product = g @ w
        bound = m * _bf16_bound(product, 0.0, through, params.out_features) + 8 * U32 * m * product.abs()
        assert out.grads["temb"].dtype == torch.float32
        assert within(out.grads["temb"], ref.grads["temb"], bound)
        assert combined_rel_err(out.outputs, ref.outputs) <= NORMWISE_BOUND
        for name in GRADS:
            assert rel_err(out.grads[name], ref.grads[name]) <= NORMWISE_BOUND, name


def test_diffusers_replay_is_the_real_diffusers():
    """Bitwise the same table and gradients as diffusers' own MiniMaxH3AdaLayerNormModulation, when
    diffusers is installed (its six chunks are views of the projection's [T, 18H] result)."""
    minimax = pytest.importorskip("diffusers.models.transformers.transformer_minimax_h3")
    p = QUICK.inputs
    inputs = OP.make_inputs(p, 17, 3, CPU)
    (dy,) = OP.make_grad_outs(p, 17, 9, CPU)
    module = minimax.MiniMaxH3AdaLayerNormModulation(p.temb_dim, p.hidden).to(torch.bfloat16)
    with torch.no_grad():
        module.linear.weight.copy_(inputs.tensors["w"])
        module.linear.bias.copy_(inputs.tensors["b"])
    temb = inputs.tensors["temb"].clone().requires_grad_()
    chunks = module(temb)
    real = torch.cat(chunks, dim=-1).reshape(17, -1)
    real.backward(dy)
    ours = execute(DIFFUSERS.load(CPU, p).fn, inputs, (dy,), GRADS, 1)
    assert bitwise_equal(ours.outputs[0], real.detach()) and bitwise_equal(ours.grads["temb"], temb.grad)
    assert bitwise_equal(ours.grads["w"], module.linear.weight.grad)
    assert bitwise_equal(ours.grads["b"], module.linear.bias.grad)


# --- counts, floor ---------------------------------------------------------------------------------------

def test_default_plan_counts_and_cpu_verdict(one_thread):
    """The full timestep plan at a 36-wide table from temb 8: the RFC's counts (192/771/6144 rows, 2060
    sub-batches of 4096, 2256 comparisons). Observed on this CPU (torch 2.13, oneDNN/MKL): NOT invariant.
    The bf16 GEMMs accumulate in fp32 along a path that depends on the batch, so the fp32 sums of a row
    differ alone vs in a batch; the bf16 rounding of the table hides most of that (1 row of 6144 differed),
    the row gradient dtemb = silu' * bf16(dy W) much less (hundreds of rows). The parameter gradients repeat
    run to run (same batch, same kernels, no atomics)."""
    found = run_default_plan_counts(OP.name, ("hidden=2", "temb_dim=8"), DIFFUSERS)
    assert found.batch_invariant is False
    assert sum(c.rowgrad_differ for c in found.all_rows.values()) > 0
    assert found.params_repeatable is True


def test_floor_bytes_match_operators_md():
    params = DEFAULT.inputs
    fixed = OP.floor_bytes(params, 0, backward=False)
    per_row = OP.floor_bytes(params, 1, backward=False) - fixed
    assert per_row == 10752 + 193536                              # temb fp32 in, table bf16 out
    assert fixed == 2 * (96768 * 2688 + 96768) == 520_418_304 and round(fixed / 1e6) == 520  # "W 520 MB"
    assert OP.floor_bytes(params, 2048, backward=False) == 2048 * per_row + fixed
    # backward: dy in, temb again, dtemb out per row; W read again, dW and db written once
    fixed_bwd = OP.floor_bytes(params, 0, backward=True)
    assert OP.floor_bytes(params, 1, backward=True) - fixed_bwd == per_row + 193536 + 10752 + 10752
    assert fixed_bwd == fixed + 2 * 96768 * 2688 + fixed == 1_561_061_376


# --- through the runner -------------------------------------------------------------------------------------

def test_quick_plan_through_the_runner():
    evidence = run(RunRequest(config=QUICK, device=CPU, adapters=[DIFFUSERS], modes=["plain"], out=None,
                              measure_bandwidth=False))
    row = evidence.results["plain"]["diffusers[plain]"]  # named as the RFC names it
    assert isinstance(row, RowResult), row
    assert row.has_backward is True and row.source.startswith("diffusers MiniMaxH3AdaLayerNormModulation")
    assert row.batch_invariance.params_repeatable is True
    assert_accuracy_within(row, QUICK, NORMWISE_BOUND, GRADS)
    assert_evidence_round_trips(evidence, OP.name, QUICK)
