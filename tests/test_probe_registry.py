"""A probe is one module plus one line in PROBES (harness/probes/registry.py). A toy probe, this module's
`TOY`, registered in one line by the `toy` fixture, is found in the config, the runner, the schema,
validate, the gate, the run's summary and the reports, with nothing else changed; the fixture takes it out
again after its test."""
from __future__ import annotations

import dataclasses
import itertools
import typing
from dataclasses import dataclass
from typing import Optional

import pytest

from h3bench.harness import gate, semantics
from h3bench.harness.adapter import from_function
from h3bench.harness.config import PLAN_TABLES, ConfigError, RunConfig, build_config, load_config, plan_types
from h3bench.harness.execute import any_rows_differ
from h3bench.harness.probes import registry
from h3bench.harness.probes.registry import ProbeSpec, Role, Turn
from h3bench.harness.probes.wording import differ_count, failure_line, within
from h3bench.harness.progress import summary_table
from h3bench.harness.request import SilentObserver
from h3bench.harness.runner import RunRequest, run
from h3bench.harness.schema import Difference, additive, from_json, to_dict
from h3bench.reports import verdicts
from h3bench.reports.table import render_markdown
from tests.helpers import CPU, composition

BUMP = 2 ** -5  # larger than a bf16 ulp: changes the bits of every non-zero element


# --- the toy probe: what its module holds ---------------------------------------------------------------

@dataclass(frozen=True)
class ToyPlan:
    rows: int
    seed: int


@dataclass
class ToyRecord:
    """The batch run twice: `fwd_differ` of `rows` rows gave other outputs the second time."""

    rows: int
    fwd_differ: int
    invariant: bool
    first_difference: Optional[Difference] = additive()


def toy_run(ctx, plan: ToyPlan) -> ToyRecord:
    inputs, grad_outs = ctx.inputs(plan.rows, plan.seed), ctx.grad_outs(plan.rows, plan.seed)
    first, again = ctx.run_rows(inputs, grad_outs), ctx.run_rows(inputs, grad_outs)
    ctx.progress(2)
    differ = int(any_rows_differ(list(zip(first.outputs, again.outputs))).sum())
    return ToyRecord(rows=plan.rows, fwd_differ=differ, invariant=differ == 0)


def toy_failures(record: ToyRecord, located: bool) -> list[str]:
    return [failure_line("toy", record.fwd_differ, 0, record.rows, None, located)] if record.fwd_differ else []


def toy_words(record: ToyRecord) -> tuple[str, str]:
    return differ_count(record.fwd_differ, record.rows, "rows"), f"{record.fwd_differ}/{record.rows}"


TOY = ProbeSpec(
    name="toy", plan_table="toy", plan_type=ToyPlan, run=toy_run, total=lambda plan, _ctx: 2,
    role=Role.BEYOND_RFC, record_type=ToyRecord, invariant=lambda record: record.fwd_differ == 0,
    failures=toy_failures, problems=lambda record, where: within(where, record.fwd_differ, 0, record.rows),
    words=toy_words, label="toy probe", note="the batch run twice, each row against itself")


@pytest.fixture
def toy(monkeypatch):
    """The toy registered for one test: its line in PROBES, which monkeypatch takes out again after it."""
    monkeypatch.setattr(registry, "PROBES", (*registry.PROBES, f"{__name__}:TOY"))


# --- the built-in probes --------------------------------------------------------------------------------

def test_the_registry_lists_the_probes_in_the_order_a_row_runs_them():
    probes = registry.probes()
    assert [p.name for p in probes] == ["all_rows", "full_vs_sub_batches", "batch_size_sweep", "contention",
                                        "graph_replay", "layout", "grad_set", "accuracy_latency"]
    assert [p.name for p in probes if p.role is Role.RFC] == ["all_rows", "full_vs_sub_batches", "batch_size_sweep"]
    assert [p.name for p in probes if p.turn is Turn.EXCLUSIVE] == ["contention"]  # it loads the GPU on purpose
    assert list(registry.beyond_rfc_records()) == ["contention", "graph_replay", "layout", "grad_set"]


