"""The memory floor (harness/floors.py): bytes read at the read rate plus bytes written at the write rate,
lowered per size to the fastest median of the rows timed together where one beats it, with the row, its
key and how far it beat the model recorded; no floor fraction above 1, in a run, in `validate` and in the
reports."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from h3bench.harness import semantics
from h3bench.harness.config import AccuracyPlan, TimingPlan
from h3bench.harness.floors import FLOOR_MODEL, Rates, add_floors, model_us, rates_of
from h3bench.harness.ops import get_op
from h3bench.harness.ops.base import Traffic
from h3bench.harness.probes import accuracy_latency as acc
from h3bench.harness.schema import FloorLowered, SizeResult, from_json, load, to_dict
from h3bench.reports import fmt, table
from tests.helpers import require_prior_art

CPU = torch.device("cpu")
PRIOR_ART = require_prior_art()


class FixedTraffic:
    """An op whose floor_traffic is given: the floor arithmetic alone, no tensors."""

    def __init__(self, forward: Traffic, both: Traffic):
        self.forward, self.both = forward, both

    def floor_traffic(self, params, rows, backward):
        return self.both if backward else self.forward


def result(fwd: float, fwd_stream: float, fwd_bwd: float | None = None, net: float | None = None,
           **more: float) -> SizeResult:
    r = SizeResult(fwd_rel_err=0.0, fwd_us=fwd, fwd_stream_us=fwd_stream, fwd_bwd_us=fwd_bwd,
                   fwd_bwd_net_us=net, **more)
    if fwd_bwd is not None:
        r.fwd_bwd_stream_us = r.fwd_bwd_net_stream_us = max(fwd_bwd, net or fwd_bwd)
    return r


def fractions(r: SizeResult) -> list[float]:
    return [value for _, value in semantics.floor_fractions(r)]


def test_the_model_prices_reads_and_writes_at_their_own_rates():
    # 3e6 B read at 3000 GB/s (3e6 B/us) = 1 us; 1e6 B written at 2000 GB/s = 0.5 us; times add
    assert model_us(Traffic(read=3_000_000, written=1_000_000), Rates(read_gbps=3000.0, write_gbps=2000.0)) == \
        pytest.approx(1.5)
    assert model_us(Traffic(read=0, written=4_000_000), Rates(read_gbps=1.0, write_gbps=4000.0)) == pytest.approx(1.0)


def test_a_floor_no_row_beats_is_the_model():
    op = FixedTraffic(Traffic(read=3_000_000, written=1_000_000), Traffic(read=9_000_000, written=3_000_000))
    rows = {"a": result(3.0, 2.0, 10.0, 9.0), "b": result(6.0, 1.5, 12.0, 4.5)}
    add_floors(op, None, 7, rows, Rates(read_gbps=3000.0, write_gbps=2000.0))
    for r in rows.values():
        assert r.fwd_floor_us == r.fwd_floor_model_us == pytest.approx(1.5)
        assert r.fwd_bwd_floor_us == r.fwd_bwd_floor_model_us == pytest.approx(4.5)
        assert r.fwd_floor_lowered is None and r.fwd_bwd_floor_lowered is None
    assert rows["a"].fwd_floor_fraction == pytest.approx(0.5)
    assert rows["b"].fwd_stream_floor_fraction == pytest.approx(1.0)     # at the model: 100%, not lowered
    assert rows["b"].fwd_bwd_net_floor_fraction == pytest.approx(1.0)
    assert rows["a"].fwd_bwd_floor_fraction == pytest.approx(0.45)


def test_a_row_faster_than_the_model_lowers_the_floor_and_is_recorded():
    op = FixedTraffic(Traffic(read=3_000_000, written=1_000_000), Traffic(read=9_000_000, written=3_000_000))
    # model: 1.5 us forward, 4.5 us forward+backward; "torch" beats the forward model on its second
    # back-to-back timing (1.2 us), "ours" beats the backward one with its net time (4.0 us)
    rows = {"ours": result(2.0, 1.4, 6.0, 4.0), "torch": result(1.8, 1.3, 7.0, 5.0, fwd_stream_us_repeat=1.2),
            "fwd_only": result(1.6, 1.25)}
    add_floors(op, None, 7, rows, Rates(read_gbps=3000.0, write_gbps=2000.0))
    fwd = FloorLowered(row="torch", key="fwd_stream_us_repeat", measured_us=1.2, model_fraction=1.5 / 1.2)
    bwd = FloorLowered(row="ours", key="fwd_bwd_net_us", measured_us=4.0, model_fraction=4.5 / 4.0)
    for name, r in rows.items():
        assert r.fwd_floor_model_us == pytest.approx(1.5) and r.fwd_floor_us == 1.2
        assert dataclasses.astuple(r.fwd_floor_lowered)[:3] == dataclasses.astuple(fwd)[:3]
        assert r.fwd_floor_lowered.model_fraction == pytest.approx(1.25)
        assert all(f <= 1.0 for f in fractions(r)), (name, fractions(r))
    for name in ("ours", "torch"):
        assert rows[name].fwd_bwd_floor_us == 4.0 and rows[name].fwd_bwd_floor_model_us == pytest.approx(4.5)
        assert dataclasses.astuple(rows[name].fwd_bwd_floor_lowered)[:3] == dataclasses.astuple(bwd)[:3]
        assert rows[name].fwd_bwd_floor_lowered.model_fraction == pytest.approx(1.125)
    assert rows["ours"].fwd_bwd_net_floor_fraction == 1.0
    # a row without a backward gets no backward floor and does not bound the others'
    only = rows["fwd_only"]
    assert only.fwd_bwd_floor_us is None and only.fwd_bwd_floor_lowered is None and only.fwd_bwd_floor_model_us is None


def test_rates_come_from_the_environment_only_when_both_were_measured():
    env = load(PRIOR_ART).environment
    assert rates_of(env) is None
    env = dataclasses.replace(env, read_bandwidth_gbps=4000.0, write_bandwidth_gbps=3500.0)
    assert rates_of(env) == Rates(read_gbps=4000.0, write_gbps=3500.0)
    assert rates_of(dataclasses.replace(env, write_bandwidth_gbps=None)) is None


def norm_modulate_fn(x, w, sh, sc, idx):
    n = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
    return (n * (1 + sc.float()[idx]) + sh.float()[idx]).to(x.dtype)


@pytest.mark.parametrize("rates, lowered", [(Rates(read_gbps=1e-9, write_gbps=1e-9), True),
                                            (Rates(read_gbps=1e12, write_gbps=1e12), False)],
                         ids=["model-above-every-row", "model-below-every-row"])
def test_timed_rows_get_one_floor_per_size_that_no_median_is_below(rates, lowered):
    op = get_op("norm_modulate")
    params = op.params_type(hidden=32, timesteps=2, modalities=3, dtype="bfloat16", eps=1e-6)
    plan = AccuracyPlan(rows=(3, 9), input_seed=0, grad_seed=1)
    names = {"with_backward": ("x", "w"), "forward_only": ()}
    rows = [acc.TimedRow(name=name, fn=norm_modulate_fn, grads=grads,
                         sizes={str(s): SizeResult(fwd_rel_err=0.0, fwd_us=math.nan) for s in plan.rows})
            for name, grads in names.items()]
    acc.time_rows(op, params, rows, plan, TimingPlan(warmup=0, reps=2, repeats=2, block=1), CPU, rates)
    for size in plan.rows:
        results = {row.name: row.sizes[str(size)] for row in rows}
        model = model_us(op.floor_traffic(params, size, backward=False), rates)
        medians = [v for r in results.values() for k, v in dataclasses.asdict(r).items()
                   if k.startswith("fwd_") and (k.endswith("_us") or k.endswith("_us_repeat"))
                   and "floor" not in k and "bwd" not in k and v is not None]
        for r in results.values():
            assert r.fwd_floor_model_us == pytest.approx(model)
            assert r.fwd_floor_us == (min(medians) if lowered else r.fwd_floor_model_us)
            assert (r.fwd_floor_lowered is not None) == lowered
            assert all(0 < f <= 1.0 for f in fractions(r))
        if lowered:
            record = results["with_backward"].fwd_floor_lowered
            assert getattr(results[record.row], record.key) == record.measured_us == min(medians)
            assert record.model_fraction == pytest.approx(model / min(medians))
            assert results["with_backward"].fwd_bwd_floor_lowered.row == "with_backward"
        assert results["forward_only"].fwd_bwd_floor_us is None
        assert results["with_backward"].fwd_bwd_floor_us is not None


def test_no_rates_no_floors():
    op = get_op("norm_modulate")
    params = op.params_type(hidden=16, timesteps=2, modalities=3, dtype="bfloat16", eps=1e-6)
    row = acc.TimedRow(name="r", fn=norm_modulate_fn, grads=(), sizes={"3": SizeResult(fwd_rel_err=0.0, fwd_us=0.0)})
    acc.time_rows(op, params, [row], AccuracyPlan(rows=(3,), input_seed=0, grad_seed=1),
                  TimingPlan(warmup=0, reps=1, repeats=1, block=1), CPU, None)
    r = row.sizes["3"]
    assert r.fwd_us > 0 and r.fwd_floor_us is None and r.fwd_floor_model_us is None and r.fwd_floor_fraction is None


def evidence_with_floors(fraction: float, model: str | None):
    """The prior-art file with one row's forward floor fraction set, and the floor model recorded or not."""
    evidence = load(PRIOR_ART)
    row = next(r for r in evidence.rows("plain").values() if hasattr(r, "accuracy_latency"))
    size = next(iter(row.accuracy_latency.values()))
    size.fwd_floor_us, size.fwd_floor_fraction = size.fwd_us * fraction, fraction
    evidence.environment.floor_model = model
    return evidence


