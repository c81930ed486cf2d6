"""One recorded run: what every module and every dispatcher op received and returned, as per-row digests
(harness/localize/digest.py), in forward and in backward.

Forward: a TorchDispatchMode sees each dispatcher op (a custom op as its own `ns::name`; the ops inside
it are not seen), and global module hooks see each module call (its positional and keyword tensors, its
outputs). Backward: the same mode sees the ops the autograd engine runs; each belongs to the module call
that created its autograd node in forward (the calls' spans of autograd sequence numbers), and names the
forward op that created the node. Global full backward hooks see each module's upstream gradients and the
gradients it passes on. The mode is thread-local state the autograd engine carries to its worker threads,
so this holds on CUDA as on the CPU.

Only digests are kept, not tensors, except where `capture` asks for an event's outputs (the origins).
"""
from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional

import torch
from torch.nn.modules import module as torch_module
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from h3bench.harness.localize.digest import UNINITIALISED, Seen, digest, digestible, row_block, seen
from h3bench.harness.localize.records import BACKWARD, FORWARD

# A node with no forward op (AccumulateGrad) has this sequence number.
_NO_SEQUENCE = (1 << 64) - 1


@dataclass(frozen=True)
class OpEvent:
    """One dispatcher op call: its name, the module call it ran in (`call`, an index into the run's
    `calls`; None outside every module), in backward the autograd node that ran it and the forward op that
    created that node, and the tensors it read and returned."""

    op: str
    call: Optional[int]
    inputs: tuple[Seen, ...]
    outputs: tuple[Seen, ...]
    node: Optional[str] = None
    forward_op: Optional[str] = None
    compare_outputs: bool = True


@dataclass
class ModuleCall:
    """One forward call of a module: its dotted path and class, the call it ran inside, the autograd
    sequence numbers its nodes took ([first, end)), and the tensors it received and returned."""

    path: str
    type: str
    parent: Optional[int]
    first_sequence: int
    end_sequence: int = -1
    inputs: tuple[Seen, ...] = ()
    outputs: tuple[Seen, ...] = ()


@dataclass(frozen=True)
class ModuleBackward:
    """One module's full backward hook: its upstream gradients (`inputs`) and the gradients it passes on."""

    path: str
    type: str
    inputs: tuple[Seen, ...]
    outputs: tuple[Seen, ...]


@dataclass
class Trace:
    """A recorded run of `rows` rows: per phase its op events in order; the forward module calls; the
    backward module events; the outputs `capture` asked for, by (phase, event index)."""

    rows: int
    ops: dict[str, list[OpEvent]] = field(default_factory=lambda: {FORWARD: [], BACKWARD: []})
    calls: list[ModuleCall] = field(default_factory=list)
    backward_modules: list[ModuleBackward] = field(default_factory=list)
    captured: dict[tuple[str, int], list[torch.Tensor]] = field(default_factory=dict)
    module_backward_hooks: bool = True

    def path(self, call: Optional[int]) -> Optional[str]:
        return None if call is None else self.calls[call].path


# (phase, event index, the event) -> the rows of the run to keep the event's outputs at, or None
Capture = Callable[[str, int, OpEvent], Optional[list[int]]]


def _tensors(value) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]


def _written_keywords(func) -> set[str]:
    """The out= arguments an op writes without reading."""
    return {a.name for a in func._schema.arguments
            if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write}


class _Mode(TorchDispatchMode):
    def __init__(self, recorder: "Recorder"):
        super().__init__()
        self.recorder = recorder

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        rec = self.recorder
        if rec.paused:
            return func(*args, **kwargs)
        node = torch._C._current_autograd_node()
        written = _written_keywords(func)
        read = _tensors(args) + _tensors({k: v for k, v in kwargs.items() if k not in written})
        before = rec.seen_all(read)
        hint = torch._C._autograd._get_sequence_nr() - 1
        out = func(*args, **kwargs)
        rec.op_done(func._schema.name, node, hint, before, _tensors(out))
        return out


