"""CUDA-graph figures and peak memory in `time_rows`: with an injected capture on the CPU (a row whose step
cannot be captured or replayed gets the reason per figure and keeps its other figures; a harness error
propagates), and on a GPU with torch's capture (timestep_sinusoid's rows, a row that calls .item(), a
captured backward writing the eager gradients)."""
from __future__ import annotations

import dataclasses
import math
import weakref

import pytest
import torch

from h3bench.harness import timing
from h3bench.harness.config import AccuracyPlan, TimingPlan, load_config
from h3bench.harness.ops import all_ops, get_op
from h3bench.harness.peak_memory import Readers
from h3bench.harness.probes import accuracy_latency as acc
from h3bench.harness.schema import FIGURES, SizeResult
from tests.helpers import composition, needs_cuda, nm_params

CPU = torch.device("cpu")
GRADS = ("x", "w", "sh", "sc")
OP = get_op("norm_modulate")
PLAN = AccuracyPlan(rows=(5,), input_seed=11, grad_seed=9)
TIMING = TimingPlan(warmup=1, reps=2, repeats=2, block=1)
NOT_PERMITTED = "CUDA error: operation not permitted when stream is capturing"
GRAPH_KEYS = [f"{f}_graph_us" for f in FIGURES] + [f"{f}_graph_us_repeat" for f in FIGURES]


class FakeCapture:
    """Runs the step once "under capture" (setup first, as the real capture does); the replay runs it again."""

    def __init__(self, end_error: str = ""):
        self.capturing = False
        self.end_error = end_error
        self.replays = 0

    def __call__(self, step, setup):
        if setup is not None:
            setup()
        self.capturing = True
        try:
            step()
        finally:
            self.capturing = False
            if self.end_error:   # the capture's own end fails after the step's error, as torch's does
                raise RuntimeError(self.end_error)

        def replay() -> None:
            self.replays += 1
            step()
        return replay


def syncing(capture: FakeCapture):
    """The composition, but it synchronizes (what .item() does), which a capture forbids."""
    def fn(x, w, sh, sc, idx):
        if capture.capturing:
            raise RuntimeError(NOT_PERMITTED)
        return composition(x, w, sh, sc, idx)
    return fn


def timed_rows(**fns) -> list[acc.TimedRow]:
    return [acc.TimedRow(name=name, fn=fn, grads=GRADS, sizes={"5": SizeResult(fwd_rel_err=0.0, fwd_us=math.nan)})
            for name, fn in fns.items()]


def time(rows, **kwargs) -> None:
    acc.time_rows(OP, nm_params(hidden=16), rows, PLAN, TIMING, CPU, None, **kwargs)


def test_a_row_that_cannot_be_captured_gets_the_reason_per_figure_and_keeps_its_other_figures():
    capture = FakeCapture()
    rows = timed_rows(honest=composition, syncs=syncing(capture))
    time(rows, graph_capture=capture)
    honest, syncs = (r.sizes["5"] for r in rows)
    assert all(r.error is None for r in rows)
    for key in GRAPH_KEYS:
        assert getattr(honest, key) > 0, key
        assert honest.spread[key].n == TIMING.reps
        assert getattr(syncs, key) is None, key
    assert honest.graph_unavailable is None
    assert syncs.graph_unavailable == {f: f"RuntimeError: {NOT_PERMITTED}" for f in FIGURES}
    for key in ("fwd_us", "fwd_stream_us", "fwd_bwd_us", "fwd_bwd_net_us", "fwd_bwd_net_stream_us"):
        assert getattr(syncs, key) > 0, key
    # the honest row's replays: warm-up plus samples, each figure
    assert capture.replays == len(FIGURES) * (TIMING.warmup + TIMING.reps * TIMING.repeats)


def test_a_capture_that_fails_after_the_steps_error_names_both():
    capture = FakeCapture(end_error="CUDA error: operation failed due to a previous error during capture")
    rows = timed_rows(syncs=syncing(capture))
    time(rows, graph_capture=capture)
    assert rows[0].sizes["5"].graph_unavailable["fwd"] == (
        f"RuntimeError: {NOT_PERMITTED}; then RuntimeError: CUDA error: operation failed due to a previous "
        "error during capture")


