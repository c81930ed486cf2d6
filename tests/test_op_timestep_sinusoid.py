"""timestep_sinusoid: inputs, float64 reference, the diffusers replay's accuracy, the RFC's counts, the memory
floor, the CUDA-only rows' reasons on a CPU, and one quick run through the runner."""
from __future__ import annotations

import dataclasses
import math
import sys

import pytest
import torch

from h3bench.adapters import builtin_adapters
from h3bench.adapters.timestep_sinusoid.diffusers import ADAPTER as DIFFUSERS
from h3bench.adapters.timestep_sinusoid.rl_kernel import ADAPTER as RL_KERNEL
from h3bench.adapters.timestep_sinusoid.sglang import ADAPTER as SGLANG
from h3bench.harness.config import ConfigError, load_config
from h3bench.harness.execute import bitwise_equal, execute
from h3bench.harness.ops import get_op
from h3bench.harness.ops.timestep_sinusoid import TimestepSinusoidParams
from h3bench.harness.probes.accuracy_latency import combined_rel_err
from h3bench.harness.runner import RunRequest, run
from h3bench.harness.schema import RowResult
from tests.helpers import CPU, assert_evidence_round_trips, assert_no_differences, run_default_plan_counts
from tests.helpers import one_thread  # noqa: F401 (a fixture: pytest finds it in this module)

OP = get_op("timestep_sinusoid")
DEFAULT = load_config(OP.name)
QUICK = load_config(OP.name, quick=True)
U32 = 2.0 ** -24  # fp32 unit roundoff


def test_declarations_and_configs():
    assert OP.input_names == ("t",) and OP.row_inputs == ("t",) and OP.differentiable == ()
    assert OP.outputs == ("out",) and OP.plan_set == "sinusoid" and OP.reference_variants == (OP.name,)
    assert DEFAULT.plans == "sinusoid" and not DEFAULT.quick
    assert DEFAULT.inputs == TimestepSinusoidParams(freq_dim=256, max_period=10000, downscale_freq_shift=0.0)
    assert QUICK.quick and QUICK.plans == "quick" and QUICK.inputs.freq_dim == 16
    assert [a.name for a in builtin_adapters(OP.name)] == ["diffusers", "sglang", "rl_kernel", "h3bench_triton", "torch_compile", "torch_compile_max_autotune"]
    assert all(a.grads == () for a in builtin_adapters(OP.name))


@pytest.mark.parametrize("changes, message", [({"freq_dim": 255}, "even"), ({"freq_dim": 0}, ">= 1"),
                                              ({"max_period": 1}, ">= 2"),
                                              ({"downscale_freq_shift": 128.0}, "< freq_dim / 2")])
def test_params_are_checked(changes, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(DEFAULT.inputs, **changes)
    key, value = next(iter(changes.items()))
    with pytest.raises(ConfigError, match=message):
        load_config(OP.name, overrides=(f"{key}={value}",))


# --- inputs ---------------------------------------------------------------------------------------------

def test_inputs(device):
    params = DEFAULT.inputs
    inputs = OP.make_inputs(params, 1000, 3, device)
    t = inputs.tensors["t"]
    assert inputs.rows == 1000 and inputs.row_names == ("t",)
    assert t.shape == (1000,) and t.dtype == torch.float32 and t.stride() == (1,) and t.device.type == device.type
    assert 0.0 <= t.min().item() and t.max().item() < 1.0 and t.std().item() > 0.2  # uniform in [0, 1)
    assert bitwise_equal(t, OP.make_inputs(params, 1000, 3, device).tensors["t"])
    assert not torch.equal(t, OP.make_inputs(params, 1000, 4, device).tensors["t"])
    (g,) = OP.make_grad_outs(params, 1000, 9, device)
    assert g.shape == (1000, 256) and g.dtype == torch.float32
    assert bitwise_equal(g, OP.make_grad_outs(params, 1000, 9, device)[0])


# --- reference ------------------------------------------------------------------------------------------

def test_reference_is_the_formula_in_float64():
    params = TimestepSinusoidParams(freq_dim=8, max_period=10000, downscale_freq_shift=0.0)
    inputs = OP.make_inputs(params, 5, 3, CPU)
    ref = OP.reference(params, inputs, None, (), OP.name)
    assert ref.grads == {} and len(ref.outputs) == 1
    (out,) = ref.outputs
    assert out.dtype == torch.float64 and out.shape == (5, 8)
    for r, t in enumerate(inputs.tensors["t"].tolist()):
        for k in range(4):
            f = math.exp(-math.log(10000) * k / 4)
            assert out[r, k].item() == pytest.approx(math.cos(t * f), rel=1e-15, abs=1e-15)
            assert out[r, 4 + k].item() == pytest.approx(math.sin(t * f), rel=1e-15, abs=1e-15)
    # at the model's size the frequencies are exp(-ln(10000) k / 128) (docs/operators.md, timestep_sinusoid)
    t = torch.tensor([1.0])
    full = OP.reference(DEFAULT.inputs, OP.bundle({"t": t}), None, (), OP.name).outputs[0][0]
    k = torch.arange(128, dtype=torch.float64)
    freqs = torch.exp(-math.log(10000) * k / 128)
    assert torch.allclose(full, torch.cat([torch.cos(freqs), torch.sin(freqs)]), rtol=0, atol=1e-15)
    # the shift divides by half - shift
    shifted = dataclasses.replace(params, downscale_freq_shift=1.0)
    out = OP.reference(shifted, OP.bundle({"t": t}), None, (), OP.name).outputs[0][0]
    assert out[3].item() == pytest.approx(math.cos(math.exp(-math.log(10000) * 3 / 3)), rel=1e-15)


def test_reference_rejects_unknown_variants_and_gradients():
    inputs = OP.make_inputs(QUICK.inputs, 3, 3, CPU)
    with pytest.raises(ValueError, match="unknown reference variant"):
        OP.reference(QUICK.inputs, inputs, None, (), "rms_norm")
    with pytest.raises(ValueError, match="no gradients"):
        OP.reference(QUICK.inputs, inputs, None, ("t",), OP.name)


# --- the diffusers row ----------------------------------------------------------------------------------

@pytest.mark.parametrize("config", [QUICK, DEFAULT], ids=["quick", "model"])
def test_diffusers_row_is_within_fp32_rounding(config, device):
    """Each element: the fp32 exponent (-ln(10000) k rounded, /half exact, exp within ~1 ulp), the product
    t f (one rounding) and sin/cos (within ~1 ulp) put an absolute error of a few u = 2^-24 on values of
    magnitude <= 1 with arguments < 1; 8u is a safe bound per element."""
    fn = DIFFUSERS.load(device, config.inputs).fn
    for rows in config.accuracy.rows:
        inputs = OP.make_inputs(config.inputs, rows, config.accuracy.input_seed, device)
        out = execute(fn, inputs, None, (), 1)
        (ref,) = OP.reference(config.inputs, inputs, None, (), OP.name).outputs
        assert out.outputs[0].dtype == torch.float32 and out.outputs[0].shape == ref.shape
        assert (out.outputs[0].double() - ref).abs().max().item() <= 8 * U32
        assert combined_rel_err(out.outputs, (ref,)) <= 8 * U32


def test_diffusers_replay_is_the_real_diffusers():
    """Bitwise the same as diffusers' own Timesteps, when diffusers is installed."""
    embeddings = pytest.importorskip("diffusers.models.embeddings")
    t = OP.make_inputs(DEFAULT.inputs, 300, 3, CPU).tensors["t"]
    real = embeddings.Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=0)(t)
    assert bitwise_equal(DIFFUSERS.load(CPU, DEFAULT.inputs).fn(t), real)


