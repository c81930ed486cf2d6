"""The whole suite over several GPUs: every (op, mode) of the requests is one job (a child `h3bench run`
writing one part file), scheduled by harness/fanout.py on one host (`--gpus`) or by Ray beyond it
(`--ray`); the parts of each op are merged into its usual evidence file (harness.merge refuses parts
from different GPU models, drivers, torch builds or plans).

Longest first: a job's cost is its op's wall time in the last committed evidence when there is one
(reports/evidence/<op>_h200.json), else a default, so the heaviest ops start first.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Callable, Optional, Sequence

from h3bench.harness import children, fanout
from h3bench.harness.environment import REPO_ROOT
from h3bench.harness.modes import get_mode
from h3bench.harness.ops import get_op
from h3bench.harness.schema import Evidence, save

EVIDENCE_DIR = REPO_ROOT / "reports" / "evidence"
DEFAULT_COST_S = 60.0


def estimated_cost(op: str, evidence_dir: Path = EVIDENCE_DIR) -> float:
    """The op's wall time per mode in its last committed evidence, else DEFAULT_COST_S."""
    path = evidence_dir / f"{op}_h200.json"
    try:
        data = json.loads(path.read_text())
        modes = max(1, len(data.get("results", {})))
        return float(data["wall_s"]) / modes
    except (OSError, ValueError, KeyError, TypeError):
        return DEFAULT_COST_S


def plan_jobs(requests: Sequence, folder: Path, cost: Callable[[str], float] = estimated_cost) -> list[fanout.Job]:
    """One job per (op, mode), in request and mode order (the scheduler orders them by cost)."""
    return [children.mode_job(request, get_mode(mode), folder, cost(request.config.op))
            for request in requests for mode in request.modes]


def run_suite(requests: Sequence, devices: Sequence[str], *, ray_address: Optional[str] = None,
              launcher: fanout.Launcher = fanout.subprocess_launcher, retries: int = 1,
              on_event: Optional[Callable[[fanout.Event], None]] = None,
              work_dir: Optional[Path] = None) -> list[Evidence]:
    """Run every (op, mode) job and write each request's merged evidence to `request.out`."""
    with tempfile.TemporaryDirectory(prefix="h3bench-suite-", dir=work_dir) as tmp:
        jobs = plan_jobs(requests, Path(tmp))
        if ray_address is not None:
            from h3bench.harness.fanout_ray import run_jobs_ray

            outcomes = run_jobs_ray(jobs, address=None if ray_address == "auto" else ray_address,
                                    retries=retries, on_event=on_event)
        else:
            outcomes = fanout.run_jobs(jobs, devices, launcher=launcher, retries=retries, on_event=on_event)
        by_key = {o.job.key: o for o in outcomes}
        found = []
        for request in requests:
            op = get_op(request.config.op)
            parts = [children.part_of(get_mode(m), by_key[f"{op.name}/{m}"]) for m in request.modes]
            evidence = children.combine(op, request, parts)
            evidence.wall_s = round(sum(by_key[f"{op.name}/{m}"].wall_s for m in request.modes), 3)
            if request.out is not None:
                save(evidence, request.out)
            found.append(evidence)
        return found
