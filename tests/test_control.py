"""The negative control: every op's diffusers composition with the planted batch-size fault is flagged by the
quick plan in every check (forward and row gradients), the shipped full plans pair batch sizes the fault
rounds differently in every probe, a blind plan makes `run` exit 3 with one line and a file that says so,
`--no-control` is recorded, a mode's child never measures it, fan-out and merge keep it, reports hide it
unless asked, and validate holds `flagged` to the counts."""
from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import torch

from h3bench.harness import control, control_fault, schema, semantics
from h3bench.harness.config import load_config
from h3bench.harness.ops import OP_MODULES, get_op
from h3bench.harness.runner import RunRequest, run
from h3bench.harness.schema import ControlResult, ControlSkipped
from h3bench.cli import CHILD_PROGRAM
from tests.helpers import CPU, require_prior_art

BUILTIN_OPS = [op for op, module in OP_MODULES.items() if module.startswith("h3bench.harness.ops.")]
PLANS = ("quick", "token", "timestep", "sinusoid")
# The smallest run that records a control: the diffusers row alone at a small width, the quick plan.
SMALL_RUN = ("run", "--op", "gate_residual", "--device", "cpu", "--quick", "--adapters", "diffusers",
             "--set", "hidden=16", "--set", "accuracy.rows=[3]", "--no-render", "--quiet")
# Every comparison pits a batch of one row against a batch of one row: no batch-size fault can show.
ONE_ROW_PLAN = ("--set", "all_rows.batch_sizes=[1]", "--set", "full_vs_sub.full_batch=1",
                "--set", "full_vs_sub.sub_batch_sizes=[1]", "--set", "sweep.rows=1")


@pytest.fixture(scope="module")
def quick_controls() -> dict[str, ControlResult]:
    """The control of every built-in op under its quick plan, measured once on the test device."""
    from tests.conftest import DEVICE

    from h3bench.adapters import control_composition

    return {op: control.measure(get_op(op), control_composition(op), load_config(op, quick=True),
                                torch.device(DEVICE))
            for op in BUILTIN_OPS}


@pytest.mark.parametrize("op", BUILTIN_OPS)
def test_the_quick_plan_flags_the_control_of_every_op(quick_controls, op):
    record = quick_controls[op]
    assert isinstance(record, ControlResult), record
    assert record.flagged is True and control.flagged(record)
    assert record.row_grads == list(get_op(op).row_grads)
    inv = record.batch_invariance
    assert inv.batch_invariant is False
    # a batch of one against a batch of many: every all_rows case, in the forward and the row gradients
    for size, case in inv.all_rows.items():
        assert case.fwd_differ > 0, size
        assert (case.rowgrad_differ > 0) == bool(record.row_grads), size
        assert case.first_difference is not None and case.first_difference.max_ulp > 0
    assert inv.full_vs_sub_batches.fwd_differ > 0 and inv.batch_size_sweep.differ > 0
    assert (inv.full_vs_sub_batches.rowgrad_differ > 0) == bool(record.row_grads)
    assert semantics._control_problems(record, {}, get_op(op).row_grads) == []


def _sub_batch_sizes(plan) -> set[int]:
    """Every sub-batch size the plan compares with its full batch, the short last tiles included."""
    return {len(range(start, min(start + size, plan.full_batch)))
            for size in plan.sub_batch_sizes for start in plan.starts(size)}


