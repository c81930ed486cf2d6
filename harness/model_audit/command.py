"""`h3bench model SPEC`: from parsed options to an exit code (0; 1 with --require-invariant when a mode's
model or the compiled model is not batch-invariant; 2 on bad input, with one line and nothing written).
The Markdown renderer is handed in by the program's composition root (reports/), which harness/ does not
import."""
from __future__ import annotations

import datetime
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

from h3bench.harness import environment
from h3bench.harness.execute import describe_exception
from h3bench.harness.fanout import DEFAULT_JOB_TIMEOUT_S
from h3bench.harness.localize.records import TensorShape
from h3bench.harness.model_audit import compiled as compiled_verdict
from h3bench.harness.model_audit.audit import check
from h3bench.harness.model_audit.factory import BadModel, Checkable, build
from h3bench.harness.model_audit.modes import run_children
from h3bench.harness.model_schema import KIND, ModelEvidence, ModeResult
from h3bench.harness.modes import get_mode, parse_modes
from h3bench.harness.runner import resolve_device
from h3bench.harness.schema import UnavailableMode, to_dict, write_atomic

DTYPES = ("float32", "float64", "bfloat16", "float16")
PLANS = ("quick", "full")
# A mode's child may run as long as `h3bench run`'s (a model's full plan on a GPU takes minutes).
MODE_TIMEOUT_S = DEFAULT_JOB_TIMEOUT_S

Render = Callable[[Path], list[Path]]


class BadInput(ValueError):
    """An option that cannot be used: one line, exit 2."""


@dataclass(frozen=True)
class ModelOptions:
    spec: str
    device: str = "auto"
    plan: str = "quick"
    dtype: Optional[str] = None
    modes: list[str] = field(default_factory=lambda: ["plain"])
    compile: Optional[str] = None
    require_invariant: bool = False
    out: Optional[Path] = None
    force: bool = False
    mode_timeout_s: float = MODE_TIMEOUT_S


def parse_dtype(name: Optional[str]) -> Optional[torch.dtype]:
    if name is None:
        return None
    if name not in DTYPES:
        raise BadInput(f"--dtype {name}: expected one of {', '.join(DTYPES)}")
    return getattr(torch, name)


def default_out(spec: str, device: torch.device, plan: str) -> Path:
    stem = Path(spec.rpartition(":")[0]).stem or "model"
    attr = spec.rpartition(":")[2]
    when = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"model_{stem}_{attr}_{device.type}_{plan}_{when}.json"


def _checked(options: ModelOptions) -> tuple[torch.device, Optional[torch.dtype], list[str], Path]:
    if options.plan not in PLANS:
        raise BadInput(f"plan must be quick or full, got {options.plan!r}")
    if not options.mode_timeout_s > 0:
        raise BadInput(f"--mode-timeout {options.mode_timeout_s:g}: must be a positive number of seconds")
    if options.compile is not None and options.compile not in compiled_verdict.MODES:
        raise BadInput(f"--compile {options.compile}: expected {' or '.join(compiled_verdict.MODES)}")
    device, dtype = resolve_device(options.device), parse_dtype(options.dtype)
    modes = parse_modes(options.modes)
    out = options.out or default_out(options.spec, device, options.plan)
    if out.suffix != ".json":
        raise BadInput(f"--out {out}: name a .json file")
    if out.exists() and not options.force:
        raise BadInput(f"--out {out}: exists (--force overwrites it)")
    return device, dtype, modes, out


