"""timestep_mlp: inputs, float64 reference and its gradients, the diffusers replay's accuracy, the RFC's
counts, the memory floor, the rl-kernel row's reason on a CPU, and one quick run through the runner."""
from __future__ import annotations

import dataclasses
import sys

import pytest
import torch

from h3bench.adapters import builtin_adapters
from h3bench.adapters.timestep_mlp.diffusers import ADAPTER as DIFFUSERS
from h3bench.adapters.timestep_mlp.rl_kernel import ADAPTER as RL_KERNEL
from h3bench.harness.config import ConfigError, load_config
from h3bench.harness.execute import bitwise_equal, execute
from h3bench.harness.ops import get_op
from h3bench.harness.ops.timestep_mlp import TimestepMLPParams
from h3bench.harness.probes.accuracy_latency import combined_rel_err, rel_err
from h3bench.harness.runner import RunRequest, run
from h3bench.harness.schema import RowResult
from tests.helpers import (CPU, against_reference, assert_accuracy_within, assert_evidence_round_trips,
                           assert_reference_grads_match_finite_differences, run_default_plan_counts)
from tests.helpers import one_thread  # noqa: F401 (a fixture: pytest finds it in this module)

OP = get_op("timestep_mlp")
DEFAULT = load_config(OP.name)
QUICK = load_config(OP.name, quick=True)
GRADS = ("x", "w1", "b1", "w2", "b2")
# fp32, u = 2^-24: each output element is a dot product of `freq_dim` terms, a silu, and a dot product of
# `hidden` terms; the classical bound per dot product is ~n u (times the cancellation in it), and the
# gradients are dot products of the same lengths (or of the rows). At the quick widths (16, 32) and up to
# 130 rows, 64 u = 3.8e-6 bounds all of it with room to spare (observed <= 5e-7).
FP32_BOUND = 64 * 2.0 ** -24


def test_declarations_and_configs():
    assert OP.input_names == GRADS and OP.row_inputs == ("x",) and OP.differentiable == GRADS
    assert OP.row_grads == ("x",) and OP.param_grads == ("w1", "b1", "w2", "b2")
    assert OP.outputs == ("out",) and OP.plan_set == "timestep"
    assert DEFAULT.plans == "timestep" and not DEFAULT.quick
    assert DEFAULT.inputs == TimestepMLPParams(freq_dim=256, hidden=5376, temb_dim=2688)
    assert QUICK.quick and QUICK.plans == "quick" and QUICK.inputs == TimestepMLPParams(16, 32, 24)
    assert [a.name for a in builtin_adapters(OP.name)] == ["diffusers", "rl_kernel", "h3bench_triton", "torch_compile", "torch_compile_max_autotune"]
    assert DIFFUSERS.grads == RL_KERNEL.grads == GRADS


@pytest.mark.parametrize("key", ["freq_dim", "hidden", "temb_dim"])
def test_params_are_checked(key):
    with pytest.raises(ValueError, match=f"{key} must be >= 1"):
        dataclasses.replace(DEFAULT.inputs, **{key: 0})
    with pytest.raises(ConfigError, match=f"{key} must be >= 1"):
        load_config(OP.name, overrides=(f"{key}=0",))


# --- inputs ---------------------------------------------------------------------------------------------

def test_inputs_at_the_models_size(device):
    params = DEFAULT.inputs
    inputs = OP.make_inputs(params, 64, 3, device)
    t = inputs.tensors
    assert list(t) == list(GRADS) and inputs.rows == 64
    shapes = {"x": (64, 256), "w1": (5376, 256), "b1": (5376,), "w2": (2688, 5376), "b2": (2688,)}
    for name, shape in shapes.items():
        assert t[name].shape == shape and t[name].dtype == torch.float32, name
        assert t[name].is_contiguous() and t[name].device.type == device.type, name
    # the draws' scales: randn, randn * 256^-0.5, 0.02 randn, randn * 5376^-0.5, 0.02 randn
    for name, scale in {"x": 1.0, "w1": 256 ** -0.5, "b1": 0.02, "w2": 5376 ** -0.5, "b2": 0.02}.items():
        assert t[name].std().item() == pytest.approx(scale, rel=0.1), name
    (g,) = OP.make_grad_outs(params, 64, 9, device)
    assert g.shape == (64, 2688) and g.dtype == torch.float32


