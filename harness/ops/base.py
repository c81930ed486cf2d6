"""What the probes need to know about an operator, and nothing about any implementation.

An op declares its inputs in call order (each per-row or not, differentiable or not), its outputs, its
constants (the fields of its `params_type`, which is also the config's `[inputs]` table) and its plan
set (which built-in probe plans it uses: `configs/plans/<plan_set>.toml`). From those declarations:

- a "row" is one entry along the first dimension of every per-row input, sliced together;
- the per-row gradients (`row_grads`: per-row and differentiable) are compared bitwise row by row;
- the parameter gradients (`param_grads`: differentiable, not per-row) are checked for bitwise
  repeatability only, since they are sums over rows;
- every output is per-row (its first dimension is the row dimension) and gets an upstream gradient when
  the row has a backward.

The op also makes seeded inputs and upstream gradients, computes the float64 reference and knows its
memory traffic (`floor_traffic`: the fewest bytes read and written, from which harness/floors.py makes the
memory floor). Nothing in harness/ or reports/ names a tensor: they read these declarations.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

import torch


@dataclass(frozen=True)
class Input:
    name: str
    per_row: bool = False
    differentiable: bool = False
    # Its shape in words, one expression per dimension over the op's parameter fields and R (the rows):
    # ("R", "hidden"), ("timesteps*modalities", "hidden"). What `h3bench list --op` prints for a newcomer
    # writing an --adapter; tests/test_op_declarations.py evaluates it against make_inputs.
    shape: tuple[str, ...] = ()


@dataclass(frozen=True)
class OpInputs:
    """The named tensors of one case, in call order. Row tensors share their first dimension."""

    tensors: Mapping[str, torch.Tensor]
    row_names: tuple[str, ...]

    @property
    def rows(self) -> int:
        return self.tensors[self.row_names[0]].shape[0]

    def select_rows(self, index: torch.Tensor) -> "OpInputs":
        """The same case restricted to `index` rows, in that order, as fresh tensors; parameters shared."""
        picked = {name: (t.index_select(0, index) if name in self.row_names else t)
                  for name, t in self.tensors.items()}
        return OpInputs(tensors=picked, row_names=self.row_names)


@dataclass(frozen=True)
class Traffic:
    """Bytes that must cross device memory: read and written kept apart, since a device reads faster than
    it writes and the floor prices each at its own measured rate."""

    read: int
    written: int

    @property
    def total(self) -> int:
        return self.read + self.written


@dataclass
class Reference:
    """float64 outputs (in the op's output order) and the float64 gradients asked for."""

    outputs: tuple[torch.Tensor, ...]
    grads: dict[str, torch.Tensor] = field(default_factory=dict)


class Op:
    """Base of every operator module's `OP`. Subclasses set the class attributes and implement
    `make_inputs`, `make_grad_outs`, `reference` and `floor_traffic`."""

    name: str
    rfc: str = "RL-Align/RL-Kernel#420"  # the evidence file's `rfc` key: the RFC whose op this is
    inputs: tuple[Input, ...]
    outputs: tuple[str, ...]
    params_type: type
    plan_set: str                     # configs/plans/<plan_set>.toml holds the default probe plans
    references: tuple[str, ...] = ()  # extra reference variants (rows implementing part of the op)
    # The fields of `params_type` the op's math takes besides its tensors (eps, a table's layout, the
    # sinusoid's period): an external function that names them as keyword arguments gets the run's values.
    constants: tuple[str, ...] = ()
    # Rows whose evidence name carries the mode, as the RFC's files name them (`diffusers[vllm]` in the GEMM
    # ops, where the same composition is measured under every global mode).
    mode_tagged_rows: tuple[str, ...] = ()
    # The row whose composition is the op written plainly in torch, where the negative control
    # (harness/control.py) plants its fault: the RFC's ops replay diffusers' (`diffusers`); the common ops
    # are one torch.nn.functional call (`torch`).
    composition_row: str = "diffusers"
    # Whether `floor_traffic` is implemented: a user op may leave it out, and its run then has no floors.
    declares_traffic: bool = True
    # The outputs' shapes, as Input.shape, in `outputs` order.
    output_shapes: tuple[tuple[str, ...], ...] = ()
    # The op in one line, as its float64 reference computes it (`h3bench list --op` prints it).
    formula: str = ""

    # --- derived from the declarations --------------------------------------------------------------
    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.inputs)

    @property
    def differentiable(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.inputs if i.differentiable)

    @property
    def row_inputs(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.inputs if i.per_row)

    @property
    def row_grads(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.inputs if i.per_row and i.differentiable)

    @property
    def param_grads(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.inputs if i.differentiable and not i.per_row)

    def row_name(self, row: str, mode: str) -> str:
        return f"{row}[{mode}]" if row in self.mode_tagged_rows else row

    @property
    def control_subject(self) -> str:
        """What the negative control plants its fault in, in words (the run's progress names it)."""
        return f"the {self.composition_row} composition"

    @property
    def reference_variants(self) -> tuple[str, ...]:
        """The op itself first, then the partial variants some rows are judged against."""
        return (self.name, *self.references)

    def check_variant(self, variant: str) -> None:
        """ValueError unless `variant` is one of this op's reference variants."""
        if variant not in self.reference_variants:
            raise ValueError(f"unknown reference variant {variant!r}; known: {self.reference_variants}")

    def float64_reference(self, inputs: OpInputs, grad_outs: Optional[tuple[torch.Tensor, ...]],
                          grads: tuple[str, ...], variant: str,
                          math: Callable[[dict[str, torch.Tensor]], tuple[torch.Tensor, ...]]) -> Reference:
        """The plumbing every differentiable op's `reference` shares, around its own `math`: the variant
        checked, float64 leaves (those in `grads` requiring grad when there are upstream gradients),
        `math(leaves)` -> the outputs in output order, their gradients against `grad_outs`, all detached.
        Only `math` differs from op to op (and, in an op with partial variants, from variant to variant)."""
        self.check_variant(variant)
        leaves = float64_leaves(inputs, self.differentiable, grads, grad_outs is not None)
        with torch.enable_grad():
            outs = tuple(math(leaves))
            found = reference_grads(outs, leaves, grad_outs, grads)
        return Reference(outputs=tuple(o.detach() for o in outs), grads=found)

    def bundle(self, tensors: dict[str, torch.Tensor]) -> OpInputs:
        """OpInputs in the declared call order, checked against the declaration."""
        if set(tensors) != set(self.input_names):
            raise ValueError(f"{self.name}: inputs {sorted(tensors)} differ from the declared "
                             f"{list(self.input_names)}")
        return OpInputs(tensors={name: tensors[name] for name in self.input_names}, row_names=self.row_inputs)

    # --- what each op implements ------------------------------------------------------------------
    def make_inputs(self, params: Any, rows: int, seed: int, device: torch.device) -> OpInputs:
        raise NotImplementedError

    def make_grad_outs(self, params: Any, rows: int, seed: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        """One upstream gradient per output, in output order, drawn from `seed`."""
        raise NotImplementedError

    def reference(self, params: Any, inputs: OpInputs, grad_outs: Optional[tuple[torch.Tensor, ...]],
                  grads: tuple[str, ...], variant: str) -> Reference:
        raise NotImplementedError

    def floor_traffic(self, params: Any, rows: int, backward: bool) -> Traffic:
        """Fewest bytes that must be read and written in device memory for `rows` rows (forward, or
        forward+backward)."""
        raise NotImplementedError

    def floor_bytes(self, params: Any, rows: int, backward: bool) -> int:
        """`floor_traffic`'s bytes read plus written."""
        return self.floor_traffic(params, rows, backward).total


# --- helpers the op modules share -------------------------------------------------------------------

# The `rfc` of the common ops (rms_norm, layer_norm, linear, softmax): no RFC audits them; their files keep
# the RFC's format.
NOT_IN_RFC = "none (a common op; the file keeps RL-Align/RL-Kernel#420's format)"

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def torch_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {name!r}") from None


def generator(device: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def modality_layout(rows: int, seed: int, timesteps: int, modalities: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The RFC's per-row layout: (timestep index, modality tag) per row, drawn i.i.d. from a CPU generator
    seeded with the case seed, tags first; the first rows get tags 0, 1, 2, ... (docs/operators.md, "Common to all")."""
    gen = torch.Generator().manual_seed(seed)
    tags = torch.randint(0, modalities, (rows,), generator=gen)
    steps = torch.randint(0, timesteps, (rows,), generator=gen)
    first = min(rows, modalities)
    tags[:first] = torch.arange(first)
    return steps, tags


def float64_leaves(inputs: OpInputs, differentiable: tuple[str, ...], grads: tuple[str, ...],
                   want_grads: bool) -> dict[str, torch.Tensor]:
    """float64 copies of the floating inputs (integer inputs as they are); those in `grads` require grad."""
    out = {}
    for name, t in inputs.tensors.items():
        if t.is_floating_point():
            out[name] = t.detach().double().requires_grad_(want_grads and name in grads and name in differentiable)
        else:
            out[name] = t
    return out


def reference_grads(outputs: tuple[torch.Tensor, ...], leaves: dict[str, torch.Tensor],
                    grad_outs: Optional[tuple[torch.Tensor, ...]], grads: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """d(outputs)/d(leaves in grads) against the upstream gradients, in float64."""
    wanted = [name for name in grads if leaves[name].requires_grad]
    if not wanted or grad_outs is None:
        return {}
    pairs = [(o, g.double()) for o, g in zip(outputs, grad_outs) if o.requires_grad]
    found = torch.autograd.grad([o for o, _ in pairs], [leaves[n] for n in wanted], [g for _, g in pairs],
                                allow_unused=True)
    return {name: (g if g is not None else torch.zeros_like(leaves[name])) for name, g in zip(wanted, found)}


def element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def positive(name: str, value: int) -> None:
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")


def positive_fields(params: Any, *names: str) -> None:
    """`positive` for each named field of a params record, in order: the first one below 1 is named."""
    for name in names:
        positive(name, getattr(params, name))


def positive_eps(eps: float) -> None:
    """The norm ops' eps: a strictly positive float (`not > 0` also refuses NaN)."""
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")


class DtypeParams:
    """Mixin for params records whose `dtype` field names the working dtype (a config string): the torch
    dtype it names. No fields of its own, so each op's dataclass keeps its fields in its config's order."""

    dtype: str

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch_dtype(self.dtype)


class TableParams(DtypeParams):
    """Mixin for the ops that gather from the AdaLN table, one row per (timestep, modality)."""

    timesteps: int
    modalities: int

    @property
    def table_rows(self) -> int:
        return self.timesteps * self.modalities


def table_index(params: TableParams, rows: int, seed: int) -> torch.Tensor:
    """The AdaLN table row of each of `rows` rows, timestep * modalities + tag, from the RFC's layout for
    `seed` (`modality_layout`), on the CPU: the `idx` input of the ops that take one index."""
    steps, tags = modality_layout(rows, seed, params.timesteps, params.modalities)
    return steps * params.modalities + tags


def adaln_table(rows: int, width: int, gen: torch.Generator, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """An AdaLN table as the RFC's inputs draw it: 0.1 randn [rows, width] from `gen`, rounded to `dtype`
    (the ops draw it from different generators: the case's, or the fixed parameter seed's)."""
    return (torch.randn(rows, width, generator=gen, device=device) * 0.1).to(dtype)


def randn_grad_outs(rows: int, width: int, dtype: torch.dtype, seed: int, device: torch.device,
                    count: int = 1) -> tuple[torch.Tensor, ...]:
    """Upstream gradients as the ops draw them: `count` [rows, width] randn tensors, one after another from
    one generator seeded with `seed` on `device`, each rounded to `dtype`."""
    gen = generator(device, seed)
    return tuple(torch.randn(rows, width, generator=gen, device=device).to(dtype) for _ in range(count))
