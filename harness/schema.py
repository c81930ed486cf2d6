"""The evidence file as typed records, and the one codec between them and JSON.

The key names and nesting are the contract set by the RFC's prior-art file
(`tests/data/norm_modulate_b200.json`; docs/probes.md, "The contract"): never rename a field here. Fields marked `additive()` are h3bench's own
additions: optional when reading (the prior art lacks them) and left out of the JSON when None.
Everything that reads an evidence file (validate, report, compare, merge) goes through `from_json`,
so a file that parses is a file that validates.

A probe beyond the RFC's keeps its record type in its own module (harness/probes/); `BatchInvariance` holds
those records by the probe's name, and the codec reads each key with the type the probe's specification
declares (harness/probes/registry.py).
"""
from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Union

from h3bench.harness.probes import registry

KIND = "h3_prior_art"


def additive(default: Any = None, **kwargs):
    """A key h3bench adds to the contract: optional on read, omitted from JSON when None."""
    return field(default=default, metadata={"additive": True}, **kwargs)


def inlined(types: Callable[[], dict[str, type]]):
    """A dict of records that the JSON holds beside the object's own keys, each under its key, in the dict's
    order; each is optional on read, as its type in `types()` (a key `types()` does not name is not read)."""
    return field(default_factory=dict, metadata={"inlined": types})


# --- batch invariance -------------------------------------------------------------------------------

@dataclass
class Difference:
    """Where two results of the same row first differ and how far (h3bench's own, beside the counts): the
    tensor (an output's name, or `grad NAME`), the batch it rode in (its size, the row's position in it;
    `seed`: the plan's input seed), the row and the element within the row (flat index) of the first
    differing element, the largest absolute difference and the largest distance in units in the last
    place of the tensor's own dtype over the compared rows (-1: a NaN on one side only)."""

    tensor: str
    seed: int
    batch: int
    position: int
    row: int
    element: int
    max_abs: float
    max_ulp: int


@dataclass
class ParamDifference:
    """A parameter gradient that did not repeat bitwise: how many elements differ, and how far."""

    param: str
    elements: int
    numel: int
    max_abs: float
    max_ulp: int


@dataclass
class AllRowsCase:
    rows: int
    fwd_differ: int
    rowgrad_differ: int
    first_difference: Optional[Difference] = additive()


@dataclass
class FullVsSubBatches:
    full_batch: int
    sub_batch_sizes: list[int]
    sub_batches: int
    fwd_differ: int
    rowgrad_differ: int
    first_difference: Optional[Difference] = additive()


@dataclass
class SweepFailure:
    seed: int
    batch: int
    position: int
    row: int
    difference: Optional[Difference] = additive()


@dataclass
class BatchSizeSweep:
    batch_sizes: list[int]
    probe_rows: list[int]
    comparisons: int
    differ: int
    first_failures: list[SweepFailure]


@dataclass
class BatchInvariance:
    all_rows: dict[str, AllRowsCase]
    params_repeatable: Optional[bool]
    full_vs_sub_batches: FullVsSubBatches
    batch_size_sweep: BatchSizeSweep
    batch_invariant: bool
    params_differences: Optional[list[ParamDifference]] = additive()
    # h3bench's probes beyond the RFC's (harness/probes/registry.py): each one's record under its own key beside
    # the RFC's, with its own flag; `batch_invariant` stays the RFC's verdict
    beyond_rfc: dict[str, Any] = inlined(registry.beyond_rfc_records)


# --- accuracy and latency ---------------------------------------------------------------------------

@dataclass
class Spread:
    """Percentiles of one latency figure's samples (microseconds) and how many there were."""

    p10: float
    p50: float
    p90: float
    n: int


# The latency figures, each timed two ways (harness/timing.py): `<figure>_us` per-sample synchronized
# as the prior art, `<figure>_stream_us` back to back. fwd_bwd is the prior art's forward+backward
# (fresh leaves made inside the timed step); fwd_bwd_net leaves them out.
FIGURES = ("fwd", "fwd_bwd", "fwd_bwd_net")
STREAM_SUFFIX = "_stream"
# `<figure>_graph_us`: the same step captured once in a CUDA graph and replayed, per-sample synchronized
GRAPH_SUFFIX = "_graph"


