"""The multi-GPU fan-out (harness/fanout.py) and its Ray twin (harness/fanout_ray.py), on the CPU: a
fake launcher for the scheduling rules, tiny Python children for the real subprocess launcher."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pytest

from h3bench.harness import fanout
from h3bench.harness.fanout import Event, Job, LaunchResult, parse_gpus, read_tail, run_jobs, subprocess_launcher

# ---------------------------------------------------------------- a fake launcher


@dataclass
class FakeLauncher:
    """Runs nothing: sleeps `durations[key]` seconds and fails the (key, attempt) pairs in `failures`.
    Records the start/end order and checks that no job and no device is ever used twice at once. With
    `together`, every job waits at that barrier: the jobs run side by side, or the barrier breaks."""
    durations: dict[str, float] = field(default_factory=dict)
    together: Optional[threading.Barrier] = None
    failures: dict[tuple[str, int], LaunchResult] = field(default_factory=dict)
    raises: set[tuple[str, int]] = field(default_factory=set)
    calls: list[tuple[str, str, int]] = field(default_factory=list)  # (key, device, attempt) at start
    order: list[tuple[str, str, str]] = field(default_factory=list)  # ("start"|"end", key, device)
    violations: list[str] = field(default_factory=list)
    peak_busy: int = 0
    _running: dict[str, str] = field(default_factory=dict)  # key -> device
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, job: Job, device: str) -> LaunchResult:
        with self._lock:
            attempt = 1 + sum(1 for key, _, _ in self.calls if key == job.key)
            if job.key in self._running:
                self.violations.append(f"{job.key} on {device} while on {self._running[job.key]}")
            if device in self._running.values():
                self.violations.append(f"device {device} given {job.key} while busy")
            self._running[job.key] = device
            self.peak_busy = max(self.peak_busy, len(self._running))
            self.calls.append((job.key, device, attempt))
            self.order.append(("start", job.key, device))
        duration = self.durations.get(job.key, 0.0)
        time.sleep(duration)
        if self.together is not None:
            self.together.wait()
        with self._lock:
            del self._running[job.key]
            self.order.append(("end", job.key, device))
        if (job.key, attempt) in self.raises:
            raise OSError("launcher blew up")
        return self.failures.get((job.key, attempt), LaunchResult(0, "", duration))

    def devices_of(self, key: str) -> list[str]:
        return [device for k, device, _ in self.calls if k == key]


def make_jobs(costs: dict[str, float], tmp_path: Path) -> list[Job]:
    return [Job(key, ("true",), tmp_path / f"{key.replace('/', '_')}.json", cost)
            for key, cost in costs.items()]


SIGKILLED = LaunchResult(-9, "", 0.0)


def crashed(message: str, status: int = 1) -> LaunchResult:
    return LaunchResult(status, f"Traceback (most recent call last):\n  ...\n{message}\n", 0.0)


# ---------------------------------------------------------------- scheduling with the fake launcher


def test_longest_first_on_one_device_ties_keep_input_order(tmp_path):
    jobs = make_jobs({"a": 1, "b": 5, "c": 3, "d": 5, "e": 2}, tmp_path)
    launcher = FakeLauncher()
    outcomes = run_jobs(jobs, ["0"], launcher=launcher)
    assert [key for key, _, _ in launcher.calls] == ["b", "d", "c", "e", "a"]
    assert [o.job.key for o in outcomes] == ["a", "b", "c", "d", "e"]  # input order
    assert all(o.ok and o.device == "0" and o.error is None for o in outcomes)


def test_three_devices_six_jobs_all_busy_never_shared(tmp_path):
    jobs = make_jobs({f"op{i}/plain": 1.0 for i in range(6)}, tmp_path)
    # three at a time or the barrier breaks (one after another, a job would wait for the other two in vain)
    launcher = FakeLauncher(together=threading.Barrier(3, timeout=60))
    outcomes = run_jobs(jobs, ["0", "1", "2"], launcher=launcher)
    assert launcher.violations == []
    assert launcher.peak_busy == 3
    assert {device for _, device, _ in launcher.calls} == {"0", "1", "2"}
    assert len(launcher.calls) == 6 and all(o.ok for o in outcomes)


def test_dead_worker_is_retried_once_on_another_device(tmp_path):
    jobs = make_jobs({"a": 3, "b": 2, "c": 1}, tmp_path)
    launcher = FakeLauncher(durations={"a": 0.05, "b": 0.05, "c": 0.05}, failures={("b", 1): SIGKILLED})
    outcomes = {o.job.key: o for o in run_jobs(jobs, ["0", "1"], launcher=launcher)}
    first, second = launcher.devices_of("b")
    assert first != second
    b = outcomes["b"]
    assert b.ok and b.error is None and b.device == second
    assert [a.device for a in b.attempts] == [first, second]
    assert b.attempts[0].returncode == -9 and "SIGKILL" in b.attempts[0].error
    assert b.attempts[1].error is None
    assert outcomes["a"].ok and outcomes["c"].ok and launcher.violations == []


def test_job_failing_twice_is_recorded_with_both_reasons_and_the_others_finish(tmp_path):
    jobs = make_jobs({"a": 3, "bad": 2, "c": 1, "d": 1}, tmp_path)
    launcher = FakeLauncher(durations=dict.fromkeys(["a", "bad", "c", "d"], 0.03),
                            failures={("bad", 1): SIGKILLED, ("bad", 2): crashed("RuntimeError: boom")})
    outcomes = {o.job.key: o for o in run_jobs(jobs, ["3", "1"], launcher=launcher)}
    bad = outcomes["bad"]
    first, second = launcher.devices_of("bad")
    assert not bad.ok and len(bad.attempts) == 2 and first != second
    assert bad.error == (f"worker on GPU {first} exited with status -9 (SIGKILL); "
                         f"retried on GPU {second}: exited with status 1: RuntimeError: boom")
    assert "\n" not in bad.error
    assert all(outcomes[key].ok for key in ("a", "c", "d"))


def test_retries_avoid_every_device_already_failed_on(tmp_path):
    jobs = make_jobs({"bad": 1}, tmp_path)
    launcher = FakeLauncher(failures={("bad", n): SIGKILLED for n in (1, 2, 3)})
    [outcome] = run_jobs(jobs, ["0", "1", "2"], launcher=launcher, retries=2)
    assert sorted(launcher.devices_of("bad")) == ["0", "1", "2"]
    assert not outcome.ok and outcome.error.count("retried on GPU") == 2


def test_single_device_retries_on_the_same_device(tmp_path):
    jobs = make_jobs({"a": 1}, tmp_path)
    launcher = FakeLauncher(failures={("a", 1): SIGKILLED})
    [outcome] = run_jobs(jobs, ["5"], launcher=launcher)
    assert launcher.devices_of("a") == ["5", "5"] and outcome.ok


def test_retries_zero_fails_at_once(tmp_path):
    launcher = FakeLauncher(failures={("a", 1): crashed("oops")})
    [outcome] = run_jobs(make_jobs({"a": 1}, tmp_path), ["0", "1"], launcher=launcher, retries=0)
    assert outcome.error == "worker on GPU 0 exited with status 1: oops"
    assert len(launcher.calls) == 1


def test_a_launcher_that_raises_loses_its_job_not_its_worker(tmp_path):
    jobs = make_jobs({"a": 2, "b": 1}, tmp_path)
    launcher = FakeLauncher(raises={("a", 1), ("a", 2)})
    outcomes = {o.job.key: o for o in run_jobs(jobs, ["0"], launcher=launcher)}
    assert not outcomes["a"].ok and "launcher raised OSError: launcher blew up" in outcomes["a"].error
    assert outcomes["b"].ok


def test_events_are_serialized_and_in_order(tmp_path):
    jobs = make_jobs({f"j{i}": i for i in range(8)}, tmp_path)
    launcher = FakeLauncher(durations={job.key: 0.02 for job in jobs},
                            failures={("j5", 1): SIGKILLED, ("j2", 1): SIGKILLED, ("j2", 2): SIGKILLED})
    events: list[Event] = []
    inside = threading.Event()
    overlaps: list[Event] = []

    def on_event(event: Event) -> None:
        if inside.is_set():
            overlaps.append(event)
        inside.set()
        time.sleep(0.002)  # widen the window in which a concurrent call would be seen
        events.append(event)
        inside.clear()

    outcomes = run_jobs(jobs, ["0", "1", "2"], launcher=launcher, on_event=on_event)
    assert overlaps == []
    for job in jobs:
        mine = [(e.kind, e.attempt) for e in events if e.key == job.key]
        if job.key == "j5":
            assert mine == [("started", 1), ("retrying", 1), ("started", 2), ("finished", 2)]
        elif job.key == "j2":
            assert mine == [("started", 1), ("retrying", 1), ("started", 2), ("failed", 2)]
        else:
            assert mine == [("started", 1), ("finished", 1)]
    failed = next(e for e in events if e.kind == "failed")
    assert failed.message == next(o for o in outcomes if o.job.key == "j2").error
    assert all(e.device in {"0", "1", "2"} for e in events)


def test_run_jobs_argument_errors(tmp_path):
    jobs = make_jobs({"a": 1}, tmp_path)
    with pytest.raises(ValueError, match="no devices"):
        run_jobs(jobs, [], launcher=FakeLauncher())
    with pytest.raises(ValueError, match="duplicate job key.*a"):
        run_jobs(jobs + jobs, ["0"], launcher=FakeLauncher())
    with pytest.raises(ValueError, match="listed twice"):
        run_jobs(jobs, ["0", "0"], launcher=FakeLauncher())
    assert run_jobs([], ["0"], launcher=FakeLauncher()) == []


def test_a_crashing_event_callback_stops_the_run_instead_of_hanging(tmp_path):
    def on_event(event: Event) -> None:
        raise KeyError("bad printer")

    with pytest.raises(RuntimeError, match="fan-out stopped: KeyError"):
        run_jobs(make_jobs({"a": 1, "b": 1}, tmp_path), ["0", "1"], launcher=FakeLauncher(),
                 on_event=on_event)


# ---------------------------------------------------------------- the real subprocess launcher


def py_job(tmp_path: Path, key: str, code: str, timeout_s: Optional[float] = None) -> Job:
    """A job whose command is a tiny Python child; `OUT` in `code` is its part file's path."""
    out = tmp_path / f"{key}.json"
    return Job(key, (sys.executable, "-c", f"OUT = {str(out)!r}\n{code}"), out, 1.0, timeout_s)


