"""`h3bench validate`: evidence files (or norm_modulate sweep files) checked against the contract (keys,
nesting, types) and for meaning (harness/semantics.py); every file is checked and each problem named."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from rich.markup import escape

from h3bench.harness.commands.requests import resolve_ops
from h3bench.harness.console import make_console


def _described(evidence) -> str:
    """`norm_modulate, 6 rows, gpu NVIDIA H100 80GB HBM3`, or the device where the file has no GPU."""
    rows = sum(len(r) for r in evidence.measured_modes().values())
    env = evidence.environment
    where = f"gpu {env.gpu}" if env.gpu else f"device {env.device or 'not recorded'}"
    return f"{evidence.op}, {rows} row{'' if rows == 1 else 's'}, {where}"


def validate_files(files: Sequence[Path], ops: Sequence[str] = ()) -> int:
    """Print each file's verdict; 0 if every file is valid, 1 if one is not, 2 if one is missing or a folder
    (bad input). `ops`: user ops the files are of (--op), resolved first so that their names are known."""
    from h3bench.harness import model_schema, semantics
    from h3bench.harness.schema import FOLDER_NOT_FILE, SchemaError, from_json, read_json

    for text in ops:
        resolve_ops(text)
    err = make_console(stderr=True)
    bad, missing = 0, 0
    for file in files:
        if not file.exists() or file.is_dir():
            missing += 1
            what = "no such file" if not file.exists() else FOLDER_NOT_FILE
            err.print(f"[red]{escape(f'{file}: {what}')}[/]", highlight=False)
            continue
        try:
            data = read_json(file)
            if semantics.is_sweep(data):
                problems, what = semantics.sweep_problems(data), "norm_modulate sweep"
            elif model_schema.is_model_evidence(data):  # `h3bench model`'s file
                problems, what = model_schema.validate(data)
            else:
                evidence = from_json(data)
                problems, what = semantics.problems(evidence), _described(evidence)
        except (SchemaError, OSError) as exc:
            problems, what = [str(exc)], None
        if problems:
            bad += 1
            for problem in problems:
                err.print(f"[red]{escape(f'{file}: invalid: {problem}')}[/]", highlight=False)
        else:
            print(f"{file}: valid ({what})")
    return 2 if missing else 1 if bad else 0
