"""Fan the suite out over the GPUs of one host: one worker per GPU, one job at a time per GPU, or with
`per_device` K, K jobs at once on each GPU taking turns (harness/gpu_turns.py: their bitwise probes
overlap, their timed phases run alone).

A job is one `h3bench run` (one op under one global mode) that writes one JSON part file. Jobs are
independent, so a worker that dies loses only its own job; that job is retried on another GPU (a
crash is often the GPU's fault, not the job's) and otherwise recorded as failed with the reason.
Longest job first, because the suite's wall time is bounded below by its longest job: starting it
last would leave the other GPUs idle at the end.

Standard library only: the scheduler must not import torch (the parent only hands out device ids;
each child initialises CUDA on its own GPU). `harness.fanout_ray` runs the same jobs on Ray.
"""
from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator, Mapping, Optional, Sequence

from h3bench.harness.gpu_turns import ENV as TURNS_ENV  # standard library only, as this module
from h3bench.harness.gpu_turns import TALLY_MARK

# NVLink multicast (NVLS) off in every child: it hangs or fails on some hosts (docs/decisions.md, "The fan-out").
REQUIRED_CHILD_ENV: Mapping[str, str] = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
}
STDERR_TAIL_LINES = 20
# A timed-out child gets SIGTERM first so CUDA can tear down cleanly, then SIGKILL after this long.
KILL_GRACE_S = 3.0
# The device slot of a run without a GPU: its child keeps the parent's CUDA_VISIBLE_DEVICES.
CPU = "cpu"
# How long a job (a mode's child) may run when the request names no limit: a full plan takes minutes, an
# hour means it hangs. Here, not in children.py, so the CLI's help can show it without importing torch.
DEFAULT_JOB_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class Job:
    key: str  # e.g. "adaln_projection/vllm"; unique within a run
    argv: tuple[str, ...]  # the full command, e.g. (sys.executable, "-m", "h3bench.cli", "run", ...)
    out: Path  # the part file the command writes
    cost_s: float  # estimated seconds, for longest-first ordering
    timeout_s: Optional[float] = None
    # Extra variables for the child (a mode's settings); the device assignment and
    # REQUIRED_CHILD_ENV still win over them.
    env: Mapping[str, str] = field(default_factory=dict, hash=False)

    @property
    def log(self) -> Path:
        return log_path(self.out)


def log_path(out: Path) -> Path:
    return Path(f"{out}.log")


@dataclass(frozen=True)
class LaunchResult:
    """What one attempt of one job did. `error` carries the launcher's own verdict (timeout, missing
    part file, could not start); without it, the exit status decides."""
    returncode: Optional[int]  # None: the child never exited on its own (killed on timeout, not started)
    stderr_tail: str = ""
    wall_s: float = 0.0
    error: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.returncode == 0

    def reason(self) -> str:
        """One line, phrased to follow 'worker on GPU 3 ...'."""
        if self.error is not None:
            return self.error
        reason = f"exited with status {describe_status(self.returncode)}"
        last = last_line("\n".join(line for line in self.stderr_tail.splitlines()
                                    if not line.startswith(TALLY_MARK)))
        return f"{reason}: {last}" if last else reason


Launcher = Callable[[Job, str], LaunchResult]


@dataclass(frozen=True)
class Attempt:
    device: str
    returncode: Optional[int]
    error: Optional[str]  # None when the attempt succeeded
    wall_s: float


@dataclass
class Outcome:
    job: Job
    device: Optional[str]  # the last device tried; None if the job never ran
    attempts: list[Attempt] = field(default_factory=list)
    ok: bool = False
    error: Optional[str] = None  # one line, every attempt's reason, for a failed job
    wall_s: float = 0.0  # summed over attempts


@dataclass(frozen=True)
class Event:
    kind: str  # "started", "finished", "failed" (for good) or "retrying"
    key: str
    device: Optional[str]
    attempt: int  # 1-based
    wall_s: float = 0.0
    message: str = ""  # a failure's reason; for "finished", the job's turns on its GPU (`turns_of`), if any


EventSink = Callable[[Event], None]


# ---------------------------------------------------------------- small pure helpers


def describe_status(returncode: Optional[int]) -> str:
    """`-9 (SIGKILL)` for a signal, the bare number otherwise."""
    if returncode is None:
        return "unknown"
    if returncode < 0:
        try:
            return f"{returncode} ({signal.Signals(-returncode).name})"
        except ValueError:
            pass
    return str(returncode)