def gone(pid: int) -> bool:
    """Dead or a zombie (PID 1 in a container may not reap orphans)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def wait_until(predicate, timeout_s: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def test_timeout_kills_the_whole_process_group(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    code = (f"import subprocess, time\n"
            f"p = subprocess.Popen(['sleep', '60'])\n"
            f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
            f"time.sleep(60)\n")
    job = py_job(tmp_path, "slow", code, timeout_s=1.0)
    result = subprocess_launcher(job, "0")
    assert not result.ok and result.returncode is None
    assert result.error == "timed out after 1 s (process group killed)"
    assert 1.0 <= result.wall_s < 1.0 + fanout.KILL_GRACE_S
    grandchild = int(pid_file.read_text())
    assert wait_until(lambda: gone(grandchild)), "the grandchild survived the timeout"


def test_timeout_sigkills_a_child_that_ignores_sigterm(tmp_path, monkeypatch):
    monkeypatch.setattr(fanout, "KILL_GRACE_S", 0.3)
    code = ("import signal, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n")
    job = py_job(tmp_path, "stubborn", code, timeout_s=0.5)
    result = subprocess_launcher(job, "0")
    assert result.error.startswith("timed out after 0.5 s") and result.wall_s < 3


def test_each_worker_child_sees_its_own_gpu(tmp_path):
    code = ("import json, os\n"
            "keys = ['CUDA_VISIBLE_DEVICES', 'NCCL_NVLS_ENABLE', 'TORCH_SYMM_MEM_DISABLE_MULTICAST']\n"
            "json.dump({k: os.environ.get(k) for k in keys}, open(OUT, 'w'))\n")
    jobs = [py_job(tmp_path, f"env{i}", code) for i in range(4)]
    outcomes = run_jobs(jobs, ["0", "1"])
    for outcome in outcomes:
        assert outcome.ok, outcome.error
        seen = json.loads(outcome.job.out.read_text())
        assert seen == {"CUDA_VISIBLE_DEVICES": outcome.device, "NCCL_NVLS_ENABLE": "0",
                        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
    assert {o.device for o in outcomes} == {"0", "1"}


def test_job_env_reaches_the_child_but_cannot_override_the_device(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    code = ("import json, os\n"
            "keys = ['CUDA_VISIBLE_DEVICES', 'H3BENCH_MODE_VAR', 'NCCL_NVLS_ENABLE']\n"
            "json.dump({k: os.environ.get(k) for k in keys}, open(OUT, 'w'))\n")
    job = py_job(tmp_path, "mode", code)
    job = Job(job.key, job.argv, job.out, job.cost_s,
              env={"H3BENCH_MODE_VAR": "1", "CUDA_VISIBLE_DEVICES": "7", "NCCL_NVLS_ENABLE": "1"})
    assert subprocess_launcher(job, "2").ok
    assert json.loads(job.out.read_text()) == {"CUDA_VISIBLE_DEVICES": "2", "H3BENCH_MODE_VAR": "1",
                                               "NCCL_NVLS_ENABLE": "0"}
    # The CPU slot leaves the parent's CUDA_VISIBLE_DEVICES alone (the job's own value then applies).
    assert subprocess_launcher(Job(job.key, job.argv, job.out, job.cost_s), fanout.CPU).ok
    assert json.loads(job.out.read_text())["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"


def test_failure_on_the_cpu_slot_reads_naturally(tmp_path):
    launcher = FakeLauncher(failures={("a", 1): crashed("oops")})
    [outcome] = run_jobs(make_jobs({"a": 1}, tmp_path), [fanout.CPU], launcher=launcher, retries=0)
    assert outcome.error == "worker on the CPU exited with status 1: oops"


def test_exit_zero_without_a_part_file_fails_even_with_a_stale_one(tmp_path):
    job = py_job(tmp_path, "lazy", "pass")
    job.out.write_text("{}")  # left by an earlier run
    result = subprocess_launcher(job, "0")
    assert result.returncode == 0 and not result.ok
    assert result.error == f"exited with status 0 but did not write {job.out}"
    assert not job.out.exists()


def test_failure_reason_is_the_last_stderr_line_and_the_log_keeps_it_all(tmp_path):
    code = "import sys\nprint('hello on stdout')\nsys.exit('ValueError: no such adapter')\n"
    job = py_job(tmp_path, "broken", code)
    [outcome] = run_jobs([job], ["2"], retries=0)
    assert outcome.error == "worker on GPU 2 exited with status 1: ValueError: no such adapter"
    log = job.log.read_text()
    assert "hello on stdout" in log and "no such adapter" in log
    assert job.log == tmp_path / "broken.json.log"


def test_a_command_that_cannot_start_is_a_failure(tmp_path):
    job = Job("nope", (str(tmp_path / "no-such-program"),), tmp_path / "nope.json", 1.0)
    result = subprocess_launcher(job, "0")
    assert result.returncode is None and result.error.startswith("could not start")


# ---------------------------------------------------------------- parse_gpus


@pytest.mark.parametrize("spec, available, expected", [
    ("all", 4, ["0", "1", "2", "3"]),
    ("ALL", 1, ["0"]),
    ("2", 8, ["0", "1"]),
    ("8", 8, [str(i) for i in range(8)]),
    ("0,2,5", 8, ["0", "2", "5"]),
    (" 3, 1 ", 4, ["3", "1"]),
])
def test_parse_gpus(spec, available, expected):
    assert parse_gpus(spec, available) == expected


@pytest.mark.parametrize("spec, available, message", [
    ("9", 8, "asks for 9 GPU.*but 8 are visible"),
    ("0", 8, "asks for 0 GPU.*but 8 are visible"),
    ("-1", 8, "asks for -1"),
    ("0,8", 8, "id.* 8 out of range; 8 are visible"),
    ("1,1", 4, "1 given twice"),
    ("x", 4, "expected 'all', a count"),
    ("0,,1", 4, "expected 'all'"),
    ("all", 0, "no GPU is visible"),
])
def test_parse_gpus_errors(spec, available, message):
    with pytest.raises(ValueError, match=message):
        parse_gpus(spec, available)


def test_fanout_does_not_import_torch():
    import subprocess
    code = "import sys, harness.fanout; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


# ---------------------------------------------------------------- Ray


def test_run_jobs_ray_without_ray_says_how_to_install(tmp_path, monkeypatch):
    from h3bench.harness.fanout_ray import run_jobs_ray

    monkeypatch.setitem(sys.modules, "ray", None)  # makes `import ray` raise ImportError
    with pytest.raises(RuntimeError, match=r"Ray is not installed: pip install 'h3bench\[ray\]'"):
        run_jobs_ray([py_job(tmp_path, "a", "pass")], num_gpus_per_job=0, local_mode=True)


@dataclass
class RayRun:
    outcomes: dict[str, fanout.Outcome]
    events: list[Event]


@pytest.fixture(scope="module")
def ray_run(tmp_path_factory) -> RayRun:
    """One private local Ray for the module (it takes seconds to start): three good jobs and one that
    always fails, through run_jobs_ray's own init and shutdown."""
    if os.environ.get("H3BENCH_REQUIRE_RAY") == "1":  # .ci/run: CI installs the extra, so these must run
        import ray
    else:
        ray = pytest.importorskip("ray", reason="Ray is not installed on this machine (optional extra h3bench[ray])")
    from h3bench.harness.fanout_ray import run_jobs_ray

    tmp_path = tmp_path_factory.mktemp("ray")
    good = "import json, os\njson.dump({'job': os.path.basename(OUT)}, open(OUT, 'w'))\n"
    jobs = [py_job(tmp_path, f"good{i}", good) for i in range(3)]
    jobs.append(py_job(tmp_path, "bad", "import sys\nsys.exit('RuntimeError: always broken')\n"))
    events: list[Event] = []
    outcomes = run_jobs_ray(jobs, num_gpus_per_job=0, local_mode=True, on_event=events.append)
    assert not ray.is_initialized()  # it started its own Ray, so it shut it down
    return RayRun({o.job.key: o for o in outcomes}, events)