@pytest.mark.parametrize("plans", PLANS)
def test_every_shipped_plan_pairs_batch_sizes_the_fault_rounds_differently(plans):
    """The full plans are too large for a CPU test: what their probes compare is checked against the
    fault's rule instead (the quick plan's runs above show the rule is what the probes see)."""
    op = {"quick": "norm_modulate", "token": "norm_modulate", "timestep": "timestep_mlp",
          "sinusoid": "timestep_sinusoid"}[plans]
    config = load_config(op, quick=plans == "quick")
    assert config.plans == plans
    alone = control_fault.rounding_bits(1)
    assert all(control_fault.rounding_bits(n) != alone for n in config.all_rows.batch_sizes)
    full = control_fault.rounding_bits(config.full_vs_sub.full_batch)
    assert any(control_fault.rounding_bits(s) != full for s in _sub_batch_sizes(config.full_vs_sub))
    assert any(control_fault.rounding_bits(m) != alone for m in config.sweep.batch_sizes())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_the_rounding_step_differs_by_bits_keeps_zeros_and_stays_small(dtype):
    gen = torch.Generator().manual_seed(0)
    info = torch.finfo(dtype)
    for scale in (1.0, 1e-3, info.tiny * 1024):  # tiny outputs keep their fault: the step is the element's own
        t = (torch.randn(4096, generator=gen, dtype=torch.float64) * scale).to(dtype)
        one, two, three = (control_fault.round_low_bits(t, b) for b in (1, 2, 3))
        assert bool((one != two).any()) and bool((two != three).any())
        relative = ((three.double() - t.double()).abs() / t.double().abs().clamp_min(1e-300)).max()
        assert float(relative) <= 4 * info.eps  # three bits rounded away: at most four ULPs of the element
    exact = torch.tensor([0.0, 1.0, -2.0, 0.5], dtype=dtype)  # zeros and powers of two cannot move
    assert torch.equal(control_fault.round_low_bits(exact, 3), exact)
    big = torch.tensor([torch.finfo(dtype).max], dtype=dtype)  # a step that overflows leaves the value
    assert torch.equal(control_fault.round_low_bits(big, 3), big)
    integers = torch.arange(5)
    assert control_fault.round_low_bits(integers, 2) is integers


def test_the_summary_line_names_the_counts(quick_controls):
    evidence = _evidence_with(quick_controls["gate_residual"])
    line = control.summary_line(evidence)
    assert line.startswith("control: flagged by all_rows fwd 35/35, all_rows rowgrad 70/70, ")
    assert "batch_size_sweep" in line and "\n" not in line


def _evidence_with(record) -> schema.Evidence:
    evidence = schema.load(require_prior_art())
    evidence.control = record
    return evidence


def test_a_blind_plan_exits_3_with_one_line_and_a_file_that_says_so(invoke, tmp_path):
    out = tmp_path / "x.json"
    result, text = invoke(*SMALL_RUN, *ONE_ROW_PLAN, "--out", str(out))
    assert result.exit_code == control.BLIND_EXIT == 3, text
    lines = [line for line in result.output.splitlines() if line.startswith("control:")]
    assert len(lines) == 1 and "blind" in text
    assert "the quick plan is blind on this machine (cpu" in text
    assert "unseen by all_rows fwd, all_rows rowgrad, full_vs_sub_batches fwd, full_vs_sub_batches rowgrad, " \
           "batch_size_sweep" in text
    evidence = schema.load(out)
    assert isinstance(evidence.control, ControlResult) and evidence.control.flagged is False
    assert isinstance(evidence.results["plain"]["diffusers"], schema.RowResult)  # the rows are still there
    assert semantics.problems(evidence) == []  # a blind record is a consistent one


def test_the_fault_switched_off_makes_the_quick_plan_blind(invoke, monkeypatch, tmp_path):
    monkeypatch.setattr(control_fault, "rounding_bits", lambda rows: 1)
    out = tmp_path / "x.json"
    result, text = invoke(*SMALL_RUN, "--out", str(out))
    assert result.exit_code == 3, text
    assert "blind" in text and not schema.load(out).control.flagged


def test_a_blind_plan_outranks_a_failed_gate(invoke, tmp_path):
    result, text = invoke(*SMALL_RUN, *ONE_ROW_PLAN, "--require-invariant", "diffusers",
                          "--out", str(tmp_path / "x.json"))
    assert result.exit_code == 3, text
    assert "required invariance" in text


def test_an_honest_run_records_the_flagged_control_and_exits_0(invoke, tmp_path):
    out = tmp_path / "x.json"
    result, text = invoke(*SMALL_RUN, "--out", str(out))
    assert result.exit_code == 0, text
    assert "control: flagged by all_rows fwd" in text
    record = schema.load(out).control
    assert isinstance(record, ControlResult) and record.flagged and record.wall_s >= 0
    assert "planted fault" in record.source
    assert list(schema.load(out).results["plain"]) == ["diffusers"]  # not a row