def latency_key(figure: str, stream: bool, graph: bool = False) -> str:
    return f"{figure}{STREAM_SUFFIX if stream else ''}{GRAPH_SUFFIX if graph else ''}_us"


def peak_key(figure: str) -> str:
    return f"{figure}_peak_bytes"


@dataclass
class FloorLowered:
    """A floor's read/write model (harness/floors.py) beaten by a measured row at one size: the row, the
    latency key it beat the model with (e.g. `fwd_stream_us`), that median, which became the floor, and
    the model's time over it (above 1: how far the model overstated the floor)."""

    row: str
    key: str
    measured_us: float
    model_fraction: float


@dataclass
class SizeResult:
    """One row count of `accuracy_latency`. Backward keys exist only for rows with a backward."""

    fwd_rel_err: float
    fwd_us: float
    grad_rel_err: Optional[dict[str, float]] = additive()
    fwd_bwd_us: Optional[float] = additive()
    # h3bench additions: setup-free forward+backward, a second timing of each, and the floor fractions
    fwd_bwd_net_us: Optional[float] = additive()
    fwd_us_repeat: Optional[float] = additive()
    fwd_bwd_us_repeat: Optional[float] = additive()
    fwd_bwd_net_us_repeat: Optional[float] = additive()
    fwd_floor_us: Optional[float] = additive()
    fwd_bwd_floor_us: Optional[float] = additive()
    fwd_floor_fraction: Optional[float] = additive()
    fwd_bwd_floor_fraction: Optional[float] = additive()
    fwd_bwd_net_floor_fraction: Optional[float] = additive()
    # back-to-back timings (the GPU time when the host keeps ahead) and their floor fractions
    fwd_stream_us: Optional[float] = additive()
    fwd_bwd_stream_us: Optional[float] = additive()
    fwd_bwd_net_stream_us: Optional[float] = additive()
    fwd_stream_us_repeat: Optional[float] = additive()
    fwd_bwd_stream_us_repeat: Optional[float] = additive()
    fwd_bwd_net_stream_us_repeat: Optional[float] = additive()
    fwd_stream_floor_fraction: Optional[float] = additive()
    fwd_bwd_stream_floor_fraction: Optional[float] = additive()
    fwd_bwd_net_stream_floor_fraction: Optional[float] = additive()
    # per latency key (e.g. "fwd_us", "fwd_us_repeat", "fwd_stream_us"): the spread of its samples
    spread: Optional[dict[str, Spread]] = additive()
    # CUDA-graph replays of the figures' steps (harness/timing.py), and per figure why one was not taken
    fwd_graph_us: Optional[float] = additive()
    fwd_bwd_graph_us: Optional[float] = additive()
    fwd_bwd_net_graph_us: Optional[float] = additive()
    fwd_graph_us_repeat: Optional[float] = additive()
    fwd_bwd_graph_us_repeat: Optional[float] = additive()
    fwd_bwd_net_graph_us_repeat: Optional[float] = additive()
    graph_unavailable: Optional[dict[str, str]] = additive()
    # bytes one step allocated at its peak beyond what was allocated before it (harness/peak_memory.py)
    fwd_peak_bytes: Optional[int] = additive()
    fwd_bwd_peak_bytes: Optional[int] = additive()
    fwd_bwd_net_peak_bytes: Optional[int] = additive()
    # the floors' read/write model before any measured row lowered them, and the row that did
    fwd_floor_model_us: Optional[float] = additive()
    fwd_bwd_floor_model_us: Optional[float] = additive()
    fwd_floor_lowered: Optional[FloorLowered] = additive()
    fwd_bwd_floor_lowered: Optional[FloorLowered] = additive()