def turns_of(tail: str) -> str:
    """What a job that shared its GPU said of its turns (harness/gpu_turns.py `summary`), without the mark;
    empty for a job that did not share one."""
    found = [line.strip() for line in tail.splitlines() if line.startswith(TALLY_MARK)]
    return found[-1][len(TALLY_MARK):].strip() if found else ""


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def failure_summary(attempts: Sequence[Attempt], where: str = "GPU") -> str:
    """'worker on GPU 3 exited with status -9 (SIGKILL); retried on GPU 1: exited with status 1: ...'"""
    parts = []
    for number, attempt in enumerate(attempts):
        reason = attempt.error or "succeeded"
        place = "the CPU" if attempt.device == CPU else f"{where} {attempt.device}"
        if number == 0:
            parts.append(f"worker on {place} {reason}")
        else:
            parts.append(f"retried on {place}: {reason}")
    return "; ".join(parts)


def parse_gpus(spec: str, available: int) -> list[str]:
    """'all' -> every visible GPU, 'N' -> the first N, '0,2,5' -> those ids. `available` is
    torch.cuda.device_count(), passed in so that this stays pure."""
    text = spec.strip().lower()
    if available < 1:
        raise ValueError(f"--gpus {spec}: no GPU is visible")
    if text == "all":
        return [str(i) for i in range(available)]
    if "," not in text:
        count = _as_int(text, spec)
        if count < 1 or count > available:
            raise ValueError(f"--gpus {spec}: asks for {count} GPU(s) but {available} are visible "
                             f"(give 1..{available}, 'all', or a list of ids such as 0,2)")
        return [str(i) for i in range(count)]
    ids = [_as_int(part.strip(), spec) for part in text.split(",")]
    out_of_range = [i for i in ids if not 0 <= i < available]
    if out_of_range:
        raise ValueError(f"--gpus {spec}: GPU id(s) {', '.join(map(str, out_of_range))} out of range; "
                         f"{available} are visible (ids 0..{available - 1})")
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ValueError(f"--gpus {spec}: GPU id(s) {', '.join(map(str, duplicates))} given twice")
    return [str(i) for i in ids]


def _as_int(text: str, spec: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"--gpus {spec!r}: expected 'all', a count such as 4, or ids such as 0,2,5"
                         ) from None


def longest_first(jobs: Sequence[Job]) -> list[int]:
    """Indices of `jobs`, most expensive first; ties keep input order (sorted() is stable)."""
    return sorted(range(len(jobs)), key=lambda i: -jobs[i].cost_s)


def check_jobs(jobs: Sequence[Job]) -> None:
    seen: set[str] = set()
    duplicates = []
    for job in jobs:
        if job.key in seen:
            duplicates.append(job.key)
        seen.add(job.key)
    if duplicates:
        raise ValueError(f"duplicate job key(s): {', '.join(sorted(set(duplicates)))}")


# ---------------------------------------------------------------- the subprocess launcher

# Process groups of children still running, so that an interrupted run_jobs can kill them: they sit
# in their own process groups (to be killable as a whole), so a terminal's Ctrl-C does not reach them.
_live_groups: set[int] = set()
_live_lock = threading.Lock()


def subprocess_launcher(job: Job, device: str) -> LaunchResult:
    """Run `job.argv` on GPU `device` (CUDA_VISIBLE_DEVICES; untouched for the CPU slot), output to
    `<out>.log`."""
    return launch_subprocess(job, {} if device == CPU else {"CUDA_VISIBLE_DEVICES": device})