def test_validate_refuses_a_fraction_above_one_where_the_floor_model_is_recorded():
    assert not semantics.problems(evidence_with_floors(1.0, FLOOR_MODEL))
    found = semantics.problems(evidence_with_floors(1.02, FLOOR_MODEL))
    assert len(found) == 1 and "fwd_floor_fraction: 1.02 is above 1" in found[0]
    # an older file's copy-bandwidth floor above a row is that file's record, not a contradiction
    assert not semantics.problems(evidence_with_floors(1.02, None))


def test_reports_never_print_a_floor_fraction_above_100_percent():
    assert fmt.floor_pct(0.96) == "96%" and fmt.floor_pct(1.0) == "100%"
    assert fmt.floor_pct(1.02) == fmt.BEAT_FLOOR
    md = table.render_markdown(evidence_with_floors(1.02, None))
    assert "102%" not in md and fmt.BEAT_FLOOR in md


def test_reports_show_the_rates_the_model_and_the_row_that_lowered_a_floor():
    evidence = evidence_with_floors(1.0, FLOOR_MODEL)
    env = evidence.environment
    env.read_bandwidth_gbps, env.read_bandwidth_bytes, env.read_bandwidth_kernel = 4400.0, 1 << 30, "sum"
    env.write_bandwidth_gbps, env.write_bandwidth_bytes, env.write_bandwidth_kernel = 3900.0, 1 << 30, "fill fp32"
    env.bandwidth_method = "each kernel's best of 20 samples"
    name, row = next((n, r) for n, r in evidence.rows("plain").items() if hasattr(r, "accuracy_latency"))
    size, result = next(iter(row.accuracy_latency.items()))
    result.fwd_floor_model_us = result.fwd_us * 1.02
    result.fwd_floor_lowered = FloorLowered(row=name, key="fwd_us", measured_us=result.fwd_us, model_fraction=1.02)
    evidence = from_json(to_dict(evidence))  # the new keys round-trip through JSON
    assert evidence.rows("plain")[name].accuracy_latency[size].fwd_floor_lowered.row == name
    meta = dict(table.header_fields(evidence))
    assert meta["read bandwidth"] == "4400 GB/s (sum, 1024 MiB)"
    assert meta["write bandwidth"] == "3900 GB/s (fill fp32, 1024 MiB)"
    assert meta["floor model"] == FLOOR_MODEL and meta["bandwidth method"].startswith("each kernel's")
    md = table.render_markdown(evidence)
    assert f"{name}'s fwd_us took {result.fwd_us:.1f} µs (model / measured = 1.02x)" in md
    assert "bytes read at the measured read bandwidth" in md
    html = table.render_html(evidence)
    assert f"{name}&#x27;s fwd_us took" in html


def test_the_run_summary_names_the_row_that_lowered_the_forward_floor():
    from rich.console import Console

    from h3bench.harness.progress import summary_table

    evidence = evidence_with_floors(1.0, FLOOR_MODEL)
    name, row = next((n, r) for n, r in evidence.rows("plain").items() if hasattr(r, "accuracy_latency"))
    for result in row.accuracy_latency.values():   # the summary shows the largest size
        result.fwd_stream_us, result.fwd_floor_model_us = 40.0, 41.0
        result.fwd_floor_lowered = FloorLowered(row=name, key="fwd_stream_us", measured_us=40.0,
                                                model_fraction=41.0 / 40.0)
        result.fwd_stream_floor_fraction = 1.0
    console = Console(width=400, record=True)
    console.print(summary_table(evidence))
    text = " ".join(console.export_text().split())   # the caption wraps at the table's width
    assert (f"fwd floor lowered: {name}'s fwd_stream_us 40.0 us is below the read/write model's 41.0 us "
            f"(model / measured = 1.02)") in text
    assert "100%" in text and "102%" not in text
