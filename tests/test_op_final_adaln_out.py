"""final_adaln_out (docs/operators.md, final_adaln_out): inputs, float64 reference, the diffusers row, the RFC's counts, floors,
the CUDA-only row.

`[shift | scale] = (W bf16(silu(temb)) + b).chunk(2)`, `out = rms_norm(x, nw, eps) * (1 + scale[ti]) + shift[ti]`
(diffusers' MiniMaxH3AdaLayerNormOut); gradients x (per row), nw, temb, W, b.
"""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from h3bench.adapters.final_adaln_out.diffusers import ADAPTER as DIFFUSERS
from h3bench.adapters.final_adaln_out.rl_kernel import ADAPTER as RL_KERNEL
from h3bench.harness.adapter import Loaded
from h3bench.harness.config import ConfigError, load_config
from h3bench.harness.execute import as_bits
from h3bench.harness.ops import get_op
from h3bench.harness.ops.final_adaln_out import PARAM_SEED, FinalAdaLNOutParams
from h3bench.harness.probes.accuracy_latency import rel_err
from h3bench.harness.runner import RunRequest, run
from h3bench.harness.schema import UnavailableRow
from tests.helpers import (CPU, CUDA, RL_KERNEL_ON_CPU, against_reference, assert_accuracy_within,
                           assert_clean_quick_verdict, assert_evidence_round_trips, assert_no_differences, install,
                           rl_kernel_reasons, run_default_plan_counts)
from tests.helpers import no_rl_engine  # noqa: F401 (a fixture: pytest finds it in this module)

OP = get_op("final_adaln_out")
DEFAULT = load_config("final_adaln_out")
QUICK = load_config("final_adaln_out", quick=True)
GRADS = ("x", "nw", "temb", "w", "b")
U = 2 ** -8  # bf16 unit roundoff: 8 significant bits, round to nearest
# The diffusers row rounds each output element up to six times (silu(temb) cast to bf16, the projection's
# bf16 output, the norm's output, 1 + scale, the product, the sum), each by at most u = 2^-8 of a value
# no larger than ~max|out| (shift and scale are ~0.5, the normalised x ~1-4); the roundings have random
# signs, so the observed forward error is 1-1.5 u and the gradients' 1-2 u (dx passes the norm's backward
# after one rounding of dout * (1 + scale); dW, db, dtemb sum bf16 products over rows). 4 u = 2^-6 bounds
# all of them with margin and stays 10x below a wrong composition (test_a_wrong_composition_...).
TOL = 4 * U


def timesteps_of_layout(rows: int, seed: int) -> torch.Tensor:
    """The RFC's layout, written out again: tags are drawn first, then the timesteps this op uses."""
    gen = torch.Generator().manual_seed(seed)
    torch.randint(0, 3, (rows,), generator=gen)
    return torch.randint(0, 3, (rows,), generator=gen)


# --- parameters and configs ---------------------------------------------------------------------------------

def test_configs_hold_the_model_constants():
    assert DEFAULT.inputs == FinalAdaLNOutParams(hidden=5376, temb_dim=2688, timesteps=3, modalities=3,
                                                 dtype="bfloat16", temb_dtype="float32", eps=1e-5)
    assert DEFAULT.plans == "token" and DEFAULT.quick is False and OP.plan_set == "token"
    assert QUICK.inputs == dataclasses.replace(DEFAULT.inputs, hidden=64, temb_dim=64)
    assert QUICK.plans == "quick" and QUICK.quick is True


@pytest.mark.parametrize("override,message", [("hidden=0", "hidden must be >= 1"),
                                              ("temb_dim=0", "temb_dim must be >= 1"),
                                              ("eps=0", "eps must be > 0"),
                                              ("temb_dtype=float64", "dtype must be one of")])