def launch_subprocess(job: Job, env_overrides: Optional[Mapping[str, str]] = None) -> LaunchResult:
    """Run `job.argv` in its own process group with the parent's environment plus `job.env`,
    `env_overrides` and REQUIRED_CHILD_ENV (later ones win); stdout and stderr go to `<out>.log`.
    Shared with the Ray path, where Ray has already set CUDA_VISIBLE_DEVICES."""
    env = {**os.environ, **job.env, **(env_overrides or {}), **REQUIRED_CHILD_ENV}
    job.out.parent.mkdir(parents=True, exist_ok=True)
    # A part file left by an earlier run would make a failed attempt look like a success.
    job.out.unlink(missing_ok=True)
    start = time.monotonic()
    with open(job.log, "wb") as log:
        try:
            # stdout joins the log too: with --quiet it is near empty, and one file tells the story.
            proc = subprocess.Popen(job.argv, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            return LaunchResult(None, "", time.monotonic() - start,
                                error=f"could not start {job.argv[0]!r}: {exc.strerror or exc}")
        with _live_lock:
            _live_groups.add(proc.pid)
        try:
            returncode, timed_out = _wait(proc, job.timeout_s)
        finally:
            # Leftover grandchildren (compile workers, a stuck data loader) would hold the GPU.
            _kill_group(proc.pid, signal.SIGKILL)
            with _live_lock:
                _live_groups.discard(proc.pid)
    wall_s = time.monotonic() - start
    tail = read_tail(job.log)
    if timed_out:
        return LaunchResult(None, tail, wall_s,
                            error=f"timed out after {job.timeout_s:g} s (process group killed)")
    if returncode == 0 and not job.out.is_file():
        return LaunchResult(returncode, tail, wall_s,
                            error=f"exited with status 0 but did not write {job.out}")
    return LaunchResult(returncode, tail, wall_s)


def _wait(proc: subprocess.Popen, timeout_s: Optional[float]) -> tuple[int, bool]:
    """(returncode, timed_out). On timeout: SIGTERM to the group, SIGKILL after KILL_GRACE_S."""
    try:
        return proc.wait(timeout=timeout_s), False
    except subprocess.TimeoutExpired:
        pass
    _kill_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid, signal.SIGKILL)
    return proc.wait(), True


def _kill_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


def kill_running_children() -> None:
    """SIGKILL every process group the subprocess launcher still has running."""
    with _live_lock:
        groups = list(_live_groups)
    for pgid in groups:
        _kill_group(pgid, signal.SIGKILL)