def test_a_replay_that_fails_is_the_figures_reason_not_the_rows():
    def capture(step, setup):
        def replay() -> None:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return replay

    rows = timed_rows(row=composition)
    time(rows, graph_capture=capture)
    result = rows[0].sizes["5"]
    assert rows[0].error is None and result.fwd_us > 0 and result.fwd_bwd_net_us > 0
    assert result.graph_unavailable == {f: "RuntimeError: CUDA error: an illegal memory access was encountered"
                                        for f in FIGURES}
    assert all(getattr(result, key) is None for key in GRAPH_KEYS)


def test_a_harness_error_in_the_capture_propagates():
    def capture(step, setup):
        raise TypeError("capture() got an unexpected keyword argument")

    with pytest.raises(TypeError, match="unexpected keyword"):
        time(timed_rows(row=composition), graph_capture=capture)


def test_without_a_capture_or_counters_there_are_no_graph_or_peak_figures():
    rows = timed_rows(row=composition)
    time(rows)
    result = rows[0].sizes["5"]
    assert result.fwd_us > 0 and result.graph_unavailable is None
    assert all(getattr(result, key) is None for key in GRAPH_KEYS)
    assert all(getattr(result, f"{f}_peak_bytes") is None for f in FIGURES)


def test_peak_figures_come_from_the_counters_once_per_row_and_figure():
    calls = []
    allocated = {"now": 1000}
    readers = Readers(allocated=lambda: allocated["now"], peak=lambda: allocated["now"] + 64,
                      reset_peak=lambda: calls.append("reset"), synchronize=lambda: None)
    rows = timed_rows(a=composition, b=composition)
    time(rows, memory=readers)
    for row in rows:
        assert [getattr(row.sizes["5"], f"{f}_peak_bytes") for f in FIGURES] == [64, 64, 64]
    assert len(calls) == len(rows) * len(FIGURES)


def test_latency_units_count_the_graph_rounds():
    plain = acc.latency_units(PLAN, TIMING)
    assert acc.latency_units(PLAN, TIMING, graph=True) == plain * 3 // 2


# --- on a GPU, with torch's capture ------------------------------------------------------------------------

cuda = needs_cuda("CUDA graphs and memory counters need a CUDA device")


@cuda
def test_timestep_sinusoid_rows_have_graph_figures_within_bounds_of_the_synchronized_ones():
    from h3bench.adapters.timestep_sinusoid.diffusers import ADAPTER as DIFFUSERS
    from h3bench.adapters.timestep_sinusoid.h3bench_triton import ADAPTER as TRITON
    from h3bench.harness.runner import GRAPH_METHOD, RunRequest, run
    from h3bench.harness.schema import RowResult

    config = load_config("timestep_sinusoid", quick=True)
    config = dataclasses.replace(config, timing=TimingPlan(warmup=10, reps=40, repeats=1, block=10, graph=True))
    evidence = run(RunRequest(config=config, device=torch.device("cuda"), adapters=[TRITON, DIFFUSERS],
                              modes=["plain"], out=None, measure_bandwidth=False))
    assert evidence.environment.timing.graph == GRAPH_METHOD
    for name in ("h3bench_triton", "diffusers"):
        row = evidence.results["plain"][name]
        assert isinstance(row, RowResult), row
        for size, result in row.accuracy_latency.items():
            assert result.graph_unavailable is None, (name, size, result.graph_unavailable)
            assert 0 < result.fwd_graph_us <= result.fwd_us * 1.5, (name, size, result.fwd_graph_us, result.fwd_us)
            assert result.fwd_peak_bytes > 0, (name, size)


@cuda
def test_a_row_calling_item_is_not_captured_and_keeps_its_figures():
    device = torch.device("cuda")

    def reads_a_value(x, w, sh, sc, idx):
        if x.float().abs().max().item() < 0:   # a host read: forbidden under capture
            raise AssertionError("unreachable")
        return composition(x, w, sh, sc, idx)

    rows = timed_rows(honest=composition, reads=reads_a_value)
    acc.time_rows(OP, nm_params(hidden=64), rows, PLAN, TIMING, device, None,
                  graph_capture=timing.capture_cuda_graph)
    honest, reads = (r.sizes["5"] for r in rows)
    assert all(r.error is None for r in rows)
    assert honest.graph_unavailable is None and all(getattr(honest, k) > 0 for k in GRAPH_KEYS)
    assert set(reads.graph_unavailable) == set(FIGURES), reads.graph_unavailable
    assert all(reason for reason in reads.graph_unavailable.values())
    assert reads.fwd_us > 0 and reads.fwd_bwd_net_us > 0