def test_no_control_is_recorded(invoke, tmp_path):
    out = tmp_path / "x.json"
    result, text = invoke(*SMALL_RUN, *ONE_ROW_PLAN, "--no-control", "--out", str(out))
    assert result.exit_code == 0, text  # nothing measured, nothing blind
    assert "control: skipped (--no-control)" in text
    assert schema.load(out).control == ControlSkipped(skipped="--no-control")
    assert json.loads(out.read_text())["control"] == {"skipped": "--no-control"}


def test_a_modes_child_never_measures_the_control_and_a_control_job_measures_only_it(invoke, tmp_path):
    child = tmp_path / "child.json"
    result, text = invoke(*SMALL_RUN, *ONE_ROW_PLAN, "--mode", "plain", "--in-process", "--out", str(child))
    assert result.exit_code == 0, text
    assert "control" not in json.loads(child.read_text())
    job = tmp_path / "job.json"
    result, text = invoke(*SMALL_RUN, *ONE_ROW_PLAN, "--mode", "plain", "--in-process", "--control-only",
                          "--out", str(job))
    assert result.exit_code == 0, text  # blind, but a job tells its parent through its file
    part = schema.load(job)
    assert part.results == {} and isinstance(part.control, ControlResult) and part.control.flagged is False
    result, text = invoke(*SMALL_RUN, "--control-only", "--out", str(tmp_path / "y.json"))
    assert result.exit_code == 2 and "--control-only" in text


def test_an_op_without_a_diffusers_row_records_why():
    from tests.toy_op import ToyTwoOutputs

    assert control.measure(ToyTwoOutputs(), None, None, CPU) == ControlSkipped(
        skipped="op toy_two_outputs has no diffusers row to plant the fault in (none in the adapters the run was "
                "given)")


def _request(op: str, out, **changes) -> RunRequest:
    from h3bench.adapters import builtin_adapters

    config = load_config(op, quick=True)
    config = dataclasses.replace(config, inputs=dataclasses.replace(config.inputs, hidden=16),
                                 accuracy=dataclasses.replace(config.accuracy, rows=(3,)),
                                 timing=dataclasses.replace(config.timing, repeats=1))
    rows = [a for a in builtin_adapters(op) if a.name == "diffusers"]
    return RunRequest(config=config, device=CPU, adapters=rows, modes=["plain"], out=out, measure_bandwidth=False,
                      control_adapter=rows[0], child_program=CHILD_PROGRAM,
                      child_args=("--op", op, "--device", "cpu", "--quick", "--adapters", "diffusers",
                                  "--set", "hidden=16", "--set", "accuracy.rows=[3]"), **changes)


def test_fan_out_runs_one_control_job_per_op_and_the_merged_file_keeps_it(tmp_path):
    from h3bench.harness import fanout, suite

    parts = {"plain": schema.to_dict(run(_request("gate_residual", None, control=control.ELSEWHERE))),
             "control": schema.to_dict(run(_request("gate_residual", None, control_only=True)))}
    assert "control" not in parts["plain"] and parts["control"]["results"] == {}

    def launcher(job: fanout.Job, device: str) -> fanout.LaunchResult:
        _op, kind = job.key.split("/")
        if kind == "control":
            assert job.argv[-1] == "--control-only" and job.argv[job.argv.index("--mode") + 1] == "plain"
        job.out.write_text(json.dumps(parts[kind]))
        return fanout.LaunchResult(0, "", 1.0)

    requests = [_request("gate_residual", tmp_path / "gr.json")]
    jobs = suite.plan_jobs(requests, tmp_path) + suite.control_jobs(requests, tmp_path)
    assert [j.key for j in jobs] == ["gate_residual/plain", "gate_residual/control"]
    assert fanout.longest_first(jobs) == [0, 1]  # the control is the cheaper job
    (found,) = suite.run_suite(requests, ["0", "1"], launcher=launcher)
    merged = schema.load(requests[0].out)
    assert isinstance(merged.control, ControlResult) and merged.control.flagged
    assert merged.control == found.control and list(merged.results["plain"]) == ["diffusers"]

    def failing(job: fanout.Job, device: str) -> fanout.LaunchResult:
        if job.key.endswith("/control"):
            return fanout.LaunchResult(1, "Killed", 0.1)
        return launcher(job, device)

    (found,) = suite.run_suite(requests, ["0"], launcher=failing, retries=0)
    assert isinstance(found.control, ControlSkipped) and "the control's child process" in found.control.skipped
    skipped = [_request("gate_residual", tmp_path / "s.json", control=control.SKIP)]
    assert suite.control_jobs(skipped, tmp_path) == []
    (found,) = suite.run_suite(skipped, ["0"], launcher=launcher)
    assert found.control == ControlSkipped(skipped="--no-control")