def test_a_configs_fixed_tables_are_the_ones_the_probes_declare():
    """RunConfig's typed fields hold the plans of the RFC's probes and of accuracy: the same tables and record
    types their specifications name."""
    hints = typing.get_type_hints(RunConfig)
    fixed = {p.plan_table: p.plan_type for p in registry.probes() if p.role is not Role.BEYOND_RFC}
    assert set(fixed) | {"timing"} == set(PLAN_TABLES)
    assert all(hints[table] is plan for table, plan in fixed.items())


def test_a_probe_beyond_the_rfcs_declares_everything_its_readers_need():
    with pytest.raises(TypeError, match="declares no words"):
        dataclasses.replace(TOY, words=None)
    with pytest.raises(TypeError, match="dataclass with an `invariant` field"):
        dataclasses.replace(TOY, record_type=ToyPlan)


def test_two_probes_of_one_name_are_refused(monkeypatch):
    monkeypatch.setattr(registry, "PROBES", (*registry.PROBES, "h3bench.harness.probes.layout:PROBE"))
    with pytest.raises(ValueError, match="same name: layout"):
        registry.probes()


# --- the toy probe, registered in one line ----------------------------------------------------------------

def _config(toy_table: Optional[dict]) -> RunConfig:
    """norm_modulate's quick plan at a small width, its probes beyond the RFC's left out but the toy's."""
    data = {k: v for k, v in load_config("norm_modulate", quick=True).to_dict().items()
            if k in ("inputs", *PLAN_TABLES)}
    data["inputs"]["hidden"] = 16
    data["timing"]["repeats"] = 1
    return build_config("norm_modulate", {**data, **({"toy": toy_table} if toy_table else {})}, True, "toy.toml")


def test_the_config_reads_the_toys_table(toy):
    config = _config({"rows": 4, "seed": 3})
    assert config.plan("toy") == ToyPlan(rows=4, seed=3) and plan_types()["toy"] is ToyPlan
    assert list(config.to_dict())[-1] == "toy" and config.to_dict()["toy"] == {"rows": 4, "seed": 3}
    assert _config(None).plan("toy") is None  # no table: the probe does not run
    built = load_config("norm_modulate", quick=True, overrides=("toy.rows=6", "toy.seed=5"))
    assert built.plan("toy") == ToyPlan(rows=6, seed=5)
    with pytest.raises(ConfigError, match=r"\[toy\]: unknown key\(s\) \['size'\]"):
        _config({"rows": 4, "seed": 3, "size": 1})


def _noisy():
    """A row whose every other call adds a bump: not repeatable, so neither batch-invariant nor the toy's."""
    calls = itertools.count()

    def noisy(x, w, sh, sc, idx):
        y = composition(x, w, sh, sc, idx)
        return y + (y * BUMP).detach() if next(calls) % 2 else y
    return noisy


class Recording(SilentObserver):
    def __init__(self):
        self.totals, self.started = {}, []

    def row_started(self, mode, name, totals):
        self.totals[name] = totals

    def probe_started(self, probe):
        self.started.append(probe)