def test_ray_runs_jobs_and_writes_their_part_files(ray_run):
    for i in range(3):
        outcome = ray_run.outcomes[f"good{i}"]
        assert outcome.ok and outcome.error is None and len(outcome.attempts) == 1
        assert json.loads(outcome.job.out.read_text()) == {"job": f"good{i}.json"}
        assert outcome.device  # the node's IP address


def test_ray_retries_a_failing_job_once_then_records_it(ray_run):
    bad = ray_run.outcomes["bad"]
    assert not bad.ok and len(bad.attempts) == 2 and not bad.job.out.exists()
    node = bad.device
    assert bad.error == (f"worker on node {node} exited with status 1: RuntimeError: always broken; "
                         f"retried on node {node}: exited with status 1: RuntimeError: always broken")
    kinds = [(e.kind, e.attempt) for e in ray_run.events if e.key == "bad"]
    assert kinds == [("started", 1), ("retrying", 1), ("started", 2), ("failed", 2)]


def test_a_harness_error_in_a_jobs_run_is_its_failure_reason_whole(tmp_path):
    """A job's reason is the last line of its log: a harness error's traceback, printed to a file, ends in
    the exception whole (rich would wrap it to the file's width and leave its tail as the reason)."""
    message = "CUDA out of memory. Tried to allocate 8.00 GiB. " + "Of the allocated memory " * 8
    code = ("import h3bench.harness.runner as runner\n"
            f"def fails(*args, **kwargs): raise RuntimeError({message!r})\n"
            "runner.run = fails\n"
            "from h3bench.cli import main\n"
            "main()\n")
    log = tmp_path / "job.log"
    with open(log, "wb") as out:
        returncode = subprocess.run([sys.executable, "-c", code, "run", "--op", "timestep_sinusoid", "--quick",
                                     "--device", "cpu", "--no-render", "--out", str(tmp_path / "ts.json")],
                                    stdout=out, stderr=subprocess.STDOUT, timeout=300).returncode
    assert LaunchResult(returncode, read_tail(log)).reason() == \
        f"exited with status 1: RuntimeError: {message.strip()}"