def test_bad_parameters_are_config_errors(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config("final_adaln_out", overrides=(override,))


def test_declarations():
    # diffusers' norm_out(hidden_states, temb, timestep_indices) with its norm.weight, linear.weight and bias,
    # in the RFC's call order H3FinalAdaLNOutCudaOp()(x, norm_weight, temb, weight, bias, timestep_indices)
    assert OP.input_names == ("x", "nw", "temb", "w", "b", "ti")
    assert OP.row_inputs == ("x", "ti") and OP.row_grads == ("x",)
    assert OP.param_grads == ("nw", "temb", "w", "b") and OP.outputs == ("out",)


# --- inputs ---------------------------------------------------------------------------------------------

def test_inputs_shapes_dtypes_and_draws():
    params, rows = QUICK.inputs, 50
    inputs = OP.make_inputs(params, rows, 3, CPU)
    assert list(inputs.tensors) == list(OP.input_names) and inputs.row_names == ("x", "ti")
    x, nw, temb, w, b, ti = inputs.tensors.values()
    shapes = {"x": (rows, 64), "nw": (64,), "temb": (3, 64), "w": (128, 64), "b": (128,), "ti": (rows,)}
    dtypes = {"x": torch.bfloat16, "nw": torch.bfloat16, "temb": torch.float32, "w": torch.bfloat16,
              "b": torch.bfloat16, "ti": torch.int64}
    for name, t in inputs.tensors.items():
        assert t.shape == shapes[name] and t.dtype == dtypes[name] and t.is_contiguous(), name
        assert t.device == CPU
    assert 0 <= int(ti.min()) and int(ti.max()) < 3
    assert torch.equal(ti, timesteps_of_layout(rows, 3))
    # x from the case seed; nw, temb, W, b in that order from the fixed parameter seed
    gen = torch.Generator().manual_seed(3)
    assert torch.equal(as_bits(x), as_bits((torch.randn(rows, 64, generator=gen) * 2.0).to(torch.bfloat16)))
    gen = torch.Generator().manual_seed(PARAM_SEED)
    expected = {"nw": (0.5 + torch.rand(64, generator=gen)).to(torch.bfloat16),
                "temb": torch.randn(3, 64, generator=gen),
                "w": (torch.randn(128, 64, generator=gen) * 64 ** -0.5).to(torch.bfloat16),
                "b": (torch.randn(128, generator=gen) * 0.02).to(torch.bfloat16)}
    for name, want in expected.items():
        assert torch.equal(as_bits(inputs.tensors[name]), as_bits(want)), name


def test_inputs_are_seeded_and_the_parameters_are_the_same_for_every_case():
    params = QUICK.inputs
    a, again, b = (OP.make_inputs(params, 40, seed, CPU) for seed in (3, 3, 4))
    for name in OP.input_names:
        assert torch.equal(as_bits(a.tensors[name]), as_bits(again.tensors[name])), name
    for name in ("nw", "temb", "w", "b"):
        assert torch.equal(as_bits(a.tensors[name]), as_bits(b.tensors[name])), name
    for name in ("x", "ti"):
        assert not torch.equal(a.tensors[name], b.tensors[name]), name


def test_grad_outs():
    grads = OP.make_grad_outs(QUICK.inputs, 10, 9, CPU)
    expected = torch.randn(10, 64, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    assert len(grads) == 1 and torch.equal(as_bits(grads[0]), as_bits(expected))


# --- the float64 reference ------------------------------------------------------------------------------

def tiny_case(rows=5):
    params = dataclasses.replace(QUICK.inputs, hidden=3, temb_dim=4)
    return params, OP.make_inputs(params, rows, 5, CPU), OP.make_grad_outs(params, rows, 9, CPU)


def test_reference_forward_against_a_hand_computation():
    params, inputs, grad_outs = tiny_case()
    x, nw, temb, w, b, ti = (inputs.tensors[n] for n in OP.input_names)
    ref = OP.reference(params, inputs, grad_outs, GRADS, OP.name)
    assert ref.outputs[0].dtype == torch.float64 and ref.outputs[0].shape == (5, 3)
    h, d = 3, 4
    silu = [[temb[t, k].item() / (1 + math.exp(-temb[t, k].item())) for k in range(d)] for t in range(3)]
    proj = [[sum(w[j, k].item() * silu[t][k] for k in range(d)) + b[j].item() for j in range(2 * h)]
            for t in range(3)]
    for r in range(5):
        t = int(ti[r])
        rms = math.sqrt(sum(x[r, k].item() ** 2 for k in range(h)) / h + params.eps)
        for k in range(h):
            shift, scale = proj[t][k], proj[t][h + k]  # shift is the first half
            expected = x[r, k].item() / rms * nw[k].item() * (1 + scale) + shift
            assert ref.outputs[0][r, k].item() == pytest.approx(expected, rel=1e-13, abs=1e-13)


def independent(x, nw, temb, w, b, ti, eps):
    """The op's math written another way, for float64 autograd."""
    table = (temb * torch.sigmoid(temb)) @ w.T + b
    shift, scale = table[:, :x.shape[1]], table[:, x.shape[1]:]
    normed = x / torch.sqrt((x * x).sum(-1, keepdim=True) / x.shape[1] + eps) * nw
    return normed + normed * scale[ti] + shift[ti]


def test_reference_gradients_against_float64_autograd_and_finite_differences():
    params, inputs, (g,) = tiny_case()
    ref = OP.reference(params, inputs, (g,), GRADS, OP.name)
    leaves = {n: inputs.tensors[n].double().requires_grad_() for n in GRADS}
    out = independent(**leaves, ti=inputs.tensors["ti"], eps=params.eps)
    torch.testing.assert_close(ref.outputs[0], out.detach(), rtol=1e-13, atol=1e-13)
    found = torch.autograd.grad(out, [leaves[n] for n in GRADS], g.double())
    for name, want in zip(GRADS, found):
        assert ref.grads[name].dtype == torch.float64
        torch.testing.assert_close(ref.grads[name], want, rtol=1e-12, atol=1e-12, msg=name)

    def loss(name, flat, delta):
        values = {n: inputs.tensors[n].double() for n in GRADS}
        values[name] = values[name].clone()
        values[name].view(-1)[flat] += delta
        return float((independent(**values, ti=inputs.tensors["ti"], eps=params.eps) * g.double()).sum())

    step = 1e-6
    for name in GRADS:
        for flat in range(0, inputs.tensors[name].numel(), 3):
            fd = (loss(name, flat, step) - loss(name, flat, -step)) / (2 * step)
            assert ref.grads[name].view(-1)[flat].item() == pytest.approx(fd, rel=1e-6, abs=1e-8), (name, flat)


def test_reference_gradients_subset_and_unknown_variant():
    params, inputs, grad_outs = tiny_case()
    assert set(OP.reference(params, inputs, grad_outs, ("temb", "x"), OP.name).grads) == {"temb", "x"}
    assert OP.reference(params, inputs, None, GRADS, OP.name).grads == {}
    with pytest.raises(ValueError, match="unknown reference variant 'rms_norm'"):
        OP.reference(params, inputs, grad_outs, GRADS, "rms_norm")


# --- the diffusers row against the reference -------------------------------------------------------------

def outcome(rows, fn=None):
    inputs, _, out, ref = against_reference(OP, QUICK, fn or DIFFUSERS.load(CPU, QUICK.inputs).fn, GRADS, rows)
    return inputs, out, ref


@pytest.mark.parametrize("rows", QUICK.accuracy.rows)
def test_diffusers_row_matches_the_reference(rows):
    inputs, out, ref = outcome(rows)
    assert out.outputs[0].dtype == torch.bfloat16
    assert 0 < rel_err(out.outputs[0], ref.outputs[0]) <= TOL
    for name in GRADS:
        assert out.grads[name].dtype == inputs.tensors[name].dtype, name  # temb's gradient is float32
        assert rel_err(out.grads[name], ref.grads[name]) <= TOL, name


def test_diffusers_row_replays_the_dtype_boundaries():
    """The row rounds where diffusers does: silu(temb) to bf16 before the projection, the projection's bf16
    output; a composition without that cast (projection in fp32) gives different bits."""
    import torch.nn.functional as F

    eps = QUICK.inputs.eps

    def fp32_projection(x, nw, temb, W, b, ti):
        shift, scale = F.linear(F.silu(temb), W.float(), b.float()).chunk(2, dim=-1)
        n = F.rms_norm(x, (x.shape[-1],), nw, eps)
        return n * (1.0 + scale.index_select(0, ti)) + shift.index_select(0, ti)

    inputs = OP.make_inputs(QUICK.inputs, 33, 11, CPU)
    replay = DIFFUSERS.load(CPU, QUICK.inputs).fn(*inputs.tensors.values())
    assert replay.dtype == torch.bfloat16
    assert not torch.equal(replay.float(), fp32_projection(*inputs.tensors.values()).float())


def test_a_wrong_composition_is_far_outside_the_tolerance():
    import torch.nn.functional as F

    eps = QUICK.inputs.eps

    def swapped(x, nw, temb, W, b, ti):  # scale first: the AdaLayerNormContinuous order, not H3's
        scale, shift = F.linear(F.silu(temb).to(W.dtype), W, b).chunk(2, dim=-1)
        n = F.rms_norm(x, (x.shape[-1],), nw, eps)
        return n * (1.0 + scale.index_select(0, ti)) + shift.index_select(0, ti)

    _, out, ref = outcome(130, swapped)
    assert rel_err(out.outputs[0], ref.outputs[0]) > 10 * TOL


# --- the RFC's counts, full default plan at hidden 8 -----------------------------------------------------------

def test_default_plan_counts_with_the_diffusers_row():
    found = run_default_plan_counts("final_adaln_out", ("hidden=8", "temb_dim=8"), DIFFUSERS)
    # Observed on the CPU: invariant. The norm reduces within a row, the projection sees only temb (the same
    # in every batch), and the modulation is elementwise; the parameter gradients (dnw, and dshift/dscale via
    # index_select's backward, then dW, db, dtemb) are sums that the CPU kernels add in a fixed order, so they
    # repeat run to run. (On CUDA index_select's backward is an atomic scatter-add: the RFC's finding.)
    assert_no_differences(found)


# --- memory floors -------------------------------------------------------------------------------------------

def test_floor_bytes_match_operators_md():
    params = DEFAULT.inputs
    row, weight = 5376 * 2, 2 * 5376 * 2688 * 2  # 10752 bytes; W 57802752 bytes (57.8 MB)
    assert round(weight / 1e6, 1) == 57.8
    for rows in (0, 1, 4097, 131072):
        forward = rows * (2 * row + 8) + weight  # 2 x 10752 (+ index) per row; W once
        assert OP.floor_bytes(params, rows, backward=False) == forward
        # backward: dout and x read, dx written, the index again; W read again and dW written
        assert OP.floor_bytes(params, rows, backward=True) == forward + rows * (3 * row + 8) + 2 * weight


# --- the CUDA-only row ---------------------------------------------------------------------------------------

def test_rl_kernel_is_unavailable_on_cpu_with_a_reason():
    assert RL_KERNEL.try_load(CPU, QUICK.inputs) == RL_KERNEL_ON_CPU


def test_rl_kernel_without_rl_engine_or_without_the_op(monkeypatch, no_rl_engine):
    missing, reason = rl_kernel_reasons(monkeypatch, RL_KERNEL, QUICK.inputs)
    assert missing.startswith("ModuleNotFoundError: ") and "rl_engine" in missing
    assert reason.startswith("ImportError: rl_engine has no H3FinalAdaLNOutCudaOp: tried "
                             "rl_engine.kernels.ops.cuda.h3.final_adaln_out ("), reason
    assert "rl_engine.backends.cuda.model_specific.minimax_h3.final_adaln_out (" in reason


@pytest.mark.parametrize("leaf", ["kernels.ops.cuda.h3", "backends.cuda.model_specific.minimax_h3"])
def test_rl_kernel_plumbing_with_a_fake_rl_engine(leaf, monkeypatch, no_rl_engine):
    calls = []

    class H3FinalAdaLNOutCudaOp:
        def __call__(self, x, norm_weight, temb, weight, bias, timestep_indices, eps=1e-5):
            calls.append(((x, norm_weight, temb, weight, bias, timestep_indices), eps))
            return x

    install(monkeypatch, "rl_engine", __version__="0.0.test")
    install(monkeypatch, f"rl_engine.{leaf}.final_adaln_out", H3FinalAdaLNOutCudaOp=H3FinalAdaLNOutCudaOp)
    params = dataclasses.replace(QUICK.inputs, eps=1e-6)
    loaded = RL_KERNEL.try_load(CUDA, params)  # the device is only looked at; CPU tensors below
    assert isinstance(loaded, Loaded), loaded
    assert loaded.source == (f"rl-kernel H3FinalAdaLNOutCudaOp (rl_engine.{leaf}.final_adaln_out, "
                             "rl_engine 0.0.test)")
    inputs = OP.make_inputs(params, 12, 3, CPU)
    loaded.fn(*inputs.tensors.values())
    args, eps = calls[-1]
    assert all(t is inputs.tensors[n] for t, n in zip(args, OP.input_names)) and eps == 1e-6


# --- the quick plan through the runner ----------------------------------------------------------------------------

def test_quick_plan_through_the_runner():
    evidence = run(RunRequest(config=QUICK, device=CPU, adapters=[DIFFUSERS, RL_KERNEL], modes=["plain"], out=None,
                              measure_bandwidth=False))
    rows = evidence.results["plain"]
    assert list(rows) == ["diffusers", "rl_kernel"]
    assert isinstance(rows["rl_kernel"], UnavailableRow)
    assert rows["rl_kernel"].unavailable == RL_KERNEL_ON_CPU
    row = rows["diffusers"]
    assert_clean_quick_verdict(row, QUICK)
    assert row.has_backward is True and row.source.startswith("diffusers MiniMaxH3AdaLayerNormOut replayed")
    assert_accuracy_within(row, QUICK, TOL, GRADS)
    assert_evidence_round_trips(evidence, OP.name, QUICK)