class Recorder:
    """Records one run (`with Recorder(rows) as trace:`); `root`: the module the checked object is
    (names relative to it), else the outermost module called names the rest; `capture`: which events'
    outputs to keep; `module_backward_hooks`: False where a model's in-place writes to a module's inputs
    refuse full backward hooks."""

    def __init__(self, rows: int, root: Optional[torch.nn.Module] = None, capture: Optional[Capture] = None,
                 module_backward_hooks: bool = True):
        self.trace = Trace(rows=rows, module_backward_hooks=module_backward_hooks)
        self.capture = capture
        self.paused = False
        self._names: dict[int, str] = {}
        self._roots = 0
        self._stack: list[int] = []
        self._forward_op_of: dict[int, str] = {}
        if root is not None:
            self._add_root(root)

    # --- naming -----------------------------------------------------------------------------------------

    def _add_root(self, module: torch.nn.Module) -> None:
        prefix = "" if self._roots == 0 else f"{type(module).__name__}#{self._roots}"
        self._roots += 1
        for name, sub in module.named_modules(remove_duplicate=False):
            self._names.setdefault(id(sub), ".".join(p for p in (prefix, name) if p))

    def _name(self, module: torch.nn.Module) -> str:
        if id(module) not in self._names:
            if not self._stack:
                self._add_root(module)
            else:  # made during the call: named under the module that made it
                self._names[id(module)] = f"{self.trace.calls[self._stack[-1]].path}.<{type(module).__name__}>"
        return self._names[id(module)]

    # --- digests ----------------------------------------------------------------------------------------

    def seen_all(self, tensors: list[torch.Tensor]) -> list[Optional[Seen]]:
        rows = self.trace.rows
        found: list[Optional[Seen]] = []
        digests = [digest(t, rows) if digestible(t) else None for t in tensors]
        values = torch.cat([d for d in digests if d is not None]).tolist() if any(
            d is not None for d in digests) else []
        at = 0
        for t, d in zip(tensors, digests):
            if d is None:
                found.append(None)
                continue
            found.append(seen(t, values[at:at + d.numel()], rows))
            at += d.numel()
        return found

    def _sealed(self, tensors: list[torch.Tensor]) -> tuple[Seen, ...]:
        return tuple(s if s is not None else _unmapped(t) for s, t in zip(self.seen_all(tensors), tensors))

    # --- ops --------------------------------------------------------------------------------------------

    def op_done(self, name: str, node, hint: int, before: list[Optional[Seen]], outs: list[torch.Tensor]) -> None:
        inputs = tuple(s if s is not None else _UNMAPPED for s in before)
        outputs = self._sealed(outs)
        if node is None:
            phase, call, node_name, forward_op = FORWARD, (self._stack[-1] if self._stack else None), None, None
            if hint >= 0:
                self._forward_op_of.setdefault(hint, name)
        else:
            sequence = node._sequence_nr()
            phase, node_name = BACKWARD, node.name()
            call = None if sequence == _NO_SEQUENCE else self._call_of(sequence)
            forward_op = self._forward_op_of.get(sequence)
        event = OpEvent(op=name, call=call, inputs=inputs, outputs=outputs, node=node_name, forward_op=forward_op,
                        compare_outputs=name not in UNINITIALISED)
        events = self.trace.ops[phase]
        events.append(event)
        if self.capture is not None:
            picked = self.capture(phase, len(events) - 1, event)
            if picked is not None:
                self.trace.captured[(phase, len(events) - 1)] = [self._kept(t, picked) for t in outs]

    def _kept(self, t: torch.Tensor, picked: list[int]) -> torch.Tensor:
        rows = self.trace.rows
        if digestible(t) and t.dim() and t.shape[0] and t.shape[0] % rows == 0:
            return row_block(t, rows, picked)
        return t.detach().clone()

    def _call_of(self, sequence: int) -> Optional[int]:
        """The innermost forward module call whose autograd nodes include `sequence`."""
        found, width = None, None
        for i, c in enumerate(self.trace.calls):
            if c.first_sequence <= sequence < c.end_sequence and (width is None or c.end_sequence - c.first_sequence <= width):
                found, width = i, c.end_sequence - c.first_sequence
        return found

    # --- modules ----------------------------------------------------------------------------------------

    def _pre(self, module, args) -> None:
        self.paused = True
        try:
            call = ModuleCall(path=self._name(module), type=type(module).__name__,
                              parent=self._stack[-1] if self._stack else None,
                              first_sequence=torch._C._autograd._get_sequence_nr())
            self.trace.calls.append(call)
            self._stack.append(len(self.trace.calls) - 1)
        finally:
            self.paused = False

    def _post(self, module, args, kwargs, output) -> None:
        self.paused = True
        try:
            if not self._stack:
                return
            call = self.trace.calls[self._stack.pop()]
            call.end_sequence = torch._C._autograd._get_sequence_nr()
            call.inputs = self._sealed(_tensors((args, kwargs)))
            call.outputs = self._sealed(_tensors(output))
        finally:
            self.paused = False

    def _backward(self, module, grad_input, grad_output) -> None:
        self.paused = True
        try:
            self.trace.backward_modules.append(ModuleBackward(
                path=self._name(module), type=type(module).__name__,
                inputs=self._sealed(_tensors(grad_output)), outputs=self._sealed(_tensors(grad_input))))
        finally:
            self.paused = False

    @contextlib.contextmanager
    def active(self) -> Iterator[Trace]:
        handles = [torch_module.register_module_forward_pre_hook(self._pre),
                   torch_module.register_module_forward_hook(self._post, with_kwargs=True)]
        if self.trace.module_backward_hooks:
            handles.append(torch_module.register_module_full_backward_hook(self._backward))
        try:
            with warnings.catch_warnings():
                # a module returning a ModelOutput gets no backward hook, and says so once per call
                warnings.filterwarnings("ignore", message=".*backward hook.*")
                with _Mode(self):
                    yield self.trace
        finally:
            for h in handles:
                h.remove()


_UNMAPPED = Seen(shape=(), dtype="undigested", whole=0, rows=None)


def _unmapped(t) -> Seen:
    return Seen(shape=tuple(getattr(t, "shape", ())), dtype="undigested", whole=0, rows=None)
