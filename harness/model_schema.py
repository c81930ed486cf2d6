"""The model evidence file (`h3bench model`) as typed records, read and written with the op evidence's
codec (harness/schema.py to_dict/from_dict), and what `validate` checks in it beyond its keys
(docs/model_evidence.md describes every field)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Union

from h3bench.harness.localize.records import BACKWARD, BATCH, FORWARD, REPEAT, Localisation, Origin, TensorShape
from h3bench.harness.schema import SchemaError, UnavailableMode, additive, from_dict
from h3bench.harness.semantics import numbers

KIND = "h3bench_model"


@dataclass
class CheckCount:
    """One check of the assertion: `differ` of `compared` things of `unit` differed."""

    compared: int
    unit: str
    differ: int


@dataclass
class OpAudit:
    """The built-in op that audits an origin's op at the shape seen, and the command that runs it."""

    origin_op: str
    module_type: str
    builtin_op: str
    command: str


@dataclass
class ModeResult:
    """The model under one global mode: the assertion's verdict, counts and failures, the origins (earliest
    first) and the searches that found them, and the op audit of each origin op."""

    invariant: bool
    counts: dict[str, CheckCount]
    failures: list[str]
    origins: list[Origin]
    localisations: list[Localisation]
    audits: list[OpAudit]
    seconds: float
    unavailable: Optional[str] = additive()


@dataclass
class CompiledBatch:
    """The compiled model on the first `batch` rows against the same rows of the largest batch."""

    batch: int
    differ: bool
    eager_differ: bool
    max_ulp: Optional[int] = additive()


@dataclass
class Compiled:
    """`torch.compile(model, mode=...)` at N, N/2, ..., 1 rows against N, beside eager at the same sizes;
    `first_differing`: the largest batch whose rows differ from N's; `inside_graph`: said where eager is
    invariant there and the compiled model is not; `kernels`: the generated kernels' names found."""

    mode: str
    batches: list[CompiledBatch]
    first_differing: Optional[int] = additive()
    inside_graph: Optional[str] = additive()
    kernels: Optional[list[str]] = additive()
    compile_s: Optional[float] = additive()
    unavailable: Optional[str] = additive()


@dataclass
class ModelEvidence:
    kind: str
    model: str
    model_type: str
    device: str
    plan: str
    per_row: list[str]
    inputs: dict[str, TensorShape]
    parameters: int
    environment: dict[str, Any]
    modes: dict[str, Union[ModeResult, UnavailableMode]]
    dtype: Optional[str] = additive()
    compiled: Optional[Compiled] = additive()
    created_utc: Optional[str] = additive()
    h3bench_commit: Optional[str] = additive()
    command: Optional[str] = additive()
    wall_s: Optional[float] = additive()


def is_model_evidence(data: Any) -> bool:
    return isinstance(data, dict) and data.get("kind") == KIND


def from_json(data: Any) -> ModelEvidence:
    evidence = from_dict(ModelEvidence, data)
    if evidence.kind != KIND:
        raise SchemaError(f"$.kind: expected {KIND!r}, got {evidence.kind!r}")
    return evidence


def problems(evidence: ModelEvidence) -> list[str]:
    """Meaning beyond the keys: verdicts follow from their counts (`differ` sums the forward and each per-row
    gradient, so it may pass `compared`), origins of
    known phases and searches with rows among the batch, every number finite and non-negative (a ULP
    distance may be -1: a NaN on one side)."""
    found = []
    for mode, result in evidence.modes.items():
        if isinstance(result, UnavailableMode):
            continue
        path = f"$.modes.{mode}"
        for name, count in result.counts.items():
            if count.differ < 0 or count.compared < 0:
                found.append(f"{path}.counts.{name}: a negative count")
        clean = all(c.differ == 0 for c in result.counts.values()) and result.unavailable is None
        if result.invariant != clean:
            found.append(f"{path}.invariant: {result.invariant}, but the counts say {clean}")
        if result.invariant and (result.origins or result.failures):
            found.append(f"{path}: invariant, yet it names failures or origins")
        for i, origin in enumerate(result.origins):
            found += _origin_problems(origin, f"{path}.origins[{i}]")
        for i, search in enumerate(result.localisations):
            where = f"{path}.localisations[{i}]"
            found += [p for k, o in enumerate(search.origins) for p in _origin_problems(o, f"{where}.origins[{k}]")]
            if search.search not in (BATCH, REPEAT):
                found.append(f"{where}.search: {search.search!r} is not batch or repeat")
            if any(not 0 <= r < search.batch for r in search.compared_rows):
                found.append(f"{where}.compared_rows: a row outside the batch of {search.batch}")
    if evidence.compiled is not None:
        sizes = [b.batch for b in evidence.compiled.batches]
        if sizes != sorted(sizes, reverse=True) or any(s < 1 for s in sizes):
            found.append(f"$.compiled.batches: sizes {sizes} are not N, N/2, ..., 1")
    found += [f"{p}: {v!r} is not a finite non-negative number"
              for p, v in numbers(evidence, "$")
              if not math.isfinite(v) or (v < 0 and not (p.endswith(".max_ulp") and v == -1))]
    return found


def _origin_problems(origin: Origin, path: str) -> list[str]:
    found = []
    if origin.phase not in (FORWARD, BACKWARD):
        found.append(f"{path}.phase: {origin.phase!r} is not forward or backward")
    if origin.op is None and not origin.reason:
        found.append(f"{path}: names no op and gives no reason")
    if origin.count < 1 or not origin.instances:
        found.append(f"{path}: an origin with no instance")
    return found


def validate(data: Any) -> tuple[list[str], str]:
    """A model file's problems and, when it has none, what it is (for `h3bench validate`)."""
    try:
        evidence = from_json(data)
    except SchemaError as exc:
        return [str(exc)], ""
    modes = ", ".join(f"{m}: {'unavailable' if isinstance(r, UnavailableMode) else 'invariant' if r.invariant else 'not invariant'}"
                      for m, r in evidence.modes.items())
    return problems(evidence), f"model {evidence.model_type} on {evidence.device}, {modes}"
