"""Runs that share a GPU take turns (harness/gpu_turns.py): probes together, measurements alone. The turns
between processes (flock, real child processes), what a run holds when it measures, the fan-out that sets
the turns up (`--per-gpu`), and the command line's checks."""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import re
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

from h3bench.harness import fanout, gpu_turns
from h3bench.harness.fanout import Job, LaunchResult, run_jobs

# A child that takes one turn: it marks `<log>.asked` as it asks and `<log>.held` once it holds the turn, keeps
# it until `<log>.release` appears, and writes when it got the turn and when it let it go (seconds since the
# epoch). Every wait in these tests is such a hand-shake through files, never a fixed sleep.
CHILD = """
import sys, time
from pathlib import Path
from h3bench.harness import gpu_turns
kind, log = sys.argv[1], sys.argv[2]
Path(log + ".asked").touch()
with getattr(gpu_turns, kind)():
    start = time.time()
    Path(log + ".held").touch()
    deadline = time.monotonic() + 120
    while not Path(log + ".release").exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    end = time.time()
open(log, "w").write(f"{start} {end}")
"""


def _take(kind: str, log: Path, turns: Path) -> subprocess.Popen:
    env = {**os.environ, gpu_turns.ENV: str(turns)}
    return subprocess.Popen([sys.executable, "-c", CHILD, kind, str(log)], env=env)


def _release(log: Path) -> None:
    Path(f"{log}.release").touch()


def _wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, f"{what} never happened"
        time.sleep(0.005)


def _appeared(marker: Path) -> None:
    _wait_for(marker.exists, f"{marker.name} appearing")


