"""The whole suite over several GPUs: every (op, mode) of the requests is one job (a child `h3bench run`
writing one part file), scheduled by harness/fanout.py on one host (`--gpus`) or by Ray beyond it
(`--ray`); the parts of each op are merged into its usual evidence file (harness.merge refuses parts
from different GPU models, drivers, torch builds or plans).

Longest first: a job's cost is what its op's committed evidence says the op's rows took (`measured_cost`:
the checkout's reports/evidence/, read when the suite is planned; an op without a file there, or an
installed wheel, which carries no evidence, costs DEFAULT_COST), so the heaviest ops start first. Each op's negative control (harness/control.py) is one more job, `<op>/control`,
in the plain mode, whose record goes into the op's merged file.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable, Optional, Sequence

from h3bench.harness import children, control, fanout
from h3bench.harness.modes import get_mode
from h3bench.harness.runner import combine_modes
from h3bench.harness.ops import get_op
from h3bench.harness.schema import Evidence, load, save

# The checkout's committed evidence, and which file of an op is its current one (the nightly job's baseline
# rule, .ci/gpu-nightly): the cost of a job is read from it, never copied into the code.
EVIDENCE = Path(__file__).resolve().parents[1] / "reports" / "evidence"
BASELINE_SUFFIXES = ("_h100", "_h200")
DEFAULT_COST = 60.0
# A control job's cost as a share of its op's: three batch-invariance probes of one composition, no timing.
CONTROL_SHARE = 0.1


def measured_cost(op: str, folder: Path = EVIDENCE) -> Optional[float]:
    """Seconds the op's rows took in its current evidence file in `folder` (the sum of the rows' own
    `wall_s`, which leave out the waits for a shared GPU's turns, so a run beside others reads as its
    work), or None where there is no such file or it holds no measured row."""
    for suffix in BASELINE_SUFFIXES:
        path = folder / f"{op}{suffix}.json"
        if path.is_file():
            rows = [r for mode in load(path).measured_modes().values() for r in mode.values()]
            seconds = sum(r.wall_s or 0.0 for r in rows)
            return seconds or None
    return None


def estimated_cost(op: str, folder: Path = EVIDENCE) -> float:
    """The op's relative cost per (op, mode) job: `measured_cost`, else DEFAULT_COST. Only the order the
    costs give is used (longest first); every mode of an op gets the op's figure."""
    return measured_cost(op, folder) or DEFAULT_COST


def plan_jobs(requests: Sequence, folder: Path, cost: Callable[[str], float] = estimated_cost) -> list[fanout.Job]:
    """One job per (op, mode), in request and mode order (the scheduler orders them by cost)."""
    return [children.mode_job(request, get_mode(mode), folder, cost(request.config.op))
            for request in requests for mode in request.modes]


def control_jobs(requests: Sequence, folder: Path, cost: Callable[[str], float] = estimated_cost) -> list[fanout.Job]:
    """One control job per request that measures its control (not with --no-control)."""
    return [children.control_job(request, folder, CONTROL_SHARE * cost(request.config.op))
            for request in requests if request.control == control.HERE]


def run_suite(requests: Sequence, devices: Sequence[str], *, ray_address: Optional[str] = None,
              launcher: fanout.Launcher = fanout.subprocess_launcher, retries: int = 1,
              on_event: Optional[Callable[[fanout.Event], None]] = None,
              work_dir: Optional[Path] = None, per_device: int = 1) -> list[Evidence]:
    """Run every (op, mode) job and write each request's merged evidence to `request.out`; `per_device`
    jobs at once on each GPU, taking turns (harness/fanout.py; not with Ray, which gives each task a GPU)."""
    if ray_address is not None and per_device != 1:
        raise ValueError("run_suite: per_device applies to the fan-out over this host's GPUs, not to Ray")
    with tempfile.TemporaryDirectory(prefix="h3bench-suite-", dir=work_dir) as tmp:
        jobs = plan_jobs(requests, Path(tmp)) + control_jobs(requests, Path(tmp))
        if ray_address is not None:
            from h3bench.harness.fanout_ray import run_jobs_ray

            outcomes = run_jobs_ray(jobs, address=None if ray_address == "auto" else ray_address,
                                    retries=retries, on_event=on_event)
        else:
            outcomes = fanout.run_jobs(jobs, devices, launcher=launcher, retries=retries, on_event=on_event,
                                       per_device=per_device)
        by_key = {o.job.key: o for o in outcomes}
        found = []
        for request in requests:
            op = get_op(request.config.op)
            parts = [children.part_of(get_mode(m), by_key[f"{op.name}/{m}"]) for m in request.modes]
            evidence = combine_modes(op, request, parts)
            evidence.wall_s = round(sum(by_key[f"{op.name}/{m}"].wall_s for m in request.modes), 3)
            evidence.control = (children.control_of(by_key[f"{op.name}/control"]) if request.control == control.HERE
                                else control.unmeasured(request.control))
            if request.out is not None:
                save(evidence, request.out)
            found.append(evidence)
        return found
