"""Read and write bandwidth measured apart (harness/bandwidth.py), recorded in the environment block beside
the copy bandwidth, and kept by merge."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from h3bench.harness import bandwidth, environment
from h3bench.harness.floors import FLOOR_MODEL
from h3bench.harness.merge import MergeError, merge
from h3bench.harness.schema import from_json, load, to_dict
from tests.helpers import require_prior_art

CPU = torch.device("cpu")
SMALL = 1 << 20


class ScriptedDevice:
    """A device clock on which each kernel call takes the next of its scripted durations (microseconds)."""

    def __init__(self):
        self.now = 0.0

    def kernel(self, durations_us: list[float]):
        left = list(durations_us)

        def run(buffer):
            self.now += left.pop(0)
        return run

    def event(self):
        device = self

        class Event:
            def record(self) -> None:
                self.t = device.now

            def elapsed_ms(self, end) -> float:
                return (end.t - self.t) / 1e3
        return Event()

    def synchronize(self) -> None:
        pass


def test_each_rate_is_its_fastest_kernels_best_sample():
    device = ScriptedDevice()
    # one warm-up, then three samples each: "sum" is best at 250 us, "amax" at 240 us (its median is worse)
    kernels = {"sum": device.kernel([900, 300, 250, 260]), "amax": device.kernel([900, 500, 240, 480])}
    rate = bandwidth.best_rate(kernels, torch.ones(SMALL // 4), CPU, warmup=1, reps=3, clock=device)
    assert rate == bandwidth.Rate(gbps=SMALL / (240 * 1e3), nbytes=SMALL, kernel="amax")


def test_measure_gives_a_read_and_a_write_rate_over_one_buffer():
    found = bandwidth.measure(CPU, nbytes=SMALL + 12, warmup=0, reps=2)   # rounded down to whole rows
    assert found.read.nbytes == found.write.nbytes == SMALL
    assert found.read.kernel in bandwidth.READ_KERNELS and found.write.kernel in bandwidth.WRITE_KERNELS
    assert found.read.gbps > 0 and found.write.gbps > 0
    assert "best of 2 samples" in found.method and "wall_clock" in found.method


def test_measure_refuses_a_buffer_smaller_than_one_row():
    with pytest.raises(ValueError, match="at least"):
        bandwidth.measure(CPU, nbytes=1024)


def test_the_environment_records_read_write_copy_and_the_floor_model(monkeypatch):
    real = bandwidth.measure
    monkeypatch.setattr(environment.memory, "measure", lambda device: real(device, nbytes=SMALL, warmup=0, reps=1))
    monkeypatch.setattr(environment, "measure_copy_bandwidth", lambda device: (1.0, 2 * SMALL))
    env = environment.capture(CPU, {"plain": {}})
    assert env.read_bandwidth_gbps > 0 and env.write_bandwidth_gbps > 0
    assert env.read_bandwidth_bytes == env.write_bandwidth_bytes == SMALL
    assert env.read_bandwidth_kernel in bandwidth.READ_KERNELS
    assert env.write_bandwidth_kernel in bandwidth.WRITE_KERNELS
    assert env.bandwidth_method and env.floor_model == FLOOR_MODEL
    assert (env.copy_bandwidth_gbps, env.copy_bandwidth_bytes) == (1.0, 2 * SMALL)   # as before
    unmeasured = environment.capture(CPU, {"plain": {}}, measure_bandwidth=False)
    keys = ("read_bandwidth_gbps", "read_bandwidth_bytes", "read_bandwidth_kernel", "write_bandwidth_gbps",
            "write_bandwidth_bytes", "write_bandwidth_kernel", "bandwidth_method", "floor_model")
    assert all(getattr(unmeasured, key) is None for key in keys)
    assert not set(keys) & set(to_dict(unmeasured))     # additive: absent from the JSON when not measured


def measured_file(op_rows: str, floor_model=FLOOR_MODEL, read=4400.0):
    evidence = load(require_prior_art())
    evidence.environment = dataclasses.replace(evidence.environment, read_bandwidth_gbps=read,
                                               write_bandwidth_gbps=3900.0, floor_model=floor_model)
    evidence.results = {"plain": {op_rows: next(iter(evidence.rows("plain").values()))}}
    return from_json(to_dict(evidence))


def test_merge_keeps_the_first_rates_and_refuses_two_floor_models():
    merged = merge(measured_file("a"), measured_file("b", read=4300.0))
    assert merged.environment.read_bandwidth_gbps == 4400.0 and merged.environment.floor_model == FLOOR_MODEL
    assert merge(measured_file("a", floor_model=None), measured_file("b")).environment.floor_model == FLOOR_MODEL
    with pytest.raises(MergeError, match="floor_model"):
        merge(measured_file("a"), measured_file("b", floor_model="another model"))
