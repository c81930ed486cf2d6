"""What a localisation finds, as typed records: the places where the rows part (`Origin`) and the search
that found them (`Localisation`). Lists, not tuples, inside the records: they are written to and read from
the model evidence file with the schema's codec (harness/schema.py from_dict), as the op evidence is."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

# The two kinds of search: the batch against a sub-batch or a row alone, and the same batch run twice.
BATCH = "batch"
REPEAT = "repeat"
FORWARD, BACKWARD = "forward", "backward"
PHASES = (FORWARD, BACKWARD)


@dataclass(frozen=True)
class TensorShape:
    """A tensor an origin op received or returned, as the batch's run saw it."""

    shape: list[int]
    dtype: str


@dataclass(frozen=True)
class Origin:
    """A place where a row's results part between the two runs of a search: the innermost module whose
    per-row inputs are bitwise equal in both runs and whose per-row outputs are not (`module`, a dotted
    `named_modules()` path relative to the object checked, "" for that object itself; `module_type` its
    class) and inside it the dispatcher op with the same property (`op`; in backward the forward op whose
    gradient node ran the op that parted, which is `backward_op`, with the node's name in `node`); `op` is
    None where no op can be named, and `reason` says why (the op streams part, an op's tensors cannot be
    mapped to rows, the difference arises outside the dispatcher). `inputs`/`outputs`: the op's (or
    module's) tensors in the batch's run; `rows`: the check's rows (indices in the batch) that part here;
    `max_ulp`/`max_abs`: the largest distance among the op's outputs over those rows, in ULPs of the
    output's dtype (-1: a NaN on one side; None: not captured, `reason` says why). Repeats of the same op in
    the same kind of module in the same phase are one origin: `instances` lists each module path, `count`
    how many op calls parted there."""

    search: str
    phase: str
    module: str
    module_type: str
    op: Optional[str]
    inputs: list[TensorShape]
    outputs: list[TensorShape]
    rows: list[int]
    instances: list[str]
    count: int
    max_ulp: Optional[int] = None
    max_abs: Optional[float] = None
    backward_op: Optional[str] = None
    node: Optional[str] = None
    reason: Optional[str] = None

    def describe(self) -> str:
        """`forward aten::mm in model.layers.0.mlp.up_proj (Linear) [3 x 64] float32, rows 1, up to 2 ULP`."""
        where = f"{self.module or '(the checked object)'} ({self.module_type})"
        what = self.op if self.op is not None else f"no op named ({self.reason})"
        ran = f" (its backward ran {self.backward_op})" if self.backward_op and self.backward_op != self.op else ""
        shapes = ", ".join(f"[{' x '.join(map(str, t.shape))}] {t.dtype}" for t in self.outputs[:2])
        rows = ", ".join(map(str, self.rows[:8])) + (" ..." if len(self.rows) > 8 else "")
        ulp = ("" if self.max_ulp is None else ", a NaN on one side" if self.max_ulp < 0
               else f", up to {self.max_ulp} ULP")
        more = f" (and {self.count - 1} more like it: {len(self.instances)} module(s))" if self.count > 1 else ""
        search = "run to run" if self.search == REPEAT else "batch"
        return f"{self.phase} {what}{ran} in {where}, outputs {shapes}, rows {rows}{ulp}{more} [{search}]"


@dataclass(frozen=True)
class Localisation:
    """One origin search: the failing `check` whose case was run again (`seed`; `batch` rows, of which
    `compared_rows` were compared against a run of `other_rows` rows: the same rows alone or in a
    sub-batch for a `batch` search, the same batch again for a `repeat` search); whether that run showed
    a difference again (`reproduced`); the origins, earliest first; per phase the ops the batch's run made
    (`ops`), those whose outputs differed only because an input already did (`inherited_ops`), those whose
    tensors could not be mapped to rows (`unmapped_ops`) and whether the two op streams aligned
    (`streams`: "aligned", or where they part); the runs of the function the search made (`runs`: the
    case's two sides recorded, then the other side once more to capture the origins' outputs) and its
    seconds; `note`: what limited it (module backward hooks refused, a difference that did not repeat)."""

    search: str
    check: str
    seed: int
    batch: int
    compared_rows: list[int]
    other_rows: int
    reproduced: bool
    origins: list[Origin]
    ops: dict[str, int]
    inherited_ops: dict[str, int]
    unmapped_ops: dict[str, int]
    streams: dict[str, str]
    runs: int
    seconds: float
    note: Optional[str] = None