@cuda
def test_a_captured_backward_writes_the_eager_gradients_and_follows_its_inputs():
    device = torch.device("cuda")
    params = nm_params(hidden=64)
    inputs = OP.make_inputs(params, 9, 11, device)
    leaves = [t.detach().requires_grad_() if n in GRADS else t for n, t in inputs.tensors.items()]
    ones = torch.ones(9, 64, dtype=leaves[0].dtype, device=device)

    def eager_grads() -> list[torch.Tensor]:
        fresh = [t.detach().clone().requires_grad_() if n in GRADS else t
                 for n, t in zip(inputs.tensors, leaves)]
        torch.autograd.backward(composition(*fresh), ones)
        return [t.grad.clone() for n, t in zip(inputs.tensors, fresh) if n in GRADS]

    def clear() -> None:
        for leaf in leaves:
            leaf.grad = None

    replay = timing.capture_cuda_graph(lambda: torch.autograd.backward(composition(*leaves), ones), clear)
    for _ in range(2):
        replay()
        torch.cuda.synchronize()
        got = [t.grad for n, t in zip(inputs.tensors, leaves) if n in GRADS]
        expected = eager_grads()
        # x's gradient is a per-row computation: bitwise the eager one; the table gradients are sums by
        # atomics in torch's index_select backward, equal up to their order
        assert torch.equal(got[0].view(torch.int16), expected[0].view(torch.int16))
        assert all(torch.allclose(g.float(), e.float(), rtol=1e-2, atol=1e-2) for g, e in zip(got, expected))
        with torch.no_grad():
            leaves[0].mul_(0.5)   # new contents in place: the next replay reads them


@cuda
def test_a_replay_keeps_what_its_step_read_alive_when_the_cache_is_emptied():
    # The fwd_bwd_net figure's leaves and upstream gradients live only in its step's closure. A replay that
    # let them go read freed memory, and once another capture emptied the allocator's cache, unmapped
    # memory: "an illegal memory access". 256 MiB take a segment of their own, which empty_cache returns.
    from h3bench.harness.timing import capture_cuda_graph

    device = torch.device("cuda")
    n = 32 << 20

    def captured():
        x = torch.full((n,), 2, dtype=torch.int64, device=device)
        out = torch.zeros(1, dtype=torch.int64, device=device)

        def step():
            torch.sum(x, dim=0, keepdim=True, out=out)
        return capture_cuda_graph(step), weakref.ref(x), out

    replay, x_alive, out = captured()
    assert x_alive() is not None
    torch.cuda.empty_cache()
    other = torch.full((n,), 7, dtype=torch.int64, device=device)  # where x was, had it been freed
    out.zero_()
    replay()
    torch.cuda.synchronize()
    assert out.item() == 2 * n
    del other


@cuda
@pytest.mark.parametrize("op_name", all_ops())
def test_every_ops_rows_are_captured_together_and_the_device_stays_usable(op_name):
    # Several rows captured one after another is what ended full-plan runs in an illegal memory access
    # (each capture empties the allocator's cache under the earlier rows' replays). The torch.compile rows
    # are left out here for the GPU suite's time: the evidence runs capture them.
    from h3bench.adapters import COMPILED, builtin_adapters
    from h3bench.harness.adapter import Loaded
    from h3bench.harness.execute import device_usable

    device = torch.device("cuda")
    config = load_config(op_name, quick=True)
    op = get_op(op_name)
    rows = []
    for adapter in builtin_adapters(op_name):
        loaded = adapter.try_load(device, config.inputs) if adapter.name not in COMPILED else None
        if isinstance(loaded, Loaded):
            rows.append(acc.TimedRow(name=adapter.name, fn=loaded.fn, grads=adapter.grads,
                                     sizes={str(s): SizeResult(fwd_rel_err=0.0, fwd_us=math.nan)
                                            for s in config.accuracy.rows}))
    assert len(rows) >= 2, [r.name for r in rows]
    acc.time_rows(op, config.inputs, rows, config.accuracy, TimingPlan(warmup=2, reps=4, repeats=1, block=2),
                  device, None, graph_capture=timing.capture_cuda_graph)
    torch.cuda.synchronize()
    assert device_usable(device)
    for row in rows:
        assert row.error is None, (row.name, row.error)
        for size, result in row.sizes.items():
            figures = FIGURES if row.grads else ("fwd",)
            missing = set(result.graph_unavailable or {})
            for figure in figures:
                graph_us = getattr(result, f"{figure}_graph_us")
                assert figure in missing or (graph_us is not None and graph_us > 0), (row.name, size, figure)
                assert figure not in missing or result.graph_unavailable[figure], (row.name, size, figure)