@dataclass
class RowResult:
    source: str
    has_backward: bool
    batch_invariance: BatchInvariance
    accuracy_latency: dict[str, SizeResult]
    wall_s: Optional[float] = additive()
    probe_wall_s: Optional[dict[str, float]] = additive()
    timer: Optional[str] = additive()
    # rows that compile on their calls (torch.compile): seconds spent in Dynamo/AOTAutograd/Inductor
    # compilations over the row's probes and timing (the first compile, each recompile for a new shape
    # class or grad mode, the lazily compiled backward; not a kernel's runtime autotuning at first
    # launch), and how many compilations that was
    compile_s: Optional[float] = additive()
    compiles: Optional[int] = additive()
    # the float64 reference variant the row's errors are against where it is not the op's own (norm_modulate's
    # torch_rms_norm, transformer_engine and quack_rms_norm rows: `rms_norm`, the norm alone, no modulation);
    # absent: the op's. Errors against different references do not compare.
    reference: Optional[str] = additive()


@dataclass
class UnavailableRow:
    unavailable: str
    source: Optional[str] = additive()
    failed_probe: Optional[str] = additive()
    wall_s: Optional[float] = additive()
    compile_s: Optional[float] = additive()  # as RowResult.compile_s, up to where the row stopped

    @property
    def skipped(self) -> bool:
        """Left out by choice (a row a CPU runs only when named), not failed: `is_skip`."""
        return is_skip(self.unavailable)


Row = Union[RowResult, UnavailableRow]

# How a deliberately skipped row's reason starts (harness/adapter.py RowSkipped), in `list` and in the file.
SKIPPED = "skipped on CPU: "


def is_skip(reason: str) -> bool:
    """Whether an unavailable row's reason is a deliberate skip, not an error."""
    return reason.startswith(SKIPPED)


@dataclass
class UnavailableMode:
    """A global mode that could not run at all (its switch does not import, its child process crashed
    or hung): `results.<mode>` is then this record instead of rows (docs/operators.md, Modes)."""

    unavailable: str


ModeResults = Union[UnavailableMode, dict[str, Row]]


# --- the negative control ----------------------------------------------------------------------------

@dataclass
class ControlResult:
    """The run's negative control (harness/control.py): the op's composition row with a planted
    batch-size fault, through the batch-invariance probes of the run's plan in the plain mode. `row_grads`:
    the per-row gradients compared; `flagged`: every check saw the fault (a non-zero count in the forward
    and, where there are row gradients, the row gradients of all_rows and of the sub-batches, and in the
    sweep); false means the plan is blind on that machine."""

    source: str
    row_grads: list[str]
    batch_invariance: BatchInvariance
    flagged: bool
    wall_s: Optional[float] = additive()


@dataclass
class ControlSkipped:
    """No control in the file, and why: `--no-control`, or the control could not run."""

    skipped: str


# --- environment ------------------------------------------------------------------------------------

@dataclass
class TimingRecord:
    """How the latencies of a file were taken (harness/timing.py); compare refuses to judge latencies
    taken by different methods."""

    sample: str          # the method behind the prior-art keys (fwd_us, ...): "synchronized"
    stream: str          # the method behind the *_stream_us keys: "back-to-back"
    timer: str           # "cuda_events" | "wall_clock"
    warmup: int
    reps: int
    repeats: int
    block: int
    interleaved: str     # how rows share the timing rounds
    graph: Optional[str] = additive()             # how the *_graph_us keys were taken, or why none were
    flush_l2: Optional[bool] = additive()         # a cache flush before each sample (absent: none)
    flush_bytes: Optional[int] = additive()       # the flushed buffer's size
    flush_applies_to: Optional[str] = additive()  # which figures' samples the flush precedes


