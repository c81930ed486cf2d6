"""Statistics and comparison primitives: medians, percentiles, the samplers (wall clock; synchronized and
stream on a simulated asynchronous device), interleaving rows, rel_err, bitwise rows."""
from __future__ import annotations

import math
import types

import pytest
import torch

from h3bench.harness import timing
from h3bench.harness.execute import bitwise_equal, rows_differ
from h3bench.harness.probes.accuracy_latency import rel_err

CPU = torch.device("cpu")
CUDA = torch.device("cuda")  # only named: the simulated device's clock replaces CUDA events


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


# --- take, with a fake wall clock ---------------------------------------------------------------------

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


@pytest.mark.parametrize("method", timing.METHODS)
@pytest.mark.parametrize("count", [1, 5, 100])
def test_wall_clock_take_with_setup(clock, method, count):
    samples = timing.take(clock.step, CPU, method, count, setup=clock.setup)
    assert samples == [clock.STEP_S * 1e6] * count  # setup time never inside the timed region
    # setup before every step; the clock read only around the timed step
    assert clock.log == ["setup", "clock", "step", "clock"] * count


def test_wall_clock_take_without_setup(clock):
    assert timing.take(clock.step, CPU, timing.SYNCHRONIZED, 3) == [250000.0] * 3
    assert clock.log == ["clock", "step", "clock"] * 3


@pytest.mark.parametrize("count", [0, -1])
def test_take_needs_a_sample(clock, count):
    with pytest.raises(ValueError, match="count"):
        timing.take(clock.step, CPU, timing.STREAM, count)
    assert clock.log == []  # refused before anything ran


def test_take_unknown_method(clock):
    with pytest.raises(ValueError, match="unknown sampling method"):
        timing.take(clock.step, CPU, "averaged", 3)


# --- synchronized against stream sampling, on a simulated asynchronous device -------------------------

class SimulatedDevice:
    """A host that spends `host_us` per step before queueing `device_us` of device work. Events are
    timestamped when the device reaches them in its queue; synchronize() makes the host wait for it."""

    def __init__(self, host_us: float, device_us: float):
        self.host_us, self.device_us = host_us, device_us
        self.now = 0.0          # host time
        self.busy_until = 0.0   # when the device finishes what is queued
        self.syncs = 0

    def step(self) -> None:
        self.now += self.host_us
        self.busy_until = max(self.now, self.busy_until) + self.device_us

    def event(self):
        device = self

        class Event:
            def record(self) -> None:
                self.t = max(device.now, device.busy_until)

            def elapsed_ms(self, end) -> float:
                return (end.t - self.t) / 1e3
        return Event()

    def synchronize(self) -> None:
        self.syncs += 1
        self.now = max(self.now, self.busy_until)


@pytest.mark.parametrize("host_us,device_us", [(20.0, 100.0), (100.0, 20.0), (50.0, 50.0)])
def test_synchronized_sample_includes_host_cost_stream_hides_it_when_the_host_keeps_ahead(host_us, device_us):
    sync = SimulatedDevice(host_us, device_us)
    samples = timing.take(sync.step, CUDA, timing.SYNCHRONIZED, 50, clock=sync)
    assert samples == [pytest.approx(host_us + device_us)] * 50  # from an idle device: host + device
    assert sync.syncs == 100  # before and after every sample

    stream = SimulatedDevice(host_us, device_us)
    samples = timing.take(stream.step, CUDA, timing.STREAM, 50, clock=stream)
    assert stream.syncs == 2
    # back to back: the first sample starts from an idle device; then the slower side sets the pace
    assert samples[0] == pytest.approx(host_us + device_us)
    assert timing.median(samples) == pytest.approx(max(host_us, device_us))


def test_setup_runs_outside_both_timed_regions():
    device = SimulatedDevice(10.0, 40.0)

    def setup() -> None:
        device.now += 1000.0  # expensive host work before each sample

    for method in timing.METHODS:
        samples = timing.take(device.step, CUDA, method, 20, setup=setup, clock=device)
        assert max(samples) <= 50.0 + 1e-9, method


# --- the L2 flush between samples -------------------------------------------------------------------------

def test_wall_clock_flush_runs_once_per_sample_after_setup_outside_the_timed_region(clock):
    def flush() -> None:
        clock.log.append("flush")
        clock.now += 500.0

    samples = timing.take(clock.step, CPU, timing.SYNCHRONIZED, 4, setup=clock.setup, flush=flush)
    assert samples == [clock.STEP_S * 1e6] * 4
    assert clock.log == ["setup", "flush", "clock", "step", "clock"] * 4


def test_device_flush_is_finished_before_the_sample_starts():
    device = SimulatedDevice(10.0, 40.0)
    flushes = []

    def flush() -> None:  # queues 1000 us of device work, as zeroing a 256 MiB buffer does
        flushes.append(device.now)
        device.busy_until = max(device.now, device.busy_until) + 1000.0

    samples = timing.take(device.step, CUDA, timing.SYNCHRONIZED, 20, clock=device, flush=flush)
    assert len(flushes) == 20
    assert samples == [pytest.approx(50.0)] * 20  # the flush's device time lands in no sample


def test_back_to_back_samples_refuse_a_flush(clock):
    with pytest.raises(ValueError, match="synchronized samples only"):
        timing.take(clock.step, CPU, timing.STREAM, 3, flush=lambda: None)
    assert clock.log == []


