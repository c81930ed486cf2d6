"""The suite's jobs on a Ray cluster, for more GPUs than one host has: one Ray task per job, each
asking Ray for `num_gpus_per_job` GPUs (Ray sets CUDA_VISIBLE_DEVICES in the task), instead of the
one-host scheduler in `harness.fanout`. Same Job, Outcome and Event types, same retry rule.

Ray is optional (`pip install 'h3bench[ray]'`) and imported only inside functions. A task runs the
job's command with the local launcher's code (timeout, process group, `<out>.log`) and sends the part
file back as text, because the worker may be on another host; the driver writes it to `job.out`.
"""
from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from h3bench.harness.fanout import (Attempt, Event, EventSink, Job, LaunchResult, Outcome, check_jobs,
                            failure_summary, launch_subprocess, longest_first, turns_of)

RAY_MISSING = "Ray is not installed: pip install 'h3bench[ray]'"


@dataclass(frozen=True)
class TaskReply:
    """What a task sends back; `to_json`/`from_json` are the wire form (plain types only)."""
    result: LaunchResult
    json_text: Optional[str]  # the part file, when the command succeeded
    node: str  # IP address of the node the task ran on

    def to_json(self) -> dict[str, Any]:
        return {"returncode": self.result.returncode, "stderr_tail": self.result.stderr_tail,
                "wall_s": self.result.wall_s, "error": self.result.error, "json": self.json_text,
                "node": self.node}

    @staticmethod
    def from_json(data: dict[str, Any]) -> "TaskReply":
        result = LaunchResult(data["returncode"], data["stderr_tail"], data["wall_s"], data["error"])
        return TaskReply(result, data["json"], data["node"])


def run_job_task(job: Job) -> dict[str, Any]:
    """The body of the Ray task (module level, so that Ray pickles it by reference)."""
    import ray

    result = launch_subprocess(job)  # no CUDA_VISIBLE_DEVICES: Ray has set it for this task
    text = None
    if result.ok:
        try:
            text = job.out.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            result = LaunchResult(result.returncode, result.stderr_tail, result.wall_s,
                                  error=f"wrote {job.out} but it cannot be read back: {exc}")
    return TaskReply(result, text, ray.util.get_node_ip_address()).to_json()


def run_jobs_ray(jobs: Sequence[Job], *, address: Optional[str] = None, num_gpus_per_job: float = 1,
                 retries: int = 1, on_event: Optional[EventSink] = None,
                 local_mode: bool = False) -> list[Outcome]:
    """Run `jobs` as Ray tasks, submitted longest first; a failed task is resubmitted up to `retries`
    times (Ray cannot be told to avoid a node, so a retry may land on the same one). Outcomes in the
    order of `jobs`; `Attempt.device` is the node's IP address.

    `local_mode=True` starts a private one-node Ray on this machine (Ray >= 2.50 no longer has its own
    serial local mode); otherwise `address` (or RAY_ADDRESS) names the cluster. `num_gpus_per_job=0`
    runs on CPU-only machines (tests)."""
    if num_gpus_per_job < 0:
        raise ValueError(f"run_jobs_ray: num_gpus_per_job must be >= 0, got {num_gpus_per_job}")
    if retries < 0:
        raise ValueError(f"run_jobs_ray: retries must be >= 0, got {retries}")
    if local_mode and address is not None:
        raise ValueError(f"run_jobs_ray: local_mode starts its own Ray; do not also pass address={address!r}")
    check_jobs(jobs)
    if not jobs:
        return []
    ray = import_ray()
    started_here = _init(ray, address, local_mode)
    try:
        return _Driver(ray, jobs, num_gpus_per_job, retries, on_event).run()
    finally:
        if started_here:
            ray.shutdown()


def import_ray():
    try:
        import ray
    except ImportError as exc:
        raise RuntimeError(RAY_MISSING) from exc
    return ray