@dataclass
class Environment:
    gpu: Optional[str]
    capability: Optional[list[int]]
    torch: str
    cuda: Optional[str]
    python: str
    tf32: bool
    libraries: dict[str, Optional[str]]
    megatron_source_commit: Optional[str]
    mode_environment: dict[str, dict[str, Any]]
    device: Optional[str] = additive()
    copy_bandwidth_gbps: Optional[float] = additive()
    copy_bandwidth_bytes: Optional[int] = additive()
    # read and write bandwidth measured apart (harness/bandwidth.py): the fastest kernel's rate, its bytes,
    # its name, and how every kernel was sampled; `floor_model`: how the floors were made from them
    read_bandwidth_gbps: Optional[float] = additive()
    read_bandwidth_bytes: Optional[int] = additive()
    read_bandwidth_kernel: Optional[str] = additive()
    write_bandwidth_gbps: Optional[float] = additive()
    write_bandwidth_bytes: Optional[int] = additive()
    write_bandwidth_kernel: Optional[str] = additive()
    bandwidth_method: Optional[str] = additive()
    floor_model: Optional[str] = additive()
    driver: Optional[str] = additive()
    host: Optional[str] = additive()
    timing: Optional[TimingRecord] = additive()


@dataclass
class Evidence:
    kind: str
    rfc: str
    op: str
    rl_kernel_commit: Optional[str]
    tracked_tree_dirty: Optional[bool]
    environment: Environment
    quick: bool
    results: dict[str, ModeResults]
    h3bench_commit: Optional[str] = additive()
    created_utc: Optional[str] = additive()
    config: Optional[dict[str, Any]] = additive()
    command: Optional[str] = additive()
    wall_s: Optional[float] = additive()
    control: Optional[Union[ControlResult, ControlSkipped]] = additive()

    def rows(self, mode: str) -> dict[str, Row]:
        """The rows of `mode`; none when the mode is absent or was unavailable as a whole."""
        found = self.results.get(mode, {})
        return {} if isinstance(found, UnavailableMode) else found

    def measured_modes(self) -> dict[str, dict[str, Row]]:
        return {mode: rows for mode, rows in self.results.items() if not isinstance(rows, UnavailableMode)}


# --- reading helpers ------------------------------------------------------------------------------------

def size_key(size: str) -> tuple[int, Union[int, str]]:
    """Sizes are row counts kept as JSON strings; order them numerically, odd keys last."""
    return (0, int(size)) if size.isdigit() else (1, size)


def sizes_of(evidence: Evidence, mode: Optional[str] = None) -> list[str]:
    """Every row count any measured row of `mode` (all modes when None) has, ascending."""
    found: set[str] = set()
    for m, rows in evidence.measured_modes().items():
        if mode is None or m == mode:
            for row in rows.values():
                if isinstance(row, RowResult):
                    found.update(row.accuracy_latency)
    return sorted(found, key=size_key)


# --- codec ------------------------------------------------------------------------------------------

class SchemaError(ValueError):
    """The file does not follow the contract; the message names the JSON path."""


