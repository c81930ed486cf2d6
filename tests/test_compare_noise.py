"""`h3bench compare` judges latency only from CUDA-event timings with enough samples in both files; host-clock
or few-sample files get their ratios shown with the reason, and two quick CPU runs of the same code compare
clean."""
from __future__ import annotations


from h3bench.harness import schema
from h3bench.harness.schema import TimingRecord
from h3bench.reports import compare as cmp
from tests.helpers import require_prior_art


def timed(timer: str, reps: int, slower: float = 1.0) -> schema.Evidence:
    ev = schema.load(require_prior_art())
    ev.h3bench_commit = "abc1234"
    ev.environment.timing = TimingRecord(sample="synchronized", stream="back-to-back", timer=timer, warmup=0,
                                         reps=reps, repeats=1, block=1, interleaved="rows round-robin")
    for rows in ev.measured_modes().values():
        for row in rows.values():
            if isinstance(row, schema.RowResult):
                for result in row.accuracy_latency.values():
                    result.fwd_us *= slower
    return ev


def latency_regressions(old, new) -> list:
    return [r for r in cmp.compare(old, new).regressions if r.kind == "latency"]


def test_cuda_event_timings_with_enough_samples_are_judged():
    assert latency_regressions(timed("cuda_events", 100), timed("cuda_events", 100, slower=3.0))


def test_host_clock_timings_are_shown_not_judged():
    result = cmp.compare(timed("wall_clock", 1), timed("wall_clock", 1, slower=3.0))
    assert not result.latency_compared and not [r for r in result.regressions if r.kind == "latency"]
    assert any("wall-clock timings: latency ratios shown, not judged" in n for n in result.notes)


def test_too_few_samples_are_shown_not_judged():
    result = cmp.compare(timed("cuda_events", 5), timed("cuda_events", 100, slower=3.0))
    assert not result.latency_compared
    assert any("5 sample(s) per figure" in n for n in result.notes), result.notes


def test_two_quick_cpu_runs_of_the_same_code_compare_clean(invoke, tmp_path):
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path in paths:
        result, text = invoke("run", "--device", "cpu", "--quick", "--adapters", "torch_rms_norm,diffusers",
                              "--no-render", "--quiet", "--out", str(path))
        assert result.exit_code == 0, text
    result, text = invoke("compare", *map(str, paths))
    assert result.exit_code == 0 and "no regression" in text and "not judged" in text, text