def _init(ray, address: Optional[str], local_mode: bool) -> bool:
    """Connect (or start a local Ray); True when this call did, so that it also shuts it down. A Ray
    the caller already initialised is used as it is."""
    if ray.is_initialized():
        return False
    if local_mode:
        ray.init(address="local", include_dashboard=False, ignore_reinit_error=True)
    else:
        ray.init(address=address, ignore_reinit_error=True)
    return True


class _Driver:
    """Submits tasks and collects them as they finish, in the driver's one thread."""

    def __init__(self, ray, jobs: Sequence[Job], num_gpus: float, retries: int,
                 on_event: Optional[EventSink]):
        self.ray = ray
        self.jobs = jobs
        self.retries = retries
        self.on_event = on_event
        # max_retries=0: a crashed task comes back to us as an error and follows our retry rule.
        self.remote = ray.remote(num_gpus=num_gpus, max_retries=0)(run_job_task)
        self.outcomes = [Outcome(job, None) for job in jobs]
        self.inflight: dict[Any, tuple[int, float]] = {}  # ObjectRef -> (job index, submit time)
        self.driver_node = ray.util.get_node_ip_address()

    def run(self) -> list[Outcome]:
        for index in longest_first(self.jobs):
            # A stale part file here would survive a failed remote attempt.
            self.jobs[index].out.unlink(missing_ok=True)
            self._submit(index)
        try:
            while self.inflight:
                ready, _ = self.ray.wait(list(self.inflight), num_returns=1)
                index, submitted = self.inflight.pop(ready[0])
                self._record(index, self._reply(ready[0], submitted))
        except BaseException:
            # Not force=True: a plain cancel raises KeyboardInterrupt in the task, whose launcher then
            # kills the job's process group; killing the Ray worker outright would orphan that group.
            for ref in self.inflight:
                self.ray.cancel(ref)
            raise
        return self.outcomes

    def _submit(self, index: int) -> None:
        job = self.jobs[index]
        attempt_no = len(self.outcomes[index].attempts) + 1
        ref = self.remote.remote(job)
        self.inflight[ref] = (index, time.monotonic())
        self._emit(Event("started", job.key, None, attempt_no, message="submitted to Ray"))

    def _reply(self, ref, submitted: float) -> TaskReply:
        """The task's reply, or a failed one when Ray lost the task (worker died, node gone)."""
        try:
            return TaskReply.from_json(self.ray.get(ref))
        except Exception as exc:  # noqa: BLE001 - recorded as the attempt's reason
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            error = f"Ray task failed: {type(exc).__name__}" + (f": {first}" if first else "")
            return TaskReply(LaunchResult(None, "", time.monotonic() - submitted, error), None, "?")

    def _record(self, index: int, reply: TaskReply) -> None:
        job, outcome, result = self.jobs[index], self.outcomes[index], reply.result
        attempt_no = len(outcome.attempts) + 1
        ok = result.ok and reply.json_text is not None
        error = None if ok else result.reason() if not result.ok else "sent no part file back"
        outcome.attempts.append(Attempt(reply.node, result.returncode, error, result.wall_s))
        outcome.device = reply.node
        outcome.wall_s += result.wall_s
        if reply.node not in (self.driver_node, "?"):
            _write_text(job.log, result.stderr_tail + "\n")  # the full log stays on that node
        if ok:
            _write_text(job.out, reply.json_text)
            outcome.ok = True
            self._emit(Event("finished", job.key, reply.node, attempt_no, result.wall_s,
                             turns_of(result.stderr_tail)))
        elif attempt_no <= self.retries:
            self._emit(Event("retrying", job.key, reply.node, attempt_no, result.wall_s, error or ""))
            self._submit(index)
        else:
            outcome.error = failure_summary(outcome.attempts, where="node")
            self._emit(Event("failed", job.key, reply.node, attempt_no, result.wall_s, outcome.error))

    def _emit(self, event: Event) -> None:
        if self.on_event is not None:
            self.on_event(event)


def _write_text(path: Path, text: str) -> None:
    """Atomically, so that a reader never sees half a part file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