def to_dict(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        out = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if "inlined" in f.metadata:
                out.update((key, to_dict(record)) for key, record in value.items() if record is not None)
            elif value is not None or not f.metadata.get("additive"):
                out[f.name] = to_dict(value)
        return out
    if isinstance(obj, dict):
        return {str(k): to_dict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    return obj


def from_dict(cls: Any, data: Any, path: str = "$") -> Any:
    """Build `cls` from parsed JSON, strictly: missing or mistyped contract keys raise SchemaError."""
    origin = typing.get_origin(cls)
    args = typing.get_args(cls)
    if origin in (Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        candidates = [a for a in args if a is not type(None)]
        errors = []
        for candidate in candidates:
            try:
                return from_dict(candidate, data, path)
            except SchemaError as exc:
                errors.append(str(exc))
        raise SchemaError(errors[0] if len(errors) == 1 else f"{path}: matches no form: " + " | ".join(errors))
    if dataclasses.is_dataclass(cls):
        if not isinstance(data, dict):
            raise SchemaError(f"{path}: expected an object for {cls.__name__}, got {type(data).__name__}")
        hints = typing.get_type_hints(cls)
        kwargs = {}
        for f in dataclasses.fields(cls):
            if "inlined" in f.metadata:
                kwargs[f.name] = _inlined(cls, f.metadata["inlined"](), data, path)
            elif f.name in data:
                kwargs[f.name] = from_dict(hints[f.name], data[f.name], f"{path}.{f.name}")
            elif not f.metadata.get("additive"):
                raise SchemaError(f"{path}: missing key {f.name!r}")
        return cls(**kwargs)
    if origin is dict:
        if not isinstance(data, dict):
            raise SchemaError(f"{path}: expected an object, got {type(data).__name__}")
        _, value_type = args
        return {k: from_dict(value_type, v, f"{path}.{k}") for k, v in data.items()}
    if origin is list:
        if not isinstance(data, list):
            raise SchemaError(f"{path}: expected a list, got {type(data).__name__}")
        (item_type,) = args
        return [from_dict(item_type, v, f"{path}[{i}]") for i, v in enumerate(data)]
    if cls is Any:
        return data
    if cls is float:
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            raise SchemaError(f"{path}: expected a number, got {data!r}")
        return float(data)
    if cls is int:
        if isinstance(data, bool) or not isinstance(data, int):
            raise SchemaError(f"{path}: expected an integer, got {data!r}")
        return data
    if cls in (bool, str):
        if not isinstance(data, cls):
            raise SchemaError(f"{path}: expected {cls.__name__}, got {data!r}")
        return data
    raise TypeError(f"schema has an unsupported type {cls!r} at {path}")


def _inlined(cls: Any, types: dict[str, type], data: dict, path: str) -> dict[str, Any]:
    """The records of an inlined field: each key of `types` that `data` holds, read as its type."""
    taken = sorted(set(types) & {f.name for f in dataclasses.fields(cls)})
    if taken:
        raise TypeError(f"{cls.__name__}: inlined keys {taken} are its own fields' names")
    return {key: from_dict(kind, data[key], f"{path}.{key}") for key, kind in types.items() if key in data}


def from_json(data: Any) -> Evidence:
    evidence = from_dict(Evidence, data)
    if evidence.kind != KIND:
        raise SchemaError(f"$.kind: expected {KIND!r}, got {evidence.kind!r}")
    for mode, rows in evidence.results.items():
        if mode not in evidence.environment.mode_environment:
            raise SchemaError(f"$.results.{mode}: mode missing from environment.mode_environment")
        if isinstance(rows, UnavailableMode):
            continue
        for name, row in rows.items():
            if isinstance(row, RowResult):
                _check_row(row, f"$.results.{mode}.{name}")
    return evidence


def _check_row(row: RowResult, path: str) -> None:
    # The backward keys are present exactly when the row has a backward: sglang's rows have neither.
    for size, result in row.accuracy_latency.items():
        for key in ("grad_rel_err", "fwd_bwd_us"):
            present = getattr(result, key) is not None
            if present != row.has_backward:
                state = "present" if present else "missing"
                raise SchemaError(f"{path}.accuracy_latency.{size}.{key}: {state} but has_backward is "
                                  f"{row.has_backward}")


FOLDER_NOT_FILE = "a folder, not an evidence file: name a JSON file in it"


def read_json(path: Union[str, Path]) -> Any:
    """The parsed JSON of a file: IsADirectoryError (FOLDER_NOT_FILE) for a folder, SchemaError for a file
    that is not text or not JSON (the message does not repeat the path), FileNotFoundError as it comes."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(FOLDER_NOT_FILE)
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise SchemaError("not a text file") from None
    except json.JSONDecodeError as exc:
        raise SchemaError(f"not JSON ({exc})") from exc


def load(path: Union[str, Path]) -> Evidence:
    try:
        data = read_json(path)
    except SchemaError as exc:
        raise SchemaError(f"{path}: {exc}") from exc
    return from_json(data)


def dumps(evidence: Evidence) -> str:
    return json.dumps(to_dict(evidence), indent=2, allow_nan=True) + "\n"


def write_atomic(path: Union[str, Path], text: str) -> Path:
    """Write via a temporary file in the same folder and rename: a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, 0o644)  # mkstemp makes it owner-only; evidence is for everyone to read
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def save(evidence: Evidence, path: Union[str, Path]) -> Path:
    return write_atomic(path, dumps(evidence))
