"""Statistics and comparison primitives: medians, the wall-clock sampler, rel_err, bitwise rows."""
from __future__ import annotations

import math
import types

import pytest
import torch

from harness import timing
from harness.execute import bitwise_equal, rows_differ
from harness.probes.accuracy_latency import rel_err

CPU = torch.device("cpu")


# --- median -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("values,expected", [
    ([5.0], 5.0),
    ([3.0, 1.0, 2.0], 2.0),              # odd, unsorted
    ([9.0, 1.0, 8.0, 2.0, 7.0], 7.0),
    ([4.0, 1.0, 3.0, 2.0], 2.5),         # even, unsorted: mean of the middle two
    ([10.0, 0.0], 5.0),
    ([1.0, 1.0, 1.0, 100.0], 1.0),       # a median, not a mean
    ([3, 1, 2], 2.0),
])
def test_median(values, expected):
    got = timing.median(list(values))
    assert got == expected and isinstance(got, float)


def test_median_does_not_reorder_its_argument():
    values = [3.0, 1.0, 2.0]
    timing.median(values)
    assert values == [3.0, 1.0, 2.0]


def test_median_of_nothing_raises():
    with pytest.raises(ValueError, match="no samples"):
        timing.median([])


# --- sample, with a fake clock ------------------------------------------------------------------------

class FakeClock:
    """Time moves only when setup (1000 s) or step (0.25 s) runs; every event is logged."""

    SETUP_S, STEP_S = 1000.0, 0.25

    def __init__(self):
        self.now = 0.0
        self.log: list[str] = []

    def perf_counter(self) -> float:
        self.log.append("clock")
        return self.now

    def setup(self) -> None:
        self.log.append("setup")
        self.now += self.SETUP_S

    def step(self) -> None:
        self.log.append("step")
        self.now += self.STEP_S


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=fake.perf_counter))
    return fake


@pytest.mark.parametrize("warmup,reps", [(0, 1), (3, 5), (2, 100)])
def test_sample_with_setup(clock, warmup, reps):
    samples = timing.sample(clock.step, CPU, warmup=warmup, reps=reps, setup=clock.setup)
    assert samples.timer == timing.WALL_CLOCK
    assert len(samples.us) == reps
    assert samples.us == [clock.STEP_S * 1e6] * reps  # setup time never inside the timed region
    assert samples.median_us == clock.STEP_S * 1e6
    # setup before every step, warm-ups included; the clock read only around timed steps
    assert clock.log == ["setup", "step"] * warmup + ["setup", "clock", "step", "clock"] * reps


def test_sample_without_setup(clock):
    samples = timing.sample(clock.step, CPU, warmup=2, reps=3)
    assert samples.us == [250000.0] * 3
    assert clock.log == ["step"] * 2 + ["clock", "step", "clock"] * 3


def test_sample_median_of_varying_steps(clock):
    durations = iter([99.0, 1.0, 3.0, 2.0])  # the first is the warm-up

    def step():
        clock.now += next(durations)

    samples = timing.sample(step, CPU, warmup=1, reps=3)
    assert samples.us == [1e6, 3e6, 2e6]
    assert samples.median_us == 2e6


@pytest.mark.parametrize("reps", [0, -1])
def test_sample_needs_a_rep(clock, reps):
    with pytest.raises(ValueError, match="reps"):
        timing.sample(clock.step, CPU, warmup=1, reps=reps)
    assert clock.log == []  # refused before any warm-up


def test_timer_names():
    assert timing.timer_for(CPU) == timing.WALL_CLOCK
    assert timing.timer_for(torch.device("cuda")) == timing.CUDA_EVENTS


# --- rel_err ------------------------------------------------------------------------------------------

def test_rel_err_exact_is_zero():
    ref = torch.tensor([[1.0, -2.0], [0.5, 4.0]], dtype=torch.float64)
    assert rel_err(ref.to(torch.bfloat16), ref) == 0.0
    assert rel_err(ref.float(), ref) == 0.0


def test_rel_err_is_max_abs_error_over_max_abs_reference():
    ref = torch.tensor([-4.0, 1.0, 2.0], dtype=torch.float64)
    out = torch.tensor([-3.0, 1.5, 2.0], dtype=torch.bfloat16)
    assert rel_err(out, ref) == pytest.approx(1.0 / 4.0)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_rel_err_non_finite_output_is_infinite(bad):
    ref = torch.ones(3, 4, dtype=torch.float64)
    out = ref.clone().to(torch.bfloat16)
    out[2, 3] = bad
    assert rel_err(out, ref) == math.inf


def test_rel_err_zero_reference():
    ref = torch.zeros(2, 3, dtype=torch.float64)
    assert rel_err(torch.zeros(2, 3), ref) == 0.0
    # nothing to scale by: the absolute error, never a silent zero
    out = torch.zeros(2, 3)
    out[1, 2] = -0.5
    assert rel_err(out, ref) == 0.5
    assert rel_err(torch.empty(0, 3), torch.empty(0, 3, dtype=torch.float64)) == 0.0


# --- bitwise rows -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_negative_zero_differs(dtype):
    a = torch.tensor([[0.0, 1.0], [2.0, 3.0], [0.0, 0.0]], dtype=dtype)
    b = a.clone()
    b[0, 0] = -0.0
    assert a[0, 0] == b[0, 0]  # equal as numbers
    assert rows_differ(a, b).tolist() == [True, False, False]
    assert not bitwise_equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_same_nan_bits_are_equal(dtype):
    a = torch.tensor([[math.nan, 1.0], [2.0, math.nan]], dtype=dtype)
    b = a.clone()
    assert not torch.equal(a, b)  # NaN != NaN as numbers
    assert rows_differ(a, b).tolist() == [False, False]
    assert bitwise_equal(a, b)


def test_different_nan_payloads_differ():
    a = torch.tensor([[math.nan, 1.0], [2.0, 3.0]], dtype=torch.float32)
    b = a.clone()
    b.view(torch.int32)[0, 0] ^= 1  # still a NaN, another payload
    assert math.isnan(b[0, 0].item())
    assert rows_differ(a, b).tolist() == [True, False]


def test_rows_differ_one_bit_and_row_shape():
    a = torch.randn(4, 3, 5, generator=torch.Generator().manual_seed(0))
    b = a.clone()
    b.view(torch.int32)[2, 1, 4] ^= 1  # last mantissa bit of one element
    assert rows_differ(a, b).tolist() == [False, False, True, False]
    assert rows_differ(a, a.clone()).tolist() == [False] * 4


def test_rows_differ_non_contiguous():
    base = torch.randn(6, 4, generator=torch.Generator().manual_seed(1))
    a = base[::2]  # strided rows
    assert rows_differ(a, a.contiguous()).tolist() == [False] * 3


def test_shape_or_dtype_mismatch_differs_everywhere():
    a = torch.zeros(3, 2)
    assert rows_differ(a, torch.zeros(3, 3)).tolist() == [True] * 3
    assert rows_differ(a, torch.zeros(3, 2, dtype=torch.float64)).tolist() == [True] * 3
    assert not bitwise_equal(a, torch.zeros(3, 3))
    assert not bitwise_equal(a, torch.zeros(3, 2, dtype=torch.bfloat16))