def test_inputs_are_seeded_and_parameters_drawn_once(device):
    params = QUICK.inputs
    a, again = OP.make_inputs(params, 50, 3, device), OP.make_inputs(params, 50, 3, device)
    other, fewer = OP.make_inputs(params, 50, 4, device), OP.make_inputs(params, 7, 4, device)
    assert all(bitwise_equal(a.tensors[n], again.tensors[n]) for n in GRADS)
    assert not torch.equal(a.tensors["x"], other.tensors["x"])          # activations follow the case seed
    for name in ("w1", "b1", "w2", "b2"):                                  # parameters never do
        assert bitwise_equal(a.tensors[name], other.tensors[name]) and bitwise_equal(a.tensors[name],
                                                                                     fewer.tensors[name])
    assert bitwise_equal(OP.make_grad_outs(params, 50, 9, device)[0], OP.make_grad_outs(params, 50, 9, device)[0])


# --- reference ------------------------------------------------------------------------------------------

def test_reference_matches_a_hand_computation():
    """Forward with explicit matmuls and silu = h / (1 + exp(-h)); gradients by the chain rule by hand."""
    params = TimestepMLPParams(freq_dim=3, hidden=5, temb_dim=4)
    inputs = OP.make_inputs(params, 6, 3, CPU)
    (dy,) = OP.make_grad_outs(params, 6, 9, CPU)
    ref = OP.reference(params, inputs, (dy,), GRADS, OP.name)
    x, w1, b1, w2, b2 = (inputs.tensors[n].double() for n in GRADS)
    g = dy.double()
    h = torch.stack([torch.stack([sum(x[r, i] * w1[j, i] for i in range(3)) + b1[j] for j in range(5)])
                     for r in range(6)])
    sig = 1 / (1 + torch.exp(-h))
    a = h * sig
    out = a @ w2.T + b2
    assert ref.outputs[0].dtype == torch.float64 and torch.allclose(ref.outputs[0], out, rtol=1e-13, atol=1e-14)
    dh = (g @ w2) * (sig + h * sig * (1 - sig))
    expected = {"x": dh @ w1, "w1": dh.T @ x, "b1": dh.sum(0), "w2": g.T @ a, "b2": g.sum(0)}
    assert set(ref.grads) == set(GRADS)
    for name, value in expected.items():
        assert ref.grads[name].dtype == torch.float64
        assert torch.allclose(ref.grads[name], value, rtol=1e-12, atol=1e-13), name
    # only the gradients asked for; none without upstream gradients
    assert set(OP.reference(params, inputs, (dy,), ("x", "b2"), OP.name).grads) == {"x", "b2"}
    assert OP.reference(params, inputs, None, GRADS, OP.name).grads == {}
    with pytest.raises(ValueError, match="unknown reference variant"):
        OP.reference(params, inputs, (dy,), GRADS, "rms_norm")


def test_reference_gradients_match_finite_differences():
    """The reference as a black box: d/de sum(out(p + e v) * dy) at e = 0, by central differences in float64,
    equals sum over inputs of <grad, v> for a random direction v through all five inputs."""
    assert_reference_grads_match_finite_differences(OP, TimestepMLPParams(freq_dim=3, hidden=4, temb_dim=2))


# --- the diffusers row ----------------------------------------------------------------------------------

def test_diffusers_row_is_within_fp32_rounding(device):
    fn = DIFFUSERS.load(device, QUICK.inputs).fn
    for rows in QUICK.accuracy.rows:
        _, _, out, ref = against_reference(OP, QUICK, fn, GRADS, rows, device=device)
        assert out.outputs[0].dtype == torch.float32
        assert combined_rel_err(out.outputs, ref.outputs) <= FP32_BOUND
        for name in GRADS:
            assert out.grads[name].dtype == torch.float32
            assert rel_err(out.grads[name], ref.grads[name]) <= FP32_BOUND, name


def test_diffusers_replay_is_the_real_diffusers():
    """Bitwise the same forward and gradients as diffusers' own TimestepEmbedding, when installed."""
    embeddings = pytest.importorskip("diffusers.models.embeddings")
    p = QUICK.inputs
    inputs = OP.make_inputs(p, 17, 3, CPU)
    (dy,) = OP.make_grad_outs(p, 17, 9, CPU)
    module = embeddings.TimestepEmbedding(p.freq_dim, p.hidden, out_dim=p.temb_dim)
    t = inputs.tensors
    with torch.no_grad():
        for param, name in ((module.linear_1.weight, "w1"), (module.linear_1.bias, "b1"),
                            (module.linear_2.weight, "w2"), (module.linear_2.bias, "b2")):
            param.copy_(t[name])
    x = t["x"].clone().requires_grad_()
    real = module(x)
    real.backward(dy)
    ours = execute(DIFFUSERS.load(CPU, p).fn, inputs, (dy,), GRADS, 1)
    assert bitwise_equal(ours.outputs[0], real.detach()) and bitwise_equal(ours.grads["x"], x.grad)
    assert bitwise_equal(ours.grads["w2"], module.linear_2.weight.grad)
    assert bitwise_equal(ours.grads["b1"], module.linear_1.bias.grad)


