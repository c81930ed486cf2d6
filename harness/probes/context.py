"""What every probe receives: the op, its parameters, one loaded implementation, the device."""
from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Optional

import torch

from h3bench.harness import execute as execute_module
from h3bench.harness.execute import Outcome, execute
from h3bench.harness.ops.base import Op, OpInputs, Reference

Progress = Callable[[int], None]  # advance by n units of the probe's declared total


def _no_progress(_n: int) -> None:
    pass


@dataclass
class ProbeContext:
    op: Op
    params: Any
    fn: Callable
    grads: tuple[str, ...]
    device: torch.device
    reference_variant: str
    progress: Progress = field(default=_no_progress)
    # A global mode with no float64 path is switched off around the reference (harness/modes).
    reference_guard: Callable[[], ContextManager] = field(default=contextlib.nullcontext)
    # Whether each run waits for its kernels inside the implementation's block (harness/execute.py
    # `settle`). The bitwise probes run thousands of one-row calls and read their flags back once a case:
    # a wait after each forward and backward kept the host idle while the device ran the call, and the
    # device idle while the host launched the next; where several runs share a GPU (`--per-gpu`), whose
    # processes the card serves by turns, each wait also waited for the other runs' queued kernels. They
    # run `queued()` and call `settle()` before each read-back.
    settled: bool = True

    @property
    def row_grads(self) -> tuple[str, ...]:
        return tuple(g for g in self.op.row_grads if g in self.grads)

    @property
    def param_grads(self) -> tuple[str, ...]:
        return tuple(g for g in self.op.param_grads if g in self.grads)

    @property
    def n_outputs(self) -> int:
        return len(self.op.outputs)

    def inputs(self, rows: int, seed: int) -> OpInputs:
        return self.op.make_inputs(self.params, rows, seed, self.device)

    def grad_outs(self, rows: int, seed: int) -> tuple[torch.Tensor, ...]:
        return self.op.make_grad_outs(self.params, rows, seed, self.device)

    def run(self, inputs: OpInputs, grad_outs: tuple[torch.Tensor, ...]) -> Outcome:
        return execute(self.fn, inputs, grad_outs, self.grads, self.n_outputs, self.op.outputs, self.settled)

    def queued(self) -> "ProbeContext":
        """This context with runs that leave their kernels queued (`settled` False)."""
        return dataclasses.replace(self, settled=False)

    def settle(self) -> None:
        """Wait for the kernels queued so far inside the implementation's block, so that a fault of one of
        its queued kernels (reported asynchronously) surfaces as the row's, before a read-back in harness
        code would meet it. A fault the device reports earlier, at one of the harness's own launches in
        between, leaves the CUDA context unusable and is the row's too (harness/runner.py `_probe_row`)."""
        with execute_module.implementation_code():
            execute_module.settle([torch.empty(0, device=self.device)])

    def run_rows(self, inputs: OpInputs, grad_outs: tuple[torch.Tensor, ...]) -> Outcome:
        """`run`, keeping only the outputs and the per-row gradients: for outcomes a probe holds on to.
        A batch of one still has full-size parameter gradients (adaln_projection's dW is 0.5 GB), and
        all_rows keeps 2048 single-row outcomes: with the parameter gradients that filled the H200."""
        outcome = self.run(inputs, grad_outs)
        return Outcome(outputs=outcome.outputs, grads={g: outcome.grads[g] for g in self.row_grads})

    def reference(self, inputs: OpInputs, grad_outs: Optional[tuple[torch.Tensor, ...]]) -> Reference:
        with self.reference_guard():
            return self.op.reference(self.params, inputs, grad_outs, self.grads, self.reference_variant)

    def rows_index(self, rows: list[int] | range) -> torch.Tensor:
        """The rows as a device index, copied without a wait: a copy from pageable host memory makes the
        host wait for the stream (once per row alone in all_rows), one from pinned memory is queued (the
        pinned block is not reused before the copy has run: torch's caching host allocator records it)."""
        index = torch.as_tensor(list(rows), dtype=torch.long)
        if self.device.type == "cuda":
            return index.pin_memory().to(self.device, non_blocking=True)
        return index.to(self.device)


def select_grad_outs(grad_outs: tuple[torch.Tensor, ...], index: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(g.index_select(0, index) for g in grad_outs)
