"""The probes: each one's specification, found by the name PROBES holds for it, in the order a row runs them.

A probe is a module under harness/probes/ that defines its `ProbeSpec` (`PROBE`; batch_invariance.py holds
the RFC's three): the config table it reads, how it runs, its progress totals, which GPU turn it takes and its
role in the verdict; a probe beyond the RFC's also declares its record, stored under the row's
`batch_invariance.<name>`, and how the gate, `h3bench validate` and the reports read that record. Adding a
probe = that module plus one line in PROBES (docs/probes.md, "Adding a probe"). The config's tables, the
runner's steps, the schema's keys, validate, the gate and the reports all read `probes()`.

PROBES holds names, as adapters/__init__.py does: a probe's module imports torch, the config and the schema,
and the config and the schema read this registry, so a module is imported only when its specification is
asked for, never while another module is being imported.
"""
from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Optional

PROBES: tuple[str, ...] = (
    "h3bench.harness.probes.batch_invariance:ALL_ROWS",
    "h3bench.harness.probes.batch_invariance:FULL_VS_SUB_BATCHES",
    "h3bench.harness.probes.batch_invariance:BATCH_SIZE_SWEEP",
    "h3bench.harness.probes.contention:PROBE",
    "h3bench.harness.probes.graph_replay:PROBE",
    "h3bench.harness.probes.layout:PROBE",
    "h3bench.harness.probes.grad_set:PROBE",
    "h3bench.harness.probes.accuracy_latency:PROBE",
)


class Role(Enum):
    """What a probe's record is to the row's verdict."""

    RFC = "rfc"                # one of the RFC's three: their counts make `batch_invariant`, the RFC's verdict
    BEYOND_RFC = "beyond_rfc"  # h3bench's own: its record under batch_invariance.<name>, with its own flag
    ACCURACY = "accuracy"      # accuracy_latency: the row's errors and the sizes its latency is timed at


class Turn(Enum):
    """The probe's turn on a GPU shared with other runs (harness/gpu_turns.py)."""

    SHARED = "shared"        # beside the other runs' probes (bitwise comparisons do not mind them)
    EXCLUSIVE = "exclusive"  # the GPU alone: a probe that loads the GPU on purpose and compares with idle


# what a probe beyond the RFC's must declare: its record and how each reader reads it
BEYOND_RFC_NEEDS = ("record_type", "invariant", "failures", "problems", "words", "label", "note")


@dataclass(frozen=True)
class ProbeSpec:
    name: str          # the probe's key: progress, probe_wall_s, failed_probe, and its record's under batch_invariance
    plan_table: str    # the config table it reads; a config without it leaves a probe beyond the RFC's out
    plan_type: type    # the frozen record that table is built into (harness/config.py checks the keys and types)
    run: Callable[..., Any]    # (ProbeContext, plan) -> what the probe found
    total: Callable[..., int]  # (plan, ProbeContext) -> the probe's progress units for one row
    role: Role
    turn: Turn = Turn.SHARED
    # A probe beyond the RFC's: its record (a dataclass with an `invariant` flag) and how each reader reads it.
    record_type: Optional[type] = None
    invariant: Optional[Callable[[Any], Optional[bool]]] = None  # what the counts say; validate holds the flag to it
    failures: Optional[Callable[[Any, bool], list[str]]] = None  # (record, located) -> the gate's failure lines
    problems: Optional[Callable[[Any, str], list[str]]] = None   # (record, JSON path) -> counts outside their totals
    words: Optional[Callable[[Any], tuple[str, str]]] = None     # record -> the report's detail and short count
    label: str = ""    # its column in the reports and the verdict grid
    note: str = ""     # what it compares, for the reports' note under its column

    def __post_init__(self):
        if not isinstance(self.role, Role) or not isinstance(self.turn, Turn):
            raise TypeError(f"probe {self.name!r}: role must be a Role and turn a Turn")
        if self.role is Role.BEYOND_RFC:
            missing = [need for need in BEYOND_RFC_NEEDS if not getattr(self, need)]
            if missing:
                raise TypeError(f"probe {self.name!r} is beyond the RFC's and declares no {', '.join(missing)}")
            if not (dataclasses.is_dataclass(self.record_type)
                    and "invariant" in {f.name for f in dataclasses.fields(self.record_type)}):
                raise TypeError(f"probe {self.name!r}: its record_type must be a dataclass with an `invariant` field")


def probes() -> tuple[ProbeSpec, ...]:
    """Every probe's specification, in PROBES' order (the order a row runs them and its record lists them)."""
    found = tuple(_spec(entry) for entry in PROBES)
    for key in ("name", "plan_table"):
        values = [getattr(spec, key) for spec in found]
        twice = sorted({v for v in values if values.count(v) > 1})
        if twice:
            raise ValueError(f"probes with the same {key}: {', '.join(twice)}")
    return found


def _spec(entry: str) -> ProbeSpec:
    module, _, attr = entry.partition(":")
    spec = getattr(importlib.import_module(module), attr)
    if not isinstance(spec, ProbeSpec):
        raise TypeError(f"{entry} is a {type(spec).__name__}, not a ProbeSpec")
    return spec


def beyond_rfc() -> tuple[ProbeSpec, ...]:
    """h3bench's probes beyond the RFC's, each with its own record and flag."""
    return tuple(spec for spec in probes() if spec.role is Role.BEYOND_RFC)


def beyond_rfc_records() -> dict[str, type]:
    """The record type of each probe beyond the RFC's, by its key under a row's `batch_invariance`."""
    return {spec.name: spec.record_type for spec in beyond_rfc()}