def measure(options: ModelOptions, device: torch.device, dtype, modes: list[str]) -> ModelEvidence:
    """Every mode's verdict and the compiled verdict; BadModel for a model that cannot be checked."""
    started = time.perf_counter()
    model: Checkable = build(options.spec, device, dtype)
    results: dict[str, ModeResult | UnavailableMode] = {}
    if "plain" in modes:
        results["plain"] = check(model, options.plan)
    others = [get_mode(m) for m in modes if m != "plain"]
    if others:
        results.update(run_children(options.spec, others, device, options.plan, options.dtype, options.mode_timeout_s))
    rows = model.inputs[model.per_row[0]].shape[0]
    compiled = compiled_verdict.verdict(model, options.compile, rows) if options.compile else None
    return ModelEvidence(
        kind=KIND, model=options.spec, model_type=model.model_type, device=str(device), plan=options.plan,
        per_row=model.per_row,
        inputs={k: TensorShape(list(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in model.inputs.items()},
        parameters=sum(1 for k in model.examples if k not in model.inputs), environment=_environment(device),
        modes={m: results[m] for m in modes}, dtype=options.dtype, compiled=compiled,
        created_utc=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        h3bench_commit=environment.h3bench_commit(), command=shlex.join(["h3bench", "model", *sys.argv[2:]]),
        wall_s=round(time.perf_counter() - started, 3))


def _environment(device: torch.device) -> dict:
    found = {"torch": torch.__version__, "python": sys.version.split()[0], "cuda": torch.version.cuda,
             "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None}
    for name in ("transformers", "diffusers"):
        found[name] = environment.library_version(name)
    return found


def failed(evidence: ModelEvidence) -> list[str]:
    """What --require-invariant fails on: each measured mode that is not invariant, the compiled model."""
    found = [f"{m}: not batch-invariant" for m, r in evidence.modes.items()
             if isinstance(r, ModeResult) and not r.invariant]
    c = evidence.compiled
    if c is not None and (c.unavailable or c.first_differing is not None):
        found.append(f"compiled ({c.mode}): " + (c.unavailable or f"differs at {c.first_differing} rows"))
    return found


def run(options: ModelOptions, render: Optional[Render] = None, say: Callable[[str], None] = print,
        warn: Callable[[str], None] = lambda s: print(s, file=sys.stderr)) -> int:
    try:
        device, dtype, modes, out = _checked(options)
        evidence = measure(options, device, dtype, modes)
    except (BadInput, BadModel, ValueError) as exc:
        warn(f"error: {exc}")
        return 2
    except Exception as exc:
        if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower():
            warn(f"error: {options.spec}: the model does not fit on {options.device} ({describe_exception(exc)})")
            return 2
        raise
    import json

    write_atomic(out, json.dumps(to_dict(evidence), indent=2, allow_nan=True) + "\n")
    written = [out, *(render(out) if render is not None else [])]
    for line in summary(evidence):
        say(line)
    say("\n".join(str(p) for p in written))
    failures = failed(evidence)
    if options.require_invariant and failures:
        warn("require-invariant: " + "; ".join(failures))
        return 1
    return 0


def summary(evidence: ModelEvidence) -> list[str]:
    lines = []
    for mode, result in evidence.modes.items():
        if isinstance(result, UnavailableMode):
            lines.append(f"{mode}: unavailable: {result.unavailable}")
            continue
        verdict = "batch-invariant" if result.invariant else "not batch-invariant"
        lines.append(f"{mode}: {verdict} ({evidence.plan} plan on {evidence.device}, {result.seconds:.1f} s)")
        lines += [f"  {f}" for f in result.failures]
        lines += [f"  origin: {o.describe()}" for o in result.origins]
        for s in result.localisations:
            lines.append(f"  search ({s.search}, {s.check}): {s.runs} runs, {s.seconds:.2f} s"
                         + (f"; {s.note}" if s.note else ""))
        lines += [f"  audit {a.origin_op or 'the module'} ({a.module_type}): {a.command}" for a in result.audits]
    c = evidence.compiled
    if c is not None:
        if c.unavailable:
            lines.append(f"compiled ({c.mode}): unavailable: {c.unavailable}")
        else:
            sizes = ", ".join(f"{b.batch}{'*' if b.differ else ''}" for b in c.batches)
            lines.append(f"compiled ({c.mode}): batches {sizes} (* differs from {c.batches[0].batch})"
                         + (f"; {c.inside_graph}" if c.inside_graph else ""))
    return lines