# --- counts, floor ---------------------------------------------------------------------------------------

def test_default_plan_counts_and_cpu_verdict(one_thread):
    """The full timestep plan at widths 8: the RFC's counts (192/771/6144 rows, 2060 sub-batches of 4096,
    2256 comparisons). Observed on this CPU (torch 2.13 with MKL): NOT invariant. MKL's fp32 GEMM takes a
    different path for one row than for a batch (already `x @ w.T` at K = 8 rounds differently), so nearly
    every row's forward and row gradient differs alone vs in a batch. The parameter gradients repeat run to
    run (same batch, same kernels, no atomics)."""
    found = run_default_plan_counts(OP.name, ("freq_dim=8", "hidden=8", "temb_dim=8"), DIFFUSERS)
    assert found.batch_invariant is False
    assert found.all_rows["64"].fwd_differ > 0 and found.all_rows["64"].rowgrad_differ > 0
    assert found.params_repeatable is True


def test_floor_bytes_match_operators_md():
    params = DEFAULT.inputs
    fixed = OP.floor_bytes(params, 0, backward=False)
    per_row = OP.floor_bytes(params, 1, backward=False) - fixed
    assert per_row == 1024 + 10752                                   # x in, out out (fp32)
    weights = 4 * (5376 * 256 + 5376 + 2688 * 5376 + 2688)
    assert fixed == weights == 63_340_032 and round(fixed / 1e6, 1) == 63.3   # "weights 63.3 MB fp32"
    assert OP.floor_bytes(params, 4096, backward=False) == 4096 * per_row + fixed
    # backward: dy in, x again, dx out per row; W1, b1, W2 read again and all four gradients written once
    fixed_bwd = OP.floor_bytes(params, 0, backward=True)
    assert OP.floor_bytes(params, 1, backward=True) - fixed_bwd == per_row + 10752 + 1024 + 1024
    assert fixed_bwd == 2 * weights + 4 * (5376 * 256 + 5376 + 2688 * 5376) == 190_009_344


# --- the rl-kernel row -------------------------------------------------------------------------------------

def test_rl_kernel_row_is_unavailable_on_cpu_with_a_reason(monkeypatch):
    reason = RL_KERNEL.try_load(CPU, DEFAULT.inputs)
    assert isinstance(reason, str) and ": " in reason
    assert "H3TimestepMLPCudaOp" in reason or "needs CUDA" in reason, reason
    monkeypatch.setitem(sys.modules, "rl_engine", None)
    reason = RL_KERNEL.try_load(CPU, DEFAULT.inputs)
    assert reason.startswith("ImportError: rl-kernel's H3TimestepMLPCudaOp is not importable "
                             "(ModuleNotFoundError: "), reason


# --- through the runner -------------------------------------------------------------------------------------

def test_quick_plan_through_the_runner():
    evidence = run(RunRequest(config=QUICK, device=CPU, adapters=[DIFFUSERS], modes=["plain"], out=None,
                              measure_bandwidth=False))
    row = evidence.results["plain"]["diffusers[plain]"]  # named as the RFC names it
    assert isinstance(row, RowResult), row
    assert row.has_backward is True and row.source.startswith("diffusers TimestepEmbedding")
    assert row.batch_invariance.params_repeatable is True
    assert_accuracy_within(row, QUICK, FP32_BOUND, GRADS)
    assert_evidence_round_trips(evidence, OP.name, QUICK)


def test_the_composition_row_carries_the_mode_in_its_name_as_the_rfc_names_it():
    assert OP.row_name("diffusers", "vllm") == "diffusers[vllm]"
    assert OP.row_name("diffusers", "plain") == "diffusers[plain]"
    assert OP.row_name("rl_kernel", "plain") == "rl_kernel" and OP.row_name("h3bench_triton", "sglang") == "h3bench_triton"