def read_tail(path: Path, lines: int = STDERR_TAIL_LINES, max_bytes: int = 64 * 1024) -> str:
    """The last `lines` lines of a log that may be large (a chatty compile) or not valid UTF-8."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", errors="replace").splitlines()[-lines:])


# ---------------------------------------------------------------- the scheduler


@dataclass
class _Pending:
    index: int  # into the input job list
    failed_on: list[str] = field(default_factory=list)


class _Scheduler:
    """Shared state of the worker threads, all under one condition variable."""

    def __init__(self, jobs: Sequence[Job], devices: Sequence[str], launcher: Launcher,
                 retries: int, on_event: Optional[EventSink]):
        self.jobs = jobs
        self.devices = list(devices)
        self.launcher = launcher
        self.retries = retries
        self.on_event = on_event
        self.cond = threading.Condition()
        self.event_lock = threading.Lock()
        self.queue = [_Pending(i) for i in longest_first(jobs)]
        self.outcomes = [Outcome(job, None) for job in jobs]
        self.unresolved = len(jobs)
        self.crash: Optional[BaseException] = None  # a bug in a callback or here: stop everything

    # A worker thread: take a job this device may run, run it, record it; until every job is resolved.
    def work(self, device: str) -> None:
        try:
            for pending in self._take_loop(device):
                self._run_one(pending, device)
        except BaseException as exc:  # noqa: BLE001 - re-raised by run_jobs in the main thread
            with self.cond:
                self.crash = self.crash or exc
                self.cond.notify_all()

    def _take_loop(self, device: str) -> Iterator[_Pending]:
        while True:
            with self.cond:
                while True:
                    if self.unresolved == 0 or self.crash is not None:
                        return
                    pending = self._take(device)
                    if pending is not None:
                        break
                    # Nothing this device may take now; a retry or the last resolution wakes us.
                    self.cond.wait()
            yield pending

    def _take(self, device: str) -> Optional[_Pending]:
        """The first (most expensive) queued job that may run on `device`: one that has not already
        failed there, unless it has failed on every device."""
        for position, pending in enumerate(self.queue):
            untried = [d for d in self.devices if d not in pending.failed_on]
            if device in untried or not untried:
                return self.queue.pop(position)
        return None

    def _run_one(self, pending: _Pending, device: str) -> None:
        job = self.jobs[pending.index]
        attempt_no = len(pending.failed_on) + 1
        self._emit(Event("started", job.key, device, attempt_no))
        result = self._launch(job, device)
        attempt = Attempt(device, result.returncode, None if result.ok else result.reason(),
                          result.wall_s)
        outcome = self.outcomes[pending.index]
        outcome.attempts.append(attempt)
        outcome.device = device
        outcome.wall_s += result.wall_s
        if result.ok:
            outcome.ok = True
            self._emit(Event("finished", job.key, device, attempt_no, result.wall_s,
                             turns_of(result.stderr_tail)))
            self._resolve()
        elif attempt_no <= self.retries:
            # Emit before re-queueing, so the retry's "started" cannot overtake this event.
            self._emit(Event("retrying", job.key, device, attempt_no, result.wall_s, attempt.error))
            with self.cond:
                pending.failed_on.append(device)
                self.queue.append(pending)
                self.queue.sort(key=lambda p: (-self.jobs[p.index].cost_s, p.index))
                self.cond.notify_all()
        else:
            outcome.error = failure_summary(outcome.attempts)
            self._emit(Event("failed", job.key, device, attempt_no, result.wall_s, outcome.error))
            self._resolve()

    def _launch(self, job: Job, device: str) -> LaunchResult:
        """A launcher that raises loses its job, not its worker."""
        start = time.monotonic()
        try:
            return self.launcher(job, device)
        except Exception as exc:  # noqa: BLE001 - recorded as the attempt's reason
            return LaunchResult(None, "", time.monotonic() - start,
                                error=f"launcher raised {type(exc).__name__}: {exc}")

    def _resolve(self) -> None:
        with self.cond:
            self.unresolved -= 1
            if self.unresolved == 0:
                self.cond.notify_all()

    def _emit(self, event: Event) -> None:
        if self.on_event is not None:
            with self.event_lock:
                self.on_event(event)

    def abort(self, exc: BaseException) -> None:
        with self.cond:
            self.crash = self.crash or exc
            self.cond.notify_all()


def run_jobs(jobs: Sequence[Job], devices: Sequence[str], *, launcher: Launcher = subprocess_launcher,
             retries: int = 1, on_event: Optional[EventSink] = None, per_device: int = 1) -> list[Outcome]:
    """Run `jobs` on `devices`, `per_device` at a time per device, longest first; a failed job is retried
    up to `retries` times, each time on a device it has not failed on yet (the same one if there is no
    other). Outcomes come back in the order of `jobs`. `on_event` is called from the worker threads,
    one call at a time. With `per_device` above 1 the jobs of one device take turns on it: each gets
    H3BENCH_GPU_TURNS naming that device's turn files (harness/gpu_turns.py)."""
    if not devices:
        raise ValueError("run_jobs: no devices to run on (devices=[]); pass at least one GPU id")
    if len(set(devices)) != len(devices):
        raise ValueError(f"run_jobs: a device is listed twice in {list(devices)}")
    if retries < 0:
        raise ValueError(f"run_jobs: retries must be >= 0, got {retries}")
    if per_device < 1:
        raise ValueError(f"run_jobs: per_device must be >= 1, got {per_device}")
    check_jobs(jobs)
    if not jobs:
        return []
    if per_device == 1:
        return _run(jobs, devices, launcher, retries, on_event, 1)
    with tempfile.TemporaryDirectory(prefix="h3bench-turns-") as turns:
        return _run(jobs, devices, taking_turns(launcher, Path(turns)), retries, on_event, per_device)


def taking_turns(launcher: Launcher, folder: Path) -> Launcher:
    """`launcher` with each job's H3BENCH_GPU_TURNS set to its device's turn file in `folder`."""
    def launch(job: Job, device: str) -> LaunchResult:
        turns = str(folder / f"gpu-{device}.turns")
        return launcher(replace(job, env={**job.env, TURNS_ENV: turns}), device)
    return launch


def _run(jobs: Sequence[Job], devices: Sequence[str], launcher: Launcher, retries: int,
         on_event: Optional[EventSink], per_device: int) -> list[Outcome]:
    scheduler = _Scheduler(jobs, devices, launcher, retries, on_event)
    threads = [threading.Thread(target=scheduler.work, args=(device,), name=f"fanout-gpu{device}-{slot}",
                                daemon=True) for device in devices for slot in range(per_device)]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            # join() with a timeout, so that Ctrl-C reaches the main thread.
            while thread.is_alive():
                thread.join(timeout=0.5)
    except BaseException as exc:
        scheduler.abort(exc)
        kill_running_children()
        raise
    if scheduler.crash is not None:
        raise RuntimeError(f"fan-out stopped: {type(scheduler.crash).__name__}: {scheduler.crash}"
                           ) from scheduler.crash
    return scheduler.outcomes