@pytest.fixture(scope="module")
def toy_run_evidence():
    """An honest row and a noisy one through the runner with the toy registered while they run: (the evidence,
    the observer's record, the evidence's JSON)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(registry, "PROBES", (*registry.PROBES, f"{__name__}:TOY"))
        adapters = [from_function(fn, name=name, op="norm_modulate", differentiable=("x", "w", "sh", "sc"))
                    for name, fn in (("honest", composition), ("noisy", _noisy()))]
        observer = Recording()
        evidence = run(RunRequest(config=_config({"rows": 4, "seed": 3}), device=CPU, adapters=adapters,
                                  modes=["plain"], out=None, measure_bandwidth=False), observer)
    return evidence, observer, to_dict(evidence)


def test_the_runner_runs_the_toy_after_the_others(toy, toy_run_evidence):
    evidence, observer, _ = toy_run_evidence
    assert observer.totals["honest"]["toy"] == 2
    assert observer.started[:5] == ["all_rows", "full_vs_sub_batches", "batch_size_sweep", "accuracy_latency", "toy"]
    honest = evidence.results["plain"]["honest"]
    assert "toy" in honest.probe_wall_s
    assert honest.batch_invariance.beyond_rfc == {"toy": ToyRecord(rows=4, fwd_differ=0, invariant=True)}
    noisy = evidence.results["plain"]["noisy"].batch_invariance
    assert noisy.batch_invariant is False and noisy.beyond_rfc["toy"].invariant is False


def test_the_toys_record_goes_through_the_schema_and_validate(toy, toy_run_evidence):
    evidence, _, data = toy_run_evidence
    record = data["results"]["plain"]["honest"]["batch_invariance"]
    assert list(record)[-1] == "toy" and record["toy"] == {"rows": 4, "fwd_differ": 0, "invariant": True}
    read = from_json(data)
    assert read.results["plain"]["honest"].batch_invariance.beyond_rfc["toy"] == ToyRecord(4, 0, True)
    assert to_dict(read) == data and semantics.problems(read) == []
    broken = from_json(data)
    toy_record = broken.results["plain"]["noisy"].batch_invariance.beyond_rfc["toy"]
    toy_record.invariant, toy_record.fwd_differ = True, 9
    assert semantics.problems(broken) == [
        "$.results.plain.noisy.batch_invariance.toy: differing rows (9, 0) not within 0..4",
        "$.results.plain.noisy.batch_invariance.toy.invariant: True but its counts say False"]


def test_a_failing_toy_fails_the_gate_and_is_named_in_the_summary(toy, toy_run_evidence):
    evidence, _, _ = toy_run_evidence
    differ = evidence.results["plain"]["noisy"].batch_invariance.beyond_rfc["toy"].fwd_differ
    assert differ > 0
    toy_line = f"toy: fwd {differ}, rowgrad 0 of 4 rows"
    verdict = gate.judge([evidence], frozenset({"noisy"}))
    assert not verdict.passed and toy_line in verdict.failures[0]
    assert gate.judge([evidence], frozenset({"honest"})).passed
    caption = str(summary_table(evidence).caption)
    assert f"not invariant: noisy: " in caption and toy_line in caption.split("not invariant: noisy: ")[1]


def test_a_toy_that_fails_alone_fails_the_gate_beside_the_rfcs_verdict(toy, toy_run_evidence):
    """Invariant by the RFC's probes, not by the toy: the gate fails the row, the summary says which."""
    evidence = from_json(toy_run_evidence[2])
    evidence.results["plain"]["honest"].batch_invariance.beyond_rfc["toy"] = ToyRecord(4, 1, False)
    assert gate.failures(evidence, frozenset({"honest"})) == [
        "norm_modulate/honest [plain]: NOT batch-invariant: toy: fwd 1, rowgrad 0 of 4 rows"]
    assert "invariant by the RFC's probes, not by h3bench's: honest: toy: fwd 1" in str(summary_table(evidence).caption)


def test_the_reports_give_the_toy_its_column_and_words(toy, toy_run_evidence):
    evidence, _, _ = toy_run_evidence
    noisy = evidence.results["plain"]["noisy"]
    differ = noisy.batch_invariance.beyond_rfc["toy"].fwd_differ
    check = next(c for c in verdicts.checks(noisy) if c.name == "toy probe")
    assert (check.status, check.detail, check.short) == (verdicts.Status.FAIL, f"{differ}/4 rows differ", f"{differ}/4")
    assert verdicts.grid_columns()[-2:] == ("toy probe", "batch_invariant")
    assert f"toy probe: {differ}/4 rows differ" in verdicts.failure_summary(noisy)
    markdown = render_markdown(evidence)
    table = markdown.split("### Beyond the RFC's probes")[1]
    assert table.splitlines()[2].endswith("| grad set | toy probe |")
    assert "| honest | n.a.: not measured | n.a.: not measured | n.a.: not measured | n.a.: not measured | pass: 0/4 " \
           "rows differ |" in table
    assert "toy probe: the batch run twice, each row against itself." in table


CLASHING = dataclasses.replace(TOY, name="batch_invariant")


def test_a_probe_may_not_take_a_key_the_record_has(monkeypatch, toy_run_evidence):
    """A probe beyond the RFC's named like one of the record's own keys would shadow it: the codec refuses."""
    monkeypatch.setattr(registry, "PROBES", (*registry.PROBES, f"{__name__}:CLASHING"))
    with pytest.raises(TypeError, match=r"inlined keys \['batch_invariant'\] are its own fields' names"):
        from_json(toy_run_evidence[2])
