"""`h3bench model`'s options; the logic is harness/model_audit/command.py's, with the Markdown renderer
(reports/model_markdown.py) handed in."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from h3bench.cli.measure import DEVICE_METAVAR
from h3bench.harness.fanout import DEFAULT_JOB_TIMEOUT_S as MODE_TIMEOUT_S


def model(spec: str = typer.Argument(..., metavar="PATH.py:ATTR", help="PATH/FILE.py:ATTR or package.module:ATTR; ATTR(device) returns "
                                               "(model, examples, per_row)."),
          device: str = typer.Option("auto", "--device", metavar=DEVICE_METAVAR, help="Where the model runs."),
          full: bool = typer.Option(False, "--full/--quick", help="The full plan (the token ops' sizes) or the "
                                                                  "quick one."),
          dtype: Optional[str] = typer.Option(None, "--dtype", metavar="DTYPE", show_default="the model's own", help="Cast the model and its floating-point "
                                                                     "examples: float32, float64, bfloat16, float16."),
          mode: List[str] = typer.Option(["plain"], "--mode", metavar="NAME[,NAME]|all", help="NAME[,NAME] or all: each mode but plain in its "
                                                                    "own process."),
          compile: Optional[str] = typer.Option(None, "--compile", metavar="default|max-autotune", show_default="eager only", help="default or max-autotune: the compiled "
                                                                         "model at N, N/2, ..., 1 rows."),
          require_invariant: bool = typer.Option(False, "--require-invariant", metavar="", show_default=False,
                                                 help="Exit 1 when a mode's model or the compiled model is not "
                                                      "batch-invariant."),
          out: Optional[Path] = typer.Option(None, "--out", metavar="FILE", help="The evidence JSON (Markdown beside it).",
                                             show_default="runs/model_<file>_<attr>_<device>_<plan>_<time>.json"),
          force: bool = typer.Option(False, "--force", metavar="", show_default=False,
                                     help="Overwrite --out if it exists."),
          mode_timeout: float = typer.Option(MODE_TIMEOUT_S, "--mode-timeout", metavar="SECONDS",
                                             help="Seconds a mode's child process may run.")):
    """Where a model's batch invariance breaks: the verdict, the module and dispatcher op where each row's
    results part (forward and backward), per mode, and the built-in op that audits it; exit 1 with
    --require-invariant when not invariant, 2 on bad input."""
    from h3bench.harness.model_audit.command import ModelOptions, run
    from h3bench.reports.model_markdown import write_markdown

    raise typer.Exit(run(ModelOptions(spec=spec, device=device, plan="full" if full else "quick", dtype=dtype,
                                      modes=mode, compile=compile, require_invariant=require_invariant, out=out,
                                      force=force, mode_timeout_s=mode_timeout), render=write_markdown))
