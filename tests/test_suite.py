"""The suite fanned out over GPUs: one job per (op, mode), longest first, a dead worker's job
retried once on another GPU, each op's parts merged into its usual evidence file. The scheduler itself
is tested in tests/test_fanout.py; here its jobs are real `h3bench run` command lines and the launcher is
a fake that writes real part files made by an in-process quick run."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from h3bench.harness import fanout, schema, suite
from h3bench.harness.runner import RunRequest, run
from h3bench.harness.schema import RowResult, UnavailableMode
from h3bench.cli import CHILD_PROGRAM
from tests.helpers import quick_config, require_prior_art

CPU = torch.device("cpu")


def request(op: str, modes: list[str], out: Path) -> RunRequest:
    from h3bench.adapters import builtin_adapters

    config = quick_config(op)
    rows = [a for a in builtin_adapters(op) if a.name == "diffusers"]
    return RunRequest(config=config, device=CPU, adapters=rows, modes=modes, out=out, measure_bandwidth=False,
                      control_adapter=rows[0], child_program=CHILD_PROGRAM,
                      child_args=("--op", op, "--device", "cpu", "--quick", "--adapters", "diffusers"))


@pytest.fixture(scope="module")
def plain_parts() -> dict[str, dict]:
    """A real one-mode part per op, measured here once."""
    parts = {}
    for op in ("norm_modulate", "gate_residual"):
        parts[op] = schema.to_dict(run(request(op, ["plain"], None)))
    return parts


class FakeLauncher:
    """Writes the op's real part, renamed to the job's mode; fails the listed (key, attempt)s."""

    def __init__(self, parts: dict[str, dict], failures: dict[tuple[str, int], int]):
        self.parts, self.failures, self.calls = parts, failures, []

    def __call__(self, job: fanout.Job, device: str) -> fanout.LaunchResult:
        op, mode = job.key.split("/")
        attempt = 1 + sum(1 for k, _ in self.calls if k == job.key)
        self.calls.append((job.key, device))
        if (job.key, attempt) in self.failures:
            return fanout.LaunchResult(self.failures[(job.key, attempt)], "Killed", 0.1)
        part = copy.deepcopy(self.parts[op])
        part["results"] = {mode: part["results"]["plain"]}
        variables = {k: v for k, v in job.env.items() if k != "PYTHONPATH"}
        part["environment"]["mode_environment"] = {mode: variables}
        job.out.write_text(json.dumps(part))
        return fanout.LaunchResult(0, "", 2.0)


def test_plan_jobs_one_per_op_and_mode_with_the_mode_environment(tmp_path):
    requests = [request("norm_modulate", ["plain", "deterministic"], tmp_path / "a.json"),
                request("gate_residual", ["plain"], tmp_path / "b.json")]
    jobs = suite.plan_jobs(requests, tmp_path, cost=lambda op: {"norm_modulate": 90.0}.get(op, 10.0))
    assert [j.key for j in jobs] == ["norm_modulate/plain", "norm_modulate/deterministic", "gate_residual/plain"]
    assert [j.cost_s for j in jobs] == [90.0, 90.0, 10.0]
    det = jobs[1]
    assert det.env["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert det.argv[det.argv.index("--mode") + 1] == "deterministic" and "--in-process" in det.argv
    assert det.argv[det.argv.index("--op") + 1] == "norm_modulate"
    assert fanout.longest_first(jobs) == [0, 1, 2]


def test_a_jobs_cost_is_read_from_the_ops_evidence_file(tmp_path):
    """The sum of the rows' own wall_s in the op's current file (_h100 before _h200); no file, or a file
    with no measured row, costs the default."""
    ev = schema.load(require_prior_art())
    rows = ev.results["plain"]
    for k, name in enumerate(rows):
        if isinstance(rows[name], RowResult):
            rows[name].wall_s = 10.0 * (k + 1)
    expected = sum(r.wall_s for r in rows.values() if isinstance(r, RowResult))
    schema.save(ev, tmp_path / "norm_modulate_h200.json")
    assert suite.measured_cost("norm_modulate", tmp_path) == expected
    assert suite.estimated_cost("norm_modulate", tmp_path) == expected
    for r in rows.values():
        if isinstance(r, RowResult):
            r.wall_s = 1.0
    schema.save(ev, tmp_path / "norm_modulate_h100.json")
    assert suite.measured_cost("norm_modulate", tmp_path) == sum(isinstance(r, RowResult) for r in rows.values())
    assert suite.measured_cost("gate_residual", tmp_path) is None
    assert suite.estimated_cost("gate_residual", tmp_path) == suite.DEFAULT_COST


def test_every_op_of_the_suite_has_committed_evidence_to_take_its_cost_from():
    """`--op all`'s ops each have a current file in the checkout's reports/evidence/, so the suite starts
    the heaviest first; the order follows the files' figures, whatever they are."""
    from h3bench.harness.ops import all_ops

    costs = {op: suite.measured_cost(op) for op in all_ops()}
    assert all(cost and cost > 0 for cost in costs.values()), costs
    requests = [request(op, ["plain"], None) for op in all_ops()]
    jobs = suite.plan_jobs(requests, Path("."))
    ordered = [jobs[i].key.split("/")[0] for i in fanout.longest_first(jobs)]
    assert ordered == sorted(all_ops(), key=lambda op: -costs[op])


def test_suite_merges_each_ops_parts_and_retries_a_dead_worker_elsewhere(tmp_path, plain_parts):
    requests = [request("norm_modulate", ["plain", "deterministic"], tmp_path / "nm.json"),
                request("gate_residual", ["plain"], tmp_path / "gr.json")]
    launcher = FakeLauncher(plain_parts, failures={("norm_modulate/deterministic", 1): -9})
    events = []
    found = suite.run_suite(requests, ["0", "1", "2"], launcher=launcher, on_event=events.append)
    nm, gr = (schema.load(r.out) for r in requests)
    assert list(nm.results) == ["plain", "deterministic"] and list(gr.results) == ["plain"]
    assert all(isinstance(row, RowResult) for mode in nm.results.values() for row in mode.values())
    assert nm.environment.mode_environment["deterministic"]["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    tries = [d for k, d in launcher.calls if k == "norm_modulate/deterministic"]
    assert len(tries) == 2 and tries[0] != tries[1]  # retried on another GPU
    assert any(e.kind == "retrying" for e in events)
    assert [e.op for e in found] == ["norm_modulate", "gate_residual"]


def test_a_job_failing_twice_is_that_modes_reason_and_the_rest_survive(tmp_path, plain_parts):
    requests = [request("norm_modulate", ["plain", "deterministic"], tmp_path / "nm.json")]
    launcher = FakeLauncher(plain_parts, failures={("norm_modulate/deterministic", 1): -9,
                                                   ("norm_modulate/deterministic", 2): 1})
    suite.run_suite(requests, ["0", "1"], launcher=launcher)
    nm = schema.load(requests[0].out)
    assert isinstance(nm.results["plain"]["diffusers"], RowResult)
    reason = nm.results["deterministic"]
    assert isinstance(reason, UnavailableMode)
    assert "-9 (SIGKILL)" in reason.unavailable and "status 1" in reason.unavailable


def test_gpus_on_a_machine_without_them_is_a_usage_error(invoke, tmp_path):
    result, text = invoke("run", "--device", "cpu", "--quick", "--adapters", "diffusers", "--gpus", "2",
                          "--out", str(tmp_path / "x.json"))
    assert result.exit_code == 2, text
    assert "--gpus 2" in text