# --- counts, floor ---------------------------------------------------------------------------------------

def test_default_plan_counts_and_cpu_verdict(one_thread):
    """The full sinusoid plan at freq_dim 8: the RFC's counts (192/771/6144 rows, a full batch of 8192,
    2060 sub-batches, 2256 comparisons). Observed on the CPU: invariant. Every output element is computed
    from its own t by elementwise kernels (the 8 frequencies come from the same arange/exp every call),
    so nothing depends on the batch; no parameters, so params_repeatable is None."""
    found = run_default_plan_counts(OP.name, ("freq_dim=8",), DIFFUSERS)
    assert_no_differences(found, params_repeatable=None)


def test_floor_bytes_match_operators_md():
    params = DEFAULT.inputs
    assert OP.floor_bytes(params, 0, backward=False) == 0                      # fixed: 0
    assert OP.floor_bytes(params, 1, backward=False) == 4 + 1024               # 4 in + 1024 out
    assert OP.floor_bytes(params, 8192, backward=False) == 8192 * 1028
    assert OP.floor_bytes(params, 8192, backward=True) == 8192 * 1028          # no backward


# --- rows that need CUDA or rl-kernel -----------------------------------------------------------------------

def test_cuda_rows_are_unavailable_on_cpu_with_a_reason(monkeypatch):
    reason = SGLANG.try_load(CPU, DEFAULT.inputs)
    assert reason == "RuntimeError: needs CUDA (SGLang's JIT-compiled CUDA kernel), got device cpu"
    reason = RL_KERNEL.try_load(CPU, DEFAULT.inputs)
    assert isinstance(reason, str) and ": " in reason
    assert "H3TimestepSinusoidCudaOp" in reason or "needs CUDA" in reason, reason
    # without rl_engine the reason names the op and why it is missing
    monkeypatch.setitem(sys.modules, "rl_engine", None)
    reason = RL_KERNEL.try_load(CPU, DEFAULT.inputs)
    assert reason.startswith("ImportError: rl-kernel's H3TimestepSinusoidCudaOp is not importable "
                             "(ModuleNotFoundError: "), reason
    assert "rl_engine" in reason.split("(", 1)[1]


# --- through the runner -------------------------------------------------------------------------------------

def test_quick_plan_through_the_runner():
    evidence = run(RunRequest(config=QUICK, device=CPU, adapters=[DIFFUSERS], modes=["plain"], out=None,
                              measure_bandwidth=False))
    row = evidence.results["plain"]["diffusers"]
    assert isinstance(row, RowResult), row
    assert row.has_backward is False and row.source.startswith("diffusers Timesteps")
    assert row.batch_invariance.batch_invariant is True and row.batch_invariance.params_repeatable is None
    assert sorted(row.accuracy_latency, key=int) == [str(r) for r in QUICK.accuracy.rows]
    for size in row.accuracy_latency.values():
        assert size.fwd_rel_err <= 8 * U32 and size.grad_rel_err is None and size.fwd_bwd_us is None
    assert_evidence_round_trips(evidence, OP.name, QUICK)
