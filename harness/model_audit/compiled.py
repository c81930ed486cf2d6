"""The compiled model's verdict as PyTorch's benchmark suite checks batch invariance: `torch.compile(model)`
on N rows, then on the first N/2, N/4, ..., 1 of them, each against the same rows of the N-row run
(forward, no gradients), beside the eager model at the same sizes. Where eager gives the same rows and the
compiled model does not, the variance is inside the compiled graph; the generated code's kernels are named
from the code Inductor wrote (torch._inductor.utils.run_and_get_code)."""
from __future__ import annotations

import re
import time
from typing import Optional

import torch

from h3bench.harness.execute import bitwise_equal, describe_exception
from h3bench.harness.model_audit.factory import Checkable
from h3bench.harness.model_schema import Compiled, CompiledBatch
from h3bench.harness.probes.difference import first_difference

MODES = {"default": "default", "max-autotune": "max-autotune-no-cudagraphs"}
KERNEL = re.compile(r"\b(triton_\w+|cpp_fused_\w+|extern_kernels\.\w+)")


def halvings(n: int) -> list[int]:
    sizes = [n]
    while sizes[-1] > 1:
        sizes.append(sizes[-1] // 2)
    return sizes


def _outputs(fn, inputs: dict, rows: int) -> tuple[torch.Tensor, ...]:
    with torch.no_grad():
        return fn(**{k: (v[:rows] if k in inputs["__per_row"] else v) for k, v in inputs.items() if k != "__per_row"})


def verdict(model: Checkable, mode: str, rows: int) -> Compiled:
    """The compiled model at `rows`, `rows // 2`, ..., 1 against `rows`."""
    drawn = {k: v.detach() for k, v in model.inputs.items()}
    given = {**drawn, "__per_row": set(model.per_row)}
    n = min(rows, drawn[model.per_row[0]].shape[0])
    started = time.perf_counter()
    try:
        from torch._inductor.utils import run_and_get_code

        compiled = torch.compile(model.call, mode=MODES[mode], dynamic=False)
        full, code = run_and_get_code(lambda: _outputs(compiled, given, n))
        kernels = sorted({m.group(1) for text in code for m in KERNEL.finditer(text)})
        eager_full = _outputs(model.call, given, n)
        batches = []
        for size in halvings(n)[1:]:
            part, eager_part = _outputs(compiled, given, size), _outputs(model.call, given, size)
            differ = not all(bitwise_equal(a[:size], b) for a, b in zip(full, part))
            eager_differ = not all(bitwise_equal(a[:size], b) for a, b in zip(eager_full, eager_part))
            batches.append(CompiledBatch(size, differ, eager_differ, _ulp(full, part, size) if differ else None))
    except Exception as exc:
        return Compiled(mode=mode, batches=[], unavailable=f"torch.compile: {describe_exception(exc)}",
                        compile_s=round(time.perf_counter() - started, 3))
    first = next((b.batch for b in batches if b.differ), None)
    inside = None
    if first is not None and not any(b.eager_differ for b in batches):
        inside = (f"eager gives the same rows at every size and the compiled model does not (first at {first} "
                  f"rows against {n}): the variance is inside the compiled graph")
    return Compiled(mode=mode, batches=[CompiledBatch(n, False, False)] + batches, first_differing=first,
                    inside_graph=inside, kernels=kernels or None, compile_s=round(time.perf_counter() - started, 3))


def _ulp(full, part, size: int) -> Optional[int]:
    worst = None
    for a, b in zip(full, part):
        d = first_difference([("out", a[:size], b)], seed=0, batch=size, positions=range(size), rows=range(size))
        if d is not None and (worst is None or d.max_ulp > worst or d.max_ulp < 0):
            worst = d.max_ulp
    return worst
