"""Our Triton timestep_sinusoid (kernels/timestep_sinusoid_kernel.py): error <= 1e-7 against float64 for every t
and every frequency, bitwise batch invariance, and its argument errors."""
import pytest
import torch

from h3bench.harness.execute import as_bits
from h3bench.harness.ops.timestep_sinusoid import TimestepSinusoidParams, sinusoid64
from h3bench.harness.probes.accuracy_latency import rel_err
from h3bench.kernels.timestep_sinusoid_api import timestep_sinusoid
from h3bench.kernels.timestep_sinusoid_kernel import LaunchConfig, config_for
from tests.helpers import gapped, run_quick_plan, within

MODEL = TimestepSinusoidParams(freq_dim=256, max_period=10000, downscale_freq_shift=0.0)
BOUND = 1e-7  # the target: max|out - ref| / max|ref|; one fp32 rounding of values <= 1 costs <= 2^-25 ~ 3e-8


def sample_t(device, n=20000, seed=0):
    """Many t in [0, 1) and the edges: 0, subnormal and tiny t, values next to 1, 0.5 and its neighbours."""
    gen = torch.Generator().manual_seed(seed)
    edges = torch.tensor([0.0, 1e-45, 1e-38, 1e-20, 1e-7, 2 ** -24, 0.5, 0.5 - 2 ** -25, 0.5 + 2 ** -24,
                          1 - 2 ** -24, 0.999, 0.25, 0.75], dtype=torch.float32)
    return torch.cat([edges, torch.rand(n, generator=gen)]).to(device)


def test_error_within_1e7_for_every_t_and_k(device):
    t = sample_t(device)
    out = timestep_sinusoid(t)
    ref = sinusoid64(t, MODEL)
    assert out.shape == (t.shape[0], 256) and out.dtype == torch.float32
    assert rel_err(out, ref) <= BOUND
    # per element too: every output is within 2^-25 of its value plus float64 noise (one fp32 rounding)
    assert within(out, ref, ref.abs() * 2 ** -24 + 1e-15)


def test_error_within_1e7_for_large_t_and_other_constants(device):
    gen = torch.Generator().manual_seed(1)
    t = (torch.rand(2000, generator=gen) * 1000).to(device)  # angles up to 1000 rad
    assert rel_err(timestep_sinusoid(t), sinusoid64(t, MODEL)) <= BOUND
    for freq_dim, period, shift in ((16, 10000, 0.0), (6, 100, 1.0), (2, 10000, 0.0), (320, 5000, 0.5)):
        p = TimestepSinusoidParams(freq_dim=freq_dim, max_period=period, downscale_freq_shift=shift)
        out = timestep_sinusoid(t[:64], freq_dim, period, shift)
        assert out.shape == (64, freq_dim)
        assert rel_err(out, sinusoid64(t[:64], p)) <= BOUND, (freq_dim, period, shift)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_t_dtypes_and_strides(device, dtype):
    t = sample_t(device, 300).to(dtype)[::2]  # a stride-2 view
    assert t.stride(0) == 2
    assert rel_err(timestep_sinusoid(t), sinusoid64(t, MODEL)) <= BOUND


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_strided_t_gives_the_contiguous_bits(device, dtype):
    """t as every other element of a NaN-filled buffer: bitwise the output of a contiguous t (a kernel
    reading the gaps would give NaN rows)."""
    t = sample_t(device, 20).to(dtype)
    strided = gapped(t)
    assert strided.stride(0) == 2 and torch.equal(strided, t)
    assert torch.equal(as_bits(timestep_sinusoid(strided, 10)), as_bits(timestep_sinusoid(t, 10)))


def test_row_alone_equals_row_in_batch_and_many_programs(device):
    t = sample_t(device, 3000)
    out = timestep_sinusoid(t)
    small = timestep_sinusoid(t, config=LaunchConfig(rows=2, warps=1))  # 1507 programs
    assert torch.equal(as_bits(small), as_bits(out))
    for r in (0, 1, 5, 1000, t.shape[0] - 1):
        assert torch.equal(as_bits(timestep_sinusoid(t[r:r + 1])[0]), as_bits(out[r]))
    assert torch.equal(as_bits(timestep_sinusoid(t[7:300])), as_bits(out[7:300]))


@pytest.mark.parametrize("rows", [1, 3, 777, 2048])
def test_the_gpu_block_gives_the_same_bits(device, rows):
    """The GPU's default block ([8, 128] angles on 4 warps at 256 features) gives the bits of the
    interpreter's larger one: each element is the same float64 sequence on (t, f_k)."""
    t = sample_t(device, rows)[-rows:]
    t[1::2] *= 1000  # angles up to 1000 rad too
    gpu = config_for(256, interpreted=False)
    assert (gpu.rows, gpu.warps) == (8, 4)
    out = timestep_sinusoid(t, config=gpu)
    assert out.shape == (rows, 256) and torch.equal(as_bits(out), as_bits(timestep_sinusoid(t)))


@pytest.mark.parametrize("bad", [LaunchConfig(rows=3, warps=4), LaunchConfig(rows=0, warps=4),
                                 LaunchConfig(rows=8, warps=3)])
def test_bad_config_names_the_field(device, bad):
    with pytest.raises(ValueError, match="must be a power of two"):
        timestep_sinusoid(torch.rand(4, device=device), config=bad)


def test_zero_rows(device):
    out = timestep_sinusoid(torch.zeros(0, device=device))
    assert out.shape == (0, 256) and out.dtype == torch.float32


@pytest.mark.parametrize("call,error,match", [
    (lambda t: timestep_sinusoid(t.tolist()), TypeError, "t must be a torch.Tensor"),
    (lambda t: timestep_sinusoid(t.int()), TypeError, "t has dtype"),
    (lambda t: timestep_sinusoid(t[:, None]), ValueError, "t must be 1-D"),
    (lambda t: timestep_sinusoid(t.to("meta")), ValueError, "t is on meta"),
    (lambda t: timestep_sinusoid(t, 255), ValueError, "freq_dim must be an even int"),
    (lambda t: timestep_sinusoid(t, 0), ValueError, "freq_dim must be an even int"),
    (lambda t: timestep_sinusoid(t, 256, 1), ValueError, "max_period must be finite and > 1"),
    (lambda t: timestep_sinusoid(t, 256, float("inf")), ValueError, "max_period must be finite and > 1"),
    (lambda t: timestep_sinusoid(t, 256, float("nan")), ValueError, "max_period must be finite and > 1"),
    (lambda t: timestep_sinusoid(t, 256, "10000"), TypeError, "max_period must be a real number"),
    (lambda t: timestep_sinusoid(t, 256, 10000, 128.0), ValueError, "downscale_freq_shift must be finite and < "),
    (lambda t: timestep_sinusoid(t, 256, 10000, float("-inf")), ValueError, "downscale_freq_shift must be finite"),
    (lambda t: timestep_sinusoid(t, 256, 10000, None), TypeError, "downscale_freq_shift must be a real number"),
])
def test_bad_input_names_the_argument(device, call, error, match):
    with pytest.raises(error, match=match):
        call(torch.rand(4, device=device))


def test_quick_plan_through_the_runner(device):
    from h3bench.adapters.timestep_sinusoid.h3bench_triton import ADAPTER

    row = run_quick_plan("timestep_sinusoid", ADAPTER, device, params_repeatable=None)  # no parameters
    for size in row.accuracy_latency.values():
        assert size.fwd_rel_err <= BOUND