def test_interleave_flushes_before_every_timed_sample_and_never_in_the_warm_up(clock):
    log = []
    subjects = [timing.Subject(key, lambda key=key: log.append(key)) for key in ("a", "b")]
    timing.interleave(subjects, CPU, timing.SYNCHRONIZED, warmup=3, reps=5, repeats=2, block=2,
                      flush=lambda: log.append("flush"))
    assert log[:6] == ["a"] * 3 + ["b"] * 3  # warm-up: no flush
    timed = log[6:]
    assert len(timed) == 2 * (2 * 5 * 2)  # a flush and a step per sample: 2 rows x 5 samples x 2 timings
    assert timed[0::2] == ["flush"] * 20 and "flush" not in timed[1::2]


def test_l2_flush_zeroes_its_whole_buffer():
    flush = timing.L2Flush(CPU, nbytes=4096)
    flush.buffer.fill_(7)
    flush()
    assert flush.buffer.numel() * flush.buffer.element_size() == 4096
    assert int(flush.buffer.abs().sum()) == 0


def test_no_graph_capture_on_a_cpu():
    assert timing.graph_capture_for(CPU) is None
    assert timing.graph_capture_for(torch.device("cuda")) is timing.capture_cuda_graph


# --- percentiles and spreads --------------------------------------------------------------------------

@pytest.mark.parametrize("values,q,expected", [
    ([5.0], 10, 5.0),
    ([1.0, 2.0, 3.0, 4.0, 5.0], 50, 3.0),
    ([1.0, 2.0, 3.0, 4.0, 5.0], 10, 1.4),        # rank 0.4: 1 + 0.4 * (2 - 1)
    ([1.0, 2.0, 3.0, 4.0, 5.0], 90, 4.6),
    ([5.0, 1.0, 4.0, 2.0, 3.0], 90, 4.6),        # unsorted input
    ([10.0, 20.0], 10, 11.0),
    ([10.0, 20.0], 0, 10.0),
    ([10.0, 20.0], 100, 20.0),
    (list(range(101)), 10, 10.0),
    (list(range(101)), 90, 90.0),
])
def test_percentile_interpolates_linearly_as_numpy(values, q, expected):
    import numpy as np

    assert timing.percentile(values, q) == pytest.approx(expected)
    assert timing.percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_percentile_errors():
    with pytest.raises(ValueError, match="no samples"):
        timing.percentile([], 50)
    with pytest.raises(ValueError, match="q must be"):
        timing.percentile([1.0], 101)


def test_spread_of_holds_the_percentiles_and_count():
    spread = timing.spread_of([float(v) for v in range(1, 11)])
    assert (spread.p10, spread.p50, spread.p90, spread.n) == (pytest.approx(1.9), 5.5, pytest.approx(9.1), 10)
    assert spread.p50 == timing.median([float(v) for v in range(1, 11)])


# --- interleaving rows --------------------------------------------------------------------------------

def test_interleave_warms_every_row_then_rotates_blocks_and_keeps_repeats_apart(clock):
    log = []

    def subject(key: str) -> timing.Subject:
        def step() -> None:
            log.append(key)
            clock.now += {"a": 1.0, "b": 2.0, "c": 3.0}[key]
        return timing.Subject(key, step)

    found = timing.interleave([subject("a"), subject("b"), subject("c")], CPU, timing.SYNCHRONIZED, warmup=1,
                              reps=5, repeats=2, block=2)
    warm, timed = log[:3], log[3:]
    assert warm == ["a", "b", "c"]
    # 5 samples in blocks of 2: rounds of 2, 2, 1 samples; the first row of each round rotates
    one_repeat = (["a"] * 2 + ["b"] * 2 + ["c"] * 2 + ["b"] * 2 + ["c"] * 2 + ["a"] * 2
                  + ["c"] + ["a"] + ["b"])
    assert timed == one_repeat * 2
    for key, seconds in (("a", 1.0), ("b", 2.0), ("c", 3.0)):
        assert found[key].error is None
        assert found[key].samples == [[seconds * 1e6] * 5] * 2


def test_interleave_drops_a_failing_row_and_keeps_the_others(clock):
    calls = {"bad": 0}

    class Broken(Exception):
        pass

    def bad() -> None:
        calls["bad"] += 1
        if calls["bad"] == 3:  # fails in the timed rounds, after its warm-up
            raise Broken("third call")

    def good() -> None:
        clock.now += 1.0

    found = timing.interleave([timing.Subject("bad", bad), timing.Subject("good", good)], CPU, timing.STREAM,
                              warmup=1, reps=4, repeats=2, block=1, on_error=Broken)
    assert isinstance(found["bad"].error, Broken)
    assert found["good"].error is None and found["good"].samples == [[1e6] * 4] * 2
    assert calls["bad"] == 3  # never called again once it failed


def test_interleave_refuses_duplicate_keys():
    with pytest.raises(ValueError, match="unique"):
        timing.interleave([timing.Subject("a", lambda: None)] * 2, CPU, timing.STREAM, 0, 1, 1, 1)


def test_rounds_for():
    assert [timing.rounds_for(reps, 20) for reps in (1, 20, 21, 100)] == [1, 1, 2, 5]


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