def _gate_closed(turns: Path) -> bool:
    """Whether an exclusive turn holds the gate (it then waits for the shared turns in flight, or runs)."""
    with open(f"{turns}.gate", "a") as gate:
        try:
            fcntl.flock(gate, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(gate, fcntl.LOCK_UN)
        return False


def _span(log: Path) -> tuple[float, float]:
    start, end = log.read_text().split()
    return float(start), float(end)


def _wait_all(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        assert proc.wait(timeout=60) == 0


def _in_thread(step) -> threading.Thread:
    thread = threading.Thread(target=step, daemon=True)
    thread.start()
    return thread


def test_an_exclusive_turn_waits_for_shared_ones_and_keeps_new_ones_out(tmp_path):
    turns = tmp_path / "gpu-0.turns"
    first = _take("shared", tmp_path / "first", turns)
    _appeared(tmp_path / "first.held")
    alone = _take("exclusive", tmp_path / "alone", turns)
    _wait_for(lambda: _gate_closed(turns), "the exclusive turn closing the gate")
    late = _take("shared", tmp_path / "late", turns)
    _appeared(tmp_path / "late.asked")
    assert not (tmp_path / "alone.held").exists()  # it waits for the probe in flight
    _release(tmp_path / "first")
    _appeared(tmp_path / "alone.held")
    assert not (tmp_path / "late.held").exists()  # a probe asked for while the measurement waited stays out
    _release(tmp_path / "alone")
    _appeared(tmp_path / "late.held")
    _release(tmp_path / "late")
    _wait_all([first, alone, late])
    first_span, alone_span, late_span = (_span(tmp_path / n) for n in ("first", "alone", "late"))
    assert first_span[1] <= alone_span[0] and alone_span[1] <= late_span[0]


def test_shared_turns_overlap(tmp_path):
    turns = tmp_path / "gpu-0.turns"
    first = _take("shared", tmp_path / "p0", turns)
    _appeared(tmp_path / "p0.held")
    second = _take("shared", tmp_path / "p1", turns)
    _appeared(tmp_path / "p1.held")  # while the first still holds its turn
    assert not (tmp_path / "p0").exists()
    for name in ("p0", "p1"):
        _release(tmp_path / name)
    _wait_all([first, second])


def test_exclusive_turns_do_not_overlap(tmp_path):
    turns = tmp_path / "gpu-0.turns"
    procs = [_take("exclusive", tmp_path / f"p{i}", turns) for i in range(2)]
    _wait_for(lambda: any((tmp_path / f"p{i}.held").exists() for i in range(2)), "one exclusive turn")
    holder, waiter = ("p0", "p1") if (tmp_path / "p0.held").exists() else ("p1", "p0")
    _appeared(tmp_path / f"{waiter}.asked")
    assert not (tmp_path / f"{waiter}.held").exists()
    _release(tmp_path / holder)
    _appeared(tmp_path / f"{waiter}.held")
    _release(tmp_path / waiter)
    _wait_all(procs)
    assert _span(tmp_path / holder)[1] <= _span(tmp_path / waiter)[0]


def test_without_the_variable_every_turn_is_free_and_nested_turns_are_the_outer_one(tmp_path, monkeypatch):
    monkeypatch.delenv(gpu_turns.ENV, raising=False)
    with gpu_turns.exclusive(), gpu_turns.shared():
        pass
    monkeypatch.setenv(gpu_turns.ENV, str(tmp_path / "gpu-0.turns"))
    # would wait for itself forever if it were a new turn: a thread, so that a hang fails instead
    done = threading.Event()

    def nested() -> None:
        with gpu_turns.shared(), gpu_turns.exclusive():
            pass
        done.set()
    thread = _in_thread(nested)
    assert done.wait(timeout=60)
    thread.join(timeout=60)


@pytest.fixture
def turns(tmp_path, monkeypatch) -> Path:
    """This process shares a GPU whose turn file is in tmp_path, with a tally of its own."""
    path = tmp_path / "gpu-0.turns"
    monkeypatch.setenv(gpu_turns.ENV, str(path))
    monkeypatch.setattr(gpu_turns, "_tally", gpu_turns.Tally())
    return path


class _Clock:
    """gpu_turns' monotonic clock, moved by the test alone: the tally's seconds become exact. `asked` is
    set at the first reading (a turn asked for)."""

    def __init__(self):
        self.now, self.asked = 0.0, threading.Event()

    def monotonic(self) -> float:
        now = self.now  # read before the event lets a helper move the clock
        self.asked.set()
        return now


@pytest.fixture
def clock(monkeypatch) -> _Clock:
    found = _Clock()
    monkeypatch.setattr(gpu_turns, "time", types.SimpleNamespace(monotonic=found.monotonic))
    return found


def test_a_run_counts_its_turns_and_the_seconds_it_waited_for_them(tmp_path, turns, clock):
    """A shared turn asked for while another process holds an exclusive one waits for it: the tally has
    that wait, the seconds held, and each kind's count; nested turns are the outer one's."""
    other = _take("exclusive", tmp_path / "other", turns)
    _appeared(tmp_path / "other.held")

    def release_after_the_ask() -> None:  # the wait this process's turn has: 5 s on the test's clock
        clock.asked.wait(timeout=60)
        clock.now += 5.0
        _release(tmp_path / "other")
    helper = _in_thread(release_after_the_ask)
    with gpu_turns.shared():
        clock.now += 2.0
        with gpu_turns.exclusive():  # the outer turn's: no count of its own
            pass
    helper.join(timeout=60)
    with gpu_turns.exclusive():
        pass
    _wait_all([other])
    tally = gpu_turns.tally()
    assert (tally.shared.turns, tally.exclusive.turns) == (1, 1)
    assert (tally.shared.waited_s, tally.shared.held_s) == (5.0, 2.0)
    assert (tally.exclusive.waited_s, tally.exclusive.held_s) == (0.0, 0.0)
    line = gpu_turns.summary()
    assert line.startswith(gpu_turns.TALLY_MARK) and "exclusive 1 held 0.0 s" in line
    assert "shared 1 held 2.0 s waited 5.0 s" in line


def test_a_probe_lets_a_waiting_measurement_in_between_its_steps(tmp_path, turns, clock):
    """This process holds a shared turn when another asks for an exclusive one: at the next step the probe
    hands its turn over, the measurement runs, and the probe goes on in a shared turn taken again; the wait
    is counted apart from the time held."""
    with gpu_turns.shared():
        gpu_turns.let_measurement_in()  # no measurement waits: nothing happens
        assert gpu_turns.tally().shared.let_in == 0
        clock.now += 1.0
        measurement = _take("exclusive", tmp_path / "measure", turns)
        _wait_for(lambda: _gate_closed(turns), "the measurement closing the gate")
        assert not (tmp_path / "measure.held").exists()  # it waits for this turn

        def measure() -> None:  # 8 s on the test's clock while the measurement holds the GPU
            _appeared(tmp_path / "measure.held")
            clock.now += 8.0
            _release(tmp_path / "measure")
        helper = _in_thread(measure)
        let_go = time.time()
        gpu_turns.let_measurement_in()
        back = time.time()
        helper.join(timeout=60)
    _wait_all([measurement])
    start, end = _span(tmp_path / "measure")
    assert let_go <= start and end <= back  # it ran while this probe paused, and the probe went on after it
    tally = gpu_turns.tally().shared
    assert (tally.let_in, tally.let_in_waited_s, tally.waited_s) == (1, 8.0, 8.0)
    assert tally.held_s == 1.0  # the second before, not the measurement's eight


def test_a_probe_in_an_exclusive_or_nested_turn_lets_nothing_in(tmp_path, turns):
    with gpu_turns.exclusive():
        other = _take("exclusive", tmp_path / "other", turns)
        _appeared(tmp_path / "other.asked")  # it waits for this turn
        gpu_turns.let_measurement_in()
        with gpu_turns.shared():
            gpu_turns.let_measurement_in()
    _appeared(tmp_path / "other.held")
    _release(tmp_path / "other")
    _wait_all([other])
    assert gpu_turns.tally().shared.let_in == 0 and gpu_turns.tally().shared.turns == 0


def test_a_run_that_does_not_share_its_gpu_counts_no_turns(monkeypatch):
    monkeypatch.delenv(gpu_turns.ENV, raising=False)
    monkeypatch.setattr(gpu_turns, "_tally", gpu_turns.Tally())
    with gpu_turns.exclusive(), gpu_turns.shared():
        pass
    assert gpu_turns.tally() == gpu_turns.Tally()


def test_the_fan_out_reads_a_jobs_turns_from_its_output_and_keeps_them_out_of_a_failure(tmp_path):
    tail = "rows...\nwrote x.json\nh3bench turns: exclusive 2 held 9.0 s waited 1.0 s; shared 5 held 3.0 s waited 0.5 s\n"
    assert fanout.turns_of(tail) == "exclusive 2 held 9.0 s waited 1.0 s; shared 5 held 3.0 s waited 0.5 s"
    assert fanout.turns_of("wrote x.json\n") == ""
    failed = LaunchResult(1, "RuntimeError: boom\n" + tail.splitlines()[-1] + "\n")
    assert failed.reason() == "exited with status 1: RuntimeError: boom"

    def launcher(job: Job, device: str) -> LaunchResult:
        job.out.write_text("{}")
        return LaunchResult(0, tail, 1.0)
    events = []
    run_jobs([Job("a/plain", ("true",), tmp_path / "a.json", 1.0)], ["0"], launcher=launcher,
             on_event=events.append)
    (finished,) = [e for e in events if e.kind == "finished"]
    assert finished.message == fanout.turns_of(tail)


# ---------------------------------------------------------------- the card's memory


def test_a_turn_hands_its_cached_gpu_memory_back_when_it_ends(tmp_path, monkeypatch):
    """At the end of the outer turn, and only where the run shares its GPU: the next run's probe may need it."""
    import torch

    emptied: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(gpu_turns._depth))
    monkeypatch.setenv(gpu_turns.ENV, str(tmp_path / "gpu-0.turns"))
    with gpu_turns.shared():
        with gpu_turns.exclusive():  # nested: the outer turn's
            pass
        assert emptied == []
    assert emptied == [0]
    with gpu_turns.exclusive():
        pass
    assert emptied == [0, 0]
    monkeypatch.delenv(gpu_turns.ENV)
    with gpu_turns.shared():
        pass
    assert emptied == [0, 0]


def _recording_turns(monkeypatch) -> list[str]:
    """gpu_turns' two turns, recorded as 'shared' / 'exclusive' in the order taken."""
    taken: list[str] = []

    def recorder(kind: str):
        @contextlib.contextmanager
        def turn():
            taken.append(kind)
            yield
        return turn

    monkeypatch.setattr(gpu_turns, "shared", recorder("shared"))
    monkeypatch.setattr(gpu_turns, "exclusive", recorder("exclusive"))
    return taken


def _failing_first(error: BaseException):
    calls: list[str] = []

    def step():
        calls.append("call")
        if len(calls) == 1:
            raise error
        return len(calls)
    return step, calls


def _out_of_memory_in(wrapper: type | None) -> BaseException:
    import torch

    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")
    if wrapper is None:
        return oom
    try:
        raise wrapper("the row's call failed") from oom
    except wrapper as exc:
        return exc


@pytest.mark.parametrize("wrapper", [None, RuntimeError], ids=["raised", "a row's failure caused by it"])
def test_a_step_that_runs_out_of_memory_beside_other_runs_runs_again_alone(tmp_path, monkeypatch, wrapper):
    taken = _recording_turns(monkeypatch)
    monkeypatch.setenv(gpu_turns.ENV, str(tmp_path / "gpu-0.turns"))
    step, calls = _failing_first(_out_of_memory_in(wrapper))
    assert gpu_turns.shared_else_alone(step) == 2
    assert taken == ["shared", "exclusive"] and len(calls) == 2


def test_a_result_that_says_out_of_memory_runs_again_alone(tmp_path, monkeypatch):
    taken = _recording_turns(monkeypatch)
    monkeypatch.setenv(gpu_turns.ENV, str(tmp_path / "gpu-0.turns"))
    results = iter(["OutOfMemoryError: CUDA out of memory", "loaded"])
    assert gpu_turns.shared_else_alone(lambda: next(results), ran_out=lambda r: r.startswith("OutOfMemory")) \
        == "loaded"
    assert taken == ["shared", "exclusive"]


def test_running_out_of_memory_stands_where_no_other_run_shares_the_gpu(monkeypatch):
    import torch

    taken = _recording_turns(monkeypatch)
    monkeypatch.delenv(gpu_turns.ENV, raising=False)
    step, calls = _failing_first(_out_of_memory_in(None))
    with pytest.raises(torch.OutOfMemoryError):
        gpu_turns.shared_else_alone(step)
    assert taken == ["shared"] and len(calls) == 1


def test_other_errors_and_a_second_shortage_are_not_retried(tmp_path, monkeypatch):
    import torch

    taken = _recording_turns(monkeypatch)
    monkeypatch.setenv(gpu_turns.ENV, str(tmp_path / "gpu-0.turns"))
    step, calls = _failing_first(ValueError("a bug"))
    with pytest.raises(ValueError):
        gpu_turns.shared_else_alone(step)
    assert taken == ["shared"] and len(calls) == 1

    def always_short():
        raise torch.OutOfMemoryError("CUDA out of memory")
    taken.clear()
    with pytest.raises(torch.OutOfMemoryError):  # alone, the shortage is the step's own
        gpu_turns.shared_else_alone(always_short)
    assert taken == ["shared", "exclusive"]


@pytest.mark.parametrize("where", ["load", "call"])
def test_a_row_that_ran_out_of_memory_beside_other_runs_is_measured_not_failed(tmp_path, monkeypatch, where):
    """The row's first load (or first call) runs out of memory: sharing the GPU, the row is measured and
    clean; alone on it, the shortage is the row's verdict."""
    import torch

    from h3bench.adapters import builtin_adapters
    from h3bench.harness import schema
    from h3bench.harness.adapter import Loaded
    from h3bench.harness.runner import RunRequest, run
    from tests.helpers import CPU, quick_config

    def short_once():
        shortage = ["CUDA out of memory. Tried to allocate 8.00 GiB"]

        def check():
            if shortage:
                raise torch.OutOfMemoryError(shortage.pop())
        return check

    def row_of(sharing: bool):
        if sharing:
            monkeypatch.setenv(gpu_turns.ENV, str(tmp_path / "gpu-0.turns"))
        else:
            monkeypatch.delenv(gpu_turns.ENV, raising=False)
        diffusers = next(a for a in builtin_adapters("timestep_sinusoid") if a.name == "diffusers")
        check = short_once()

        def load(device, params):
            if where == "load":
                check()
            loaded = diffusers.load(device, params)
            if where == "load":
                return loaded

            def fn(*args, **kwargs):
                check()
                return loaded.fn(*args, **kwargs)
            return Loaded(fn=fn, source=loaded.source)

        config = quick_config("timestep_sinusoid")
        evidence = run(RunRequest(config=config, device=CPU, adapters=[dataclasses.replace(diffusers, load=load)],
                                  modes=["plain"], out=None, measure_bandwidth=False, control_adapter=None))
        return evidence.results["plain"]["diffusers"]

    row = row_of(sharing=True)
    assert isinstance(row, schema.RowResult) and row.batch_invariance.batch_invariant
    row = row_of(sharing=False)
    assert isinstance(row, schema.UnavailableRow) and "OutOfMemoryError" in row.unavailable


def test_a_rows_wall_time_leaves_out_its_waits_for_turns(monkeypatch):
    """Each turn here starts after a 100 s wait on the runner's clock (another run measuring), and each step
    of a probe waits 100 s for its turn back after letting a measurement in: a measured row's wall_s and
    probe walls, and an unavailable row's wall_s, count none of it."""
    import types

    from h3bench.adapters import builtin_adapters
    from h3bench.harness import runner, schema
    from tests.helpers import CPU, quick_config

    clock = types.SimpleNamespace(now=0.0)

    def perf_counter() -> float:
        clock.now += 1e-6  # the work between two readings, next to nothing on this clock
        return clock.now

    def waiting():
        @contextlib.contextmanager
        def turn():
            clock.now += 100.0
            yield
        return turn

    let_in = types.SimpleNamespace(calls=0, waited=0.0)

    def let_measurement_in():  # every step of a probe waits 100 s for its turn back after a measurement
        let_in.calls += 1
        let_in.waited += 100.0
        clock.now += 100.0

    monkeypatch.setattr(runner, "time", types.SimpleNamespace(perf_counter=perf_counter))
    monkeypatch.setattr(gpu_turns, "shared", waiting())
    monkeypatch.setattr(gpu_turns, "exclusive", waiting())
    monkeypatch.setattr(gpu_turns, "let_measurement_in", let_measurement_in)
    monkeypatch.setattr(gpu_turns, "let_in_wait_s", lambda: let_in.waited)
    config = quick_config("timestep_sinusoid")
    diffusers = next(a for a in builtin_adapters("timestep_sinusoid") if a.name == "diffusers")

    def missing(_device, _params):
        raise ImportError("no such library")
    absent = dataclasses.replace(diffusers, name="absent", load=missing)
    evidence = runner.run(runner.RunRequest(config=config, device=CPU, adapters=[diffusers, absent],
                                            modes=["plain"], out=None, measure_bandwidth=False,
                                            control_adapter=None))
    row, unavailable = evidence.results["plain"]["diffusers"], evidence.results["plain"]["absent"]
    assert isinstance(row, schema.RowResult) and isinstance(unavailable, schema.UnavailableRow)
    assert row.wall_s < 1 and all(s < 1 for s in row.probe_wall_s.values()), (row.wall_s, row.probe_wall_s)
    assert unavailable.wall_s < 1
    assert let_in.calls > 10  # the probes' steps, each a chance for a measurement to go first
    assert evidence.wall_s > 100  # the file's own wall time has the waits


# ---------------------------------------------------------------- what a run holds


def test_a_run_measures_alone_and_probes_in_shared_turns(monkeypatch):
    """The latency rounds, the contention probe and the environment's bandwidths in exclusive turns; the
    row's load, the other probes and the control in shared ones."""
    from h3bench.adapters import builtin_adapters
    from h3bench.harness.probes import accuracy_latency, contention
    from h3bench.harness.runner import RunRequest, run
    from tests.helpers import CPU, quick_config

    held: list[str] = []
    seen: list[tuple[str, tuple[str, ...]]] = []

    def recorder(kind: str):
        @contextlib.contextmanager
        def turn():
            held.append(kind)
            try:
                yield
            finally:
                held.pop()
        return turn

    def noting(name: str, fn):
        def wrapped(*args, **kwargs):
            seen.append((name, tuple(held)))
            return fn(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(gpu_turns, "shared", recorder("shared"))
    monkeypatch.setattr(gpu_turns, "exclusive", recorder("exclusive"))
    monkeypatch.setattr(accuracy_latency, "time_rows", noting("latency", accuracy_latency.time_rows))
    for name, module in (("accuracy", accuracy_latency), ("contention", contention)):  # the probes' runs
        monkeypatch.setattr(module, "PROBE", dataclasses.replace(module.PROBE, run=noting(name, module.PROBE.run)))
    from h3bench.harness.probes import batch_invariance
    monkeypatch.setattr(batch_invariance, "all_rows", noting("all_rows", batch_invariance.all_rows))
    from h3bench.harness import environment
    monkeypatch.setattr(environment, "capture", noting("capture", environment.capture))

    config = quick_config("timestep_sinusoid")
    diffusers = next(a for a in builtin_adapters("timestep_sinusoid") if a.name == "diffusers")
    diffusers = dataclasses.replace(diffusers, load=noting("load", diffusers.load))
    run(RunRequest(config=config, device=CPU, adapters=[diffusers], modes=["plain"], out=None,
                   measure_bandwidth=False, control_adapter=diffusers))
    found = {name: turn for name, turn in seen if name != "all_rows"}
    assert found["latency"] == ("exclusive",)
    assert found["contention"] == ("exclusive",)
    assert found["accuracy"] == ("shared",)
    assert found["capture"] == ("exclusive",)  # the environment, with the bandwidths where measured
    loads = [held for name, held in seen if name == "load"]
    assert loads and all(held == ("shared",) for held in loads)  # the row's load first, then the control's
    assert [held for name, held in seen if name == "all_rows"] == [("shared",), ("shared",)]  # the row, the control

    seen.clear()  # a fan-out's control job: its environment alone, then the control's probes
    run(RunRequest(config=config, device=CPU, adapters=[], modes=["plain"], out=None, measure_bandwidth=False,
                   control_adapter=diffusers, control_only=True))
    assert seen[0] == ("capture", ("exclusive",)) and ("all_rows", ("shared",)) in seen


# ---------------------------------------------------------------- the fan-out


def test_per_device_runs_jobs_together_each_told_its_gpus_turn_files(tmp_path):
    lock = threading.Lock()
    running: dict[str, int] = {}
    peak: dict[str, int] = {}
    turns: dict[str, str] = {}
    # every job waits until all six run at once, three on each GPU (a hand-shake: the barrier breaks, and
    # the test fails, where they never run together); one job a GPU passes at once
    together = threading.Barrier(6, timeout=60)

    def launcher(job: Job, device: str) -> LaunchResult:
        with lock:
            running[device] = running.get(device, 0) + 1
            peak[device] = max(peak.get(device, 0), running[device])
            turns[job.key] = job.env.get(gpu_turns.ENV, "")
        if job.env.get(gpu_turns.ENV):
            together.wait()
        with lock:
            running[device] -= 1
        return LaunchResult(0, "", 0.0)

    jobs = [Job(f"op{i}/plain", ("true",), tmp_path / f"op{i}.json", 1.0) for i in range(6)]
    outcomes = run_jobs(jobs, ["0", "1"], launcher=launcher, per_device=3)
    assert all(o.ok for o in outcomes)
    assert peak == {"0": 3, "1": 3}
    by_device = {o.job.key: o.device for o in outcomes}
    for key, path in turns.items():
        assert Path(path).name == f"gpu-{by_device[key]}.turns"
    assert len({str(Path(p).parent) for p in turns.values()}) == 1  # one folder for the run's turn files

    turns.clear()
    run_jobs(jobs[:2], ["0"], launcher=launcher)
    assert turns == {"op0/plain": "", "op1/plain": ""}  # one job a GPU: nothing to take turns for
    with pytest.raises(ValueError, match="per_device must be >= 1"):
        run_jobs(jobs, ["0"], launcher=launcher, per_device=0)


def test_the_turns_module_and_the_fan_out_need_no_torch():
    code = ("import sys; import h3bench.harness.fanout, h3bench.harness.gpu_turns; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
    assert fanout.TURNS_ENV == gpu_turns.ENV


# ---------------------------------------------------------------- the command line


@pytest.mark.parametrize("args, message", [
    (("--per-gpu", "2"), "--per-gpu 2: needs --gpus"),
    (("--gpus", "1", "--per-gpu", "0"), "--per-gpu 0: must be at least 1"),
])
def test_per_gpu_is_checked_before_anything_runs(invoke, args, message):
    result, text = invoke("run", "--op", "timestep_sinusoid", "--quick", "--no-render", *args)
    assert result.exit_code == 2 and message in text and "Traceback" not in result.output


def test_a_suite_of_real_runs_sharing_one_device(tmp_path):
    """`run_suite` with the real launcher, two jobs at once on one slot (the CPU's here): the op's run and its
    control each take their turns in their own `h3bench run` process, and the parts merge as without turns."""
    from tests.test_suite import request

    from h3bench.harness import schema, suite

    out = tmp_path / "timestep_sinusoid.json"
    events = []
    (found,) = suite.run_suite([request("timestep_sinusoid", ["plain"], out)], [fanout.CPU], per_device=2,
                               on_event=events.append)
    row = found.results["plain"]["diffusers"]
    assert isinstance(row, schema.RowResult) and row.batch_invariance.batch_invariant
    assert found.control.flagged and out.is_file()
    # each job said what its turns were: the run measures its bandwidths and times its rows alone and
    # probes in shared turns; the control measures its bandwidths and probes in one shared turn
    counts = {e.key: re.fullmatch(r"exclusive (\d+) held [\d.]+ s waited [\d.]+ s; "
                                  r"shared (\d+) held [\d.]+ s waited [\d.]+ s, \d+ measurement\(s\) let in",
                                  e.message)
              for e in events if e.kind == "finished"}
    assert all(counts.values()), counts
    plain, control = counts["timestep_sinusoid/plain"], counts["timestep_sinusoid/control"]
    assert int(plain[1]) >= 2 and int(plain[2]) > 1
    assert (int(control[1]), int(control[2])) == (1, 1)
