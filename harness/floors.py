"""The memory floor of an op at a row count: the least time its bytes can take, checked against the run.

The model: the op's bytes read (`Op.floor_traffic`) at the measured read bandwidth plus its bytes written
at the measured write bandwidth (harness/bandwidth.py). Reads and writes share the memory bus, so their
times add. A model is not a measurement: a row can beat it (data an earlier call left in L2, a table read
from cache once per row, a kernel that reads better than the ones the bandwidth was measured with). So at
each size the rows timed together (one mode of one run) are checked against it: when any row's median
(either timing, either repeat) is below the model, that median is the floor, and the row, its latency key
and how far it beat the model are recorded beside it (`<floor>_floor_lowered`). Every floor fraction is
then at most 1.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from h3bench.harness.ops.base import Op, Traffic
from h3bench.harness.schema import Environment, FloorLowered, SizeResult, latency_key

FLOOR_MODEL = ("bytes read / read_bandwidth_gbps + bytes written / write_bandwidth_gbps; per size lowered to "
               "the fastest median (either timing, either repeat) of the rows timed together where one beat "
               "it, recorded in *_floor_lowered")

# The latency figures each floor bounds: the forward floor the forward, the forward+backward floor both
# forward+backward figures (with and without the per-step setup).
FWD_FIGURES = ("fwd",)
FWD_BWD_FIGURES = ("fwd_bwd", "fwd_bwd_net")


@dataclass(frozen=True)
class Rates:
    """Measured bandwidths in GB/s (1e3 bytes per microsecond)."""

    read_gbps: float
    write_gbps: float


def rates_of(env: Environment) -> Optional[Rates]:
    """The environment's read and write rates; None where they were not measured (no floors then)."""
    if not env.read_bandwidth_gbps or not env.write_bandwidth_gbps:
        return None
    return Rates(read_gbps=env.read_bandwidth_gbps, write_gbps=env.write_bandwidth_gbps)


def model_us(traffic: Traffic, rates: Rates) -> float:
    return traffic.read / (rates.read_gbps * 1e3) + traffic.written / (rates.write_gbps * 1e3)


def measured(result: SizeResult, figures: tuple[str, ...]) -> dict[str, float]:
    """Every median of `figures` the result holds: synchronized, back to back and CUDA-graph replays, each
    with its repeat, by latency key (a graph replay, without the host cost, is the likeliest to beat it)."""
    found = {}
    for figure in figures:
        for stream, graph in ((False, False), (True, False), (False, True)):
            key = latency_key(figure, stream, graph)
            for name in (key, f"{key}_repeat"):
                value = getattr(result, name)
                if value is not None and math.isfinite(value):
                    found[name] = value
    return found


def floor_of(model: float, timed: Mapping[str, SizeResult], figures: tuple[str, ...]
             ) -> tuple[float, Optional[FloorLowered]]:
    """The floor the measurements justify: the model, or the fastest median below it with its record."""
    fastest: Optional[tuple[str, str, float]] = None
    for row, result in timed.items():
        for key, us in measured(result, figures).items():
            if us < model and (fastest is None or us < fastest[2]):
                fastest = (row, key, us)
    if fastest is None:
        return model, None
    row, key, us = fastest
    return us, FloorLowered(row=row, key=key, measured_us=us, model_fraction=model / us)


def add_floors(op: Op, params: Any, rows: int, timed: Mapping[str, SizeResult], rates: Rates) -> None:
    """Every timed row's floors and floor fractions at `rows` rows: one forward floor for all of them, one
    forward+backward floor for those with a backward."""
    fwd_model = model_us(op.floor_traffic(params, rows, backward=False), rates)
    fwd, fwd_lowered = floor_of(fwd_model, timed, FWD_FIGURES)
    backward = {name: r for name, r in timed.items() if r.fwd_bwd_us is not None}
    if backward:
        bwd_model = model_us(op.floor_traffic(params, rows, backward=True), rates)
        bwd, bwd_lowered = floor_of(bwd_model, backward, FWD_BWD_FIGURES)
    for result in timed.values():
        result.fwd_floor_model_us, result.fwd_floor_us, result.fwd_floor_lowered = fwd_model, fwd, fwd_lowered
        result.fwd_floor_fraction = fraction(fwd, result.fwd_us)
        result.fwd_stream_floor_fraction = fraction(fwd, result.fwd_stream_us)
        if result.fwd_bwd_us is None:
            continue
        result.fwd_bwd_floor_model_us, result.fwd_bwd_floor_us = bwd_model, bwd
        result.fwd_bwd_floor_lowered = bwd_lowered
        result.fwd_bwd_floor_fraction = fraction(bwd, result.fwd_bwd_us)
        result.fwd_bwd_net_floor_fraction = fraction(bwd, result.fwd_bwd_net_us)
        result.fwd_bwd_stream_floor_fraction = fraction(bwd, result.fwd_bwd_stream_us)
        result.fwd_bwd_net_stream_floor_fraction = fraction(bwd, result.fwd_bwd_net_stream_us)


def fraction(floor: float, measured_us: Optional[float]) -> Optional[float]:
    return floor / measured_us if measured_us else None
