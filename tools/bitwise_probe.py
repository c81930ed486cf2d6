"""What tools/probe_swap_ab.py and tools/probe_fwd1.py share: the four data sets a hardware-order claim is
checked on, the bitwise check of candidate launch configs against the default's, and their kernel times.

A probe gives `run(cfg, a, w, b)` -> a tuple of output tensors (None for one a launch does not make), a
default config and candidates; each candidate's outputs on the first T rows of `a` must equal, bitwise,
(a) the default's on those rows alone and (b) the default's first T rows of the whole BIG_T-row batch.
"""
from __future__ import annotations

import json

import torch

BIG_T = 2048


def data_sets(a: torch.Tensor, w: torch.Tensor, b: torch.Tensor, seed: int, spread: int, row_spread: int,
              tiny: float) -> dict:
    """{name: (a, w, b)}:
      model     the given operands
      spread    a and w with every element scaled by 2^U{-spread..spread} (a sum's addends far apart)
      rows      each row of a and of w scaled by 2^U{-row_spread..row_spread}, a's row 1 all zero, row 2 times `tiny`
      cancel    a's rows in +v / -v pairs along k (sums near zero: the last bits of a sum are its rounding)"""
    g = torch.Generator(device=a.device).manual_seed(seed)

    def pow2(shape, lo, hi):
        return torch.exp2(torch.randint(lo, hi + 1, shape, generator=g, device=a.device).float())

    out = {"model": (a, w, b), "spread": (a * pow2(a.shape, -spread, spread), w * pow2(w.shape, -spread, spread), b)}
    ar = a * pow2((a.shape[0], 1), -row_spread, row_spread)
    ar[1] = 0.0
    ar[2] = a[2] * tiny
    out["rows"] = (ar, w * pow2((w.shape[0], 1), -row_spread, row_spread), b)
    half = a[:, : a.shape[1] // 2]
    out["cancel"] = (torch.cat([half, -half * (1 + 2.0 ** -20)], dim=1).contiguous(), w, b)
    return out


def _equal(got: tuple, want: tuple) -> bool:
    return all(torch.equal(x, y) for x, y in zip(got, want) if x is not None)


def _rows(outputs: tuple, t: int) -> tuple:
    return tuple(None if o is None else o[:t] for o in outputs)


def check(sets: dict, run, default, cands: dict, rows: list[int]) -> list[dict]:
    """One record per (data set, T): each candidate's agreement with the default, alone and in the batch."""
    records = []
    for data, (a, w, b) in sets.items():
        big = run(default, a, w, b)
        for t in rows:
            at = a[:t].clone()
            alone = run(default, at, w, b)
            rec = {"data": data, "rows": t, "default_alone_equals_big": _equal(alone, _rows(big, t))}
            for name, cfg in cands.items():
                try:
                    got = run(cfg, at, w, b)
                    rec[name] = {"equal_default": _equal(got, alone), "equal_big": _equal(got, _rows(big, t)),
                                 "differing": int((got[0] != alone[0]).sum().item()),
                                 "nonfinite": int((~torch.isfinite(got[0])).sum().item())}
                except Exception as exc:   # a candidate that fails to compile is a record, not the end of the run
                    rec[name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            records.append(rec)
            print(json.dumps(rec), flush=True)
    return records


def all_equal(records: list[dict]) -> bool:
    return all(v.get("equal_default") and v.get("equal_big") for r in records for v in r.values()
               if isinstance(v, dict) and "error" not in v)


def kernel_us(fn, reps: int = 50) -> float:
    from tools.kernel_times import summed_kernel_us
    return summed_kernel_us(fn, reps, warmup=5)


def times(model: tuple, run, default, cands: dict, rows: list[int], reps: int) -> list[dict]:
    """Kernel us per call of the default and each candidate on the model data set's first T rows."""
    a, w, b = model
    out = []
    for t in rows:
        at = a[:t].clone()
        rec = {"rows": t, "default": kernel_us(lambda: run(default, at, w, b), reps)}
        for name, cfg in cands.items():
            try:
                rec[name] = kernel_us(lambda: run(cfg, at, w, b), reps)
            except Exception as exc:
                rec[name] = f"{type(exc).__name__}: {str(exc)[:200]}"
        out.append(rec)
        print("kernel us", json.dumps(rec), flush=True)
    return out


def main(argv, description: str, candidates: dict, default, data_sets, run, time_run=None, diagnose=None) -> dict:
    """A probe's command line: `default()` the default config, `data_sets(device)` the sets, `run` the
    checked launch, `time_run` the timed one (default `run`), `diagnose(model, rows, reps)` extra timings
    behind --diagnose. Writes the result (--json) and returns it."""
    import argparse
    import sys
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--rows", default="1,2,3,4,8,13,16")
    ap.add_argument("--configs", default=",".join(candidates))
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--json", default="")
    if diagnose is not None:
        ap.add_argument("--diagnose", action="store_true", help="also time the diagnostics (other orders: timing only)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("this probe needs a GPU (the claim it checks is the hardware's)")
    base = default()
    cands = {name: candidates[name] for name in args.configs.split(",") if name}
    rows = [int(r) for r in args.rows.split(",")]
    sets = data_sets(torch.device("cuda"))
    records = check(sets, run, base, cands, rows)
    result = {"device": torch.cuda.get_device_name(), "default": base.short(),
              "configs": {k: v.short() for k, v in cands.items()}, "bitwise": records,
              "kernel_us": times(sets["model"], time_run or run, base, cands, rows, args.reps),
              "every_candidate_bitwise_equal": all_equal(records)}
    if diagnose is not None:
        result["diagnostics"] = diagnose(sets["model"], rows, args.reps) if args.diagnose else None
    print("every candidate bitwise equal to the default (alone and as rows of T = 2048):",
          result["every_candidate_bitwise_equal"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result