def test_merge_keeps_the_control_and_a_blind_one_wins(quick_controls):
    from h3bench.harness.merge import merge

    flagged = quick_controls["norm_modulate"]
    blind = dataclasses.replace(flagged, flagged=False)
    plain = schema.load(require_prior_art())
    with_flagged, with_blind = _evidence_with(flagged), _evidence_with(blind)
    assert merge(plain, with_flagged).control == flagged == merge(with_flagged, plain).control
    assert merge(with_flagged, with_blind).control.flagged is False
    assert merge(_evidence_with(ControlSkipped("--no-control")), with_flagged).control == flagged


def test_the_prior_art_file_parses_without_a_control():
    evidence = schema.load(require_prior_art())
    assert evidence.control is None and control.summary_line(evidence) is None
    assert "control" not in schema.to_dict(evidence)


def test_validate_holds_flagged_to_the_counts(quick_controls, tmp_path, invoke):
    record = quick_controls["gate_residual"]
    evidence = schema.load(require_prior_art())
    evidence.op = "gate_residual"
    evidence.control = dataclasses.replace(record, flagged=False)
    problems = semantics.problems(evidence)
    assert any(p.startswith("$.control.flagged: False but the counts say True") for p in problems), problems
    path = tmp_path / "bad.json"
    schema.save(evidence, path)
    result, text = invoke("validate", str(path))
    assert result.exit_code == 1 and "$.control.flagged" in text

    blind = dataclasses.replace(record, batch_invariance=dataclasses.replace(
        record.batch_invariance, batch_size_sweep=dataclasses.replace(record.batch_invariance.batch_size_sweep,
                                                                      differ=0, first_failures=[])))
    evidence.control = blind  # still recorded as flagged: the sweep counted nothing
    assert any("$.control.flagged: True but the counts say False" in p for p in semantics.problems(evidence))
    evidence.control = dataclasses.replace(record, row_grads=["res"])
    assert any(p.startswith("$.control.row_grads") for p in semantics.problems(evidence))
    evidence.control = record
    assert not [p for p in semantics.problems(evidence) if p.startswith("$.control")]


def test_validate_bounds_rowgrad_counts_by_the_ops_row_gradients(quick_controls):
    """gate_residual has two row gradients, whose counts are summed: 70 of 35 rows is the most, not a fault."""
    inv = copy.deepcopy(quick_controls["gate_residual"].batch_invariance)
    assert inv.all_rows["32"].rowgrad_differ == 64 > inv.all_rows["32"].rows
    evidence = schema.load(require_prior_art())
    evidence.op = "gate_residual"
    row = next(iter(evidence.results["plain"].values()))
    row.batch_invariance = inv
    assert not [p for p in semantics.problems(evidence) if "not within" in p]
    inv.all_rows["32"].rowgrad_differ = 65
    assert any("all_rows.32: differing rows (32, 65) not within 0..32 (0..64 for the 2 row gradients)" in p
               for p in semantics.problems(evidence))


def test_reports_hide_the_control_unless_asked(quick_controls, tmp_path, invoke):
    from h3bench.reports import table

    evidence = _evidence_with(quick_controls["norm_modulate"])
    assert "Negative control" not in table.render_markdown(evidence)
    assert "Negative control" not in table.render_html(evidence)
    shown = table.render_markdown(evidence, show_control=True)
    assert "## Negative control" in shown and "| all_rows rowgrad | 35/35 | yes |" in shown
    assert "Negative control" in table.render_html(evidence, show_control=True)
    path = tmp_path / "e.json"
    schema.save(evidence, path)
    result, text = invoke("report", str(path), "--out", str(tmp_path / "hidden"))
    assert result.exit_code == 0, text
    assert "control:" not in text and "Negative control" not in (tmp_path / "hidden" / "e.md").read_text()
    result, text = invoke("report", str(path), "--out", str(tmp_path / "shown"), "--show-control")
    assert result.exit_code == 0, text
    assert "control: flagged by" in text and "## Negative control" in (tmp_path / "shown" / "e.md").read_text()
