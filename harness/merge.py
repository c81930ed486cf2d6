"""Combine rows of one op measured in separate runs (e.g. one library per job) into one evidence file.

Rows are only comparable when the runs share what the numbers depend on: the op, the GPU model, the
torch/CUDA build, TF32, the plan (quick or full), the rl_kernel commit and h3bench commit. Anything
else that differs is refused rather than guessed; fields that merely describe the run are combined.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Any, Optional

from h3bench.harness.schema import ControlResult, ControlSkipped, Environment, Evidence, UnavailableMode, to_dict


class MergeError(ValueError):
    """The two files cannot be one evidence file; the message says which field or row is in conflict."""


def _must_match(label: str, a: Any, b: Any) -> None:
    if a != b:
        raise MergeError(f"cannot merge: {label} differs ({a!r} vs {b!r})")


def _first(a: Any, b: Any) -> Any:
    return a if a is not None else b


def _same_unless_missing(label: str, a: Any, b: Any) -> Any:
    # An additive field absent from one file (an older h3bench) is no conflict; two values are.
    if a is not None and b is not None:
        _must_match(label, a, b)
    return _first(a, b)


def _libraries(a: dict[str, Optional[str]], b: dict[str, Optional[str]]) -> dict[str, Optional[str]]:
    out = dict(a)
    for name, version in b.items():
        if out.get(name) is not None and version is not None and out[name] != version:
            raise MergeError(f"cannot merge: library {name} differs ({out[name]!r} vs {version!r})")
        # None means "not installed in that run"; the run that had it is the one whose rows used it.
        out[name] = _first(out.get(name), version)
    return out


def _mode_environment(a: dict[str, dict[str, Any]], b: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = copy.deepcopy(a)
    for mode, env in b.items():
        if mode in out and out[mode] != env:
            raise MergeError(f"cannot merge: mode {mode!r} has a different mode_environment "
                             f"({out[mode]!r} vs {env!r})")
        out.setdefault(mode, copy.deepcopy(env))
    return out


# The read and write bandwidth records: like the copy bandwidth, each row's floors used its own run's.
MEASURED_RATES = ("read_bandwidth_gbps", "read_bandwidth_bytes", "read_bandwidth_kernel", "write_bandwidth_gbps",
                  "write_bandwidth_bytes", "write_bandwidth_kernel", "bandwidth_method")


def _environment(a: Environment, b: Environment) -> Environment:
    for label in ("gpu", "capability", "torch", "cuda", "tf32"):
        _must_match(f"environment.{label}", getattr(a, label), getattr(b, label))
    return dataclasses.replace(
        a,
        libraries=_libraries(a.libraries, b.libraries),
        megatron_source_commit=_same_unless_missing("environment.megatron_source_commit",
                                                    a.megatron_source_commit, b.megatron_source_commit),
        mode_environment=_mode_environment(a.mode_environment, b.mode_environment),
        device=_first(a.device, b.device),
        driver=_same_unless_missing("environment.driver", a.driver, b.driver),
        # Each row's floor_us/fraction was computed with its own run's bandwidth, so the rows stay
        # right; the header shows the first run's measurement.
        copy_bandwidth_gbps=_first(a.copy_bandwidth_gbps, b.copy_bandwidth_gbps),
        copy_bandwidth_bytes=_first(a.copy_bandwidth_bytes, b.copy_bandwidth_bytes),
        **{name: _first(getattr(a, name), getattr(b, name)) for name in MEASURED_RATES},
        # Floors made by different models are not one column's numbers.
        floor_model=_same_unless_missing("environment.floor_model", a.floor_model, b.floor_model),
        host=_join(a.host, b.host),
        # Latencies taken by different methods are not one table's numbers.
        timing=_same_unless_missing("environment.timing", a.timing, b.timing),
    )


def _join(a: Optional[str], b: Optional[str]) -> Optional[str]:
    """Descriptive fields (host, command): keep both distinct values."""
    values = [v for v in (a, b) if v]
    return ", ".join(dict.fromkeys(values)) or None


def _dirty(a: Optional[bool], b: Optional[bool]) -> Optional[bool]:
    # Dirty if either run was; unknown if either is unknown and none was dirty.
    if a or b:
        return True
    return None if a is None or b is None else False


def _first_difference(a: Any, b: Any, path: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in list(a) + [k for k in b if k not in a]:
            if a.get(key) != b.get(key):
                return _first_difference(a.get(key), b.get(key), f"{path}.{key}")
    return f"{path.lstrip('.') or 'row'}: {a!r} vs {b!r}"


def _results(a: Evidence, b: Evidence) -> dict:
    out = copy.deepcopy(a.results)
    for mode, rows in b.results.items():
        if isinstance(rows, UnavailableMode) or isinstance(out.get(mode), UnavailableMode):
            if mode in out and to_dict(out[mode]) != to_dict(rows):
                raise MergeError(f"cannot merge: mode {mode} is unavailable in one file and differs in the other")
            out[mode] = copy.deepcopy(rows)
            continue
        target = out.setdefault(mode, {})
        for name, row in rows.items():
            if name in target:
                left, right = to_dict(target[name]), to_dict(row)
                if left != right:
                    raise MergeError(f"cannot merge: row {mode}/{name} is in both files with different data "
                                     f"(first difference at {_first_difference(left, right)})")
                continue
            target[name] = copy.deepcopy(row)
    return out


def _config(a: Optional[dict], b: Optional[dict]) -> Optional[dict]:
    # Configs legitimately differ (each run selected other rows); keep both rather than pick one.
    if a == b or b is None:
        return a
    if a is None:
        return b
    return {"merged_from": [a, b]}


def _control(a: Optional[ControlResult | ControlSkipped],
             b: Optional[ControlResult | ControlSkipped]) -> Optional[ControlResult | ControlSkipped]:
    """The merged file's negative control: a mode's part has none (the run's parent or its control job
    measured it); of two runs' controls a blind one wins (the merged rows include that run's verdicts),
    then a measured one over a skipped one, then the first."""
    def rank(record) -> int:
        if isinstance(record, ControlResult):
            return 3 if not record.flagged else 2
        return 1 if isinstance(record, ControlSkipped) else 0

    return copy.deepcopy(a if rank(a) >= rank(b) else b)


def merge(a: Evidence, b: Evidence) -> Evidence:
    """One evidence file holding the rows of both; raises MergeError on any conflict."""
    for label in ("kind", "rfc", "op", "quick"):
        _must_match(label, getattr(a, label), getattr(b, label))
    _must_match("rl_kernel_commit", a.rl_kernel_commit, b.rl_kernel_commit)
    environment = _environment(a.environment, b.environment)
    results = _results(a, b)
    commands = [c for c in (a.command, b.command) if c]
    return dataclasses.replace(
        a,
        tracked_tree_dirty=_dirty(a.tracked_tree_dirty, b.tracked_tree_dirty),
        environment=environment,
        results=results,
        h3bench_commit=_same_unless_missing("h3bench_commit", a.h3bench_commit, b.h3bench_commit),
        created_utc=max((t for t in (a.created_utc, b.created_utc) if t), default=None),
        config=_config(a.config, b.config),
        command=" ; ".join(dict.fromkeys(commands)) or None,  # two runs, two command lines
        wall_s=None if a.wall_s is None and b.wall_s is None else (a.wall_s or 0.0) + (b.wall_s or 0.0),
        control=_control(a.control, b.control),
    )
