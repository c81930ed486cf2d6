"""A mode's child process of `h3bench model`: `python -m h3bench.harness.model_audit SPEC --mode NAME
--device D --plan P --out PART [--dtype T]` writes that mode's part file (a ModeResult, or the mode's
reason for being unavailable); a bad model is one line on stderr and exit 2."""
from __future__ import annotations

import argparse
import sys

import torch

from h3bench.harness.model_audit.command import parse_dtype
from h3bench.harness.model_audit.factory import BadModel
from h3bench.harness.model_audit.one_mode import measure
from h3bench.harness.schema import to_dict, write_atomic


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m h3bench.harness.model_audit")
    parser.add_argument("spec")
    parser.add_argument("--mode", required=True)
    parser.add_argument("--device", required=True)
    parser.add_argument("--plan", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--dtype")
    args = parser.parse_args(argv)
    try:
        result = measure(args.spec, args.mode, torch.device(args.device), args.plan, parse_dtype(args.dtype))
    except BadModel as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import json

    write_atomic(args.out, json.dumps(to_dict(result), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
