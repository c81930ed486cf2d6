"""Our kernels' torch.library custom ops (kernels/custom_ops.py): a model made of the seven public functions
compiles with fullgraph=True and gives the eager call's outputs and gradients bitwise; each op's fake
implementation gives its real outputs' shapes, dtypes and strides (torch.library.opcheck); an eager call
never goes through the ops."""
from __future__ import annotations

import pytest
import torch

from h3bench.harness.execute import as_bits
from h3bench.kernels import (adaln_projection, adaln_row_gather, final_adaln_out, gate_residual, norm_modulate,
                             timestep_mlp, timestep_sinusoid)
from h3bench.kernels import adaln_projection_api, adaln_row_gather_api, final_adaln_out_api, gate_residual_api
from h3bench.kernels import norm_modulate_api, timestep_mlp_api, timestep_sinusoid_api
from h3bench.kernels import adaln_row_gather_kernel, gate_residual_kernel, timestep_sinusoid_kernel
from h3bench.kernels.custom_ops import config_fields, config_of
from tests.helpers import needs_interpreter

pytestmark = needs_interpreter("the ops run our kernels on CPU tensors")

APIS = {"norm_modulate": norm_modulate_api, "timestep_sinusoid": timestep_sinusoid_api,
        "timestep_mlp": timestep_mlp_api, "adaln_projection": adaln_projection_api,
        "adaln_row_gather": adaln_row_gather_api, "gate_residual": gate_residual_api,
        "final_adaln_out": final_adaln_out_api}
BF16 = torch.bfloat16
# gate_residual at tiles and chunks smaller than its default's (another gate-gradient order)
SMALL_GATE = gate_residual_kernel.LaunchConfig(block_c=16, fwd_rows=4, fwd_tiles=2, fwd_warps=1, bwd_rows=4,
                                               bwd_warps=1, bwd_programs_per_sm=1, chunk_limit=8, reduce_cols=16,
                                               param_tile=2)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles from scratch (no cached frame or recompile count carried between tests)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _randn(gen, *shape, scale=1.0, dtype=torch.float32):
    return (scale * torch.randn(*shape, generator=gen)).to(dtype)


class TinyDiT(torch.nn.Module):
    """A DiT block's AdaLN path at toy sizes, made of the seven functions: the timestep embedding
    (sinusoid, MLP), the AdaLN table of 3 modalities x 6 chunks (projection), the modulated norm and gated
    residual on the table's chunks, two chunks gathered per token, and the output layer."""

    def __init__(self, hidden=32, freq_dim=16, mlp_hidden=32, temb_dim=24, modalities=3):
        super().__init__()
        gen = torch.Generator().manual_seed(0)

        def param(*shape, dtype=torch.float32, around=0.0):
            return torch.nn.Parameter((around + _randn(gen, *shape, scale=0.1)).to(dtype))

        self.hidden, self.freq_dim, self.modalities = hidden, freq_dim, modalities
        self.w1, self.b1 = param(mlp_hidden, freq_dim), param(mlp_hidden)
        self.w2, self.b2 = param(temb_dim, mlp_hidden), param(temb_dim)
        table_width = modalities * 6 * hidden
        self.wp, self.bp = param(table_width, temb_dim, dtype=BF16), param(table_width, dtype=BF16)
        self.norm_w = param(hidden, dtype=BF16, around=1.0)
        self.out_norm_w = param(hidden, dtype=BF16, around=1.0)
        self.wf, self.bf = param(2 * hidden, temb_dim, dtype=BF16), param(2 * hidden, dtype=BF16)

    def forward(self, x, t, ti, tag):
        h = self.hidden
        temb = timestep_mlp(timestep_sinusoid(t, self.freq_dim), self.w1, self.b1, self.w2, self.b2)
        table = adaln_projection(temb, self.wp, self.bp).view(-1, 6 * h)   # [T * modalities, 6H]
        idx = ti * self.modalities + tag
        y = norm_modulate(x, self.norm_w, table[:, :h], table[:, h:2 * h], idx)
        x = gate_residual(x, y, table[:, 2 * h:3 * h], idx)
        shift, scale = adaln_row_gather(table, ti, tag, self.modalities, 6)[3:5]
        x = x * (1 + scale) + shift
        return final_adaln_out(x, self.out_norm_w, temb, self.wf, self.bf, ti)


def _model_inputs(rows=24, steps=3, hidden=32):
    gen = torch.Generator().manual_seed(1)
    x = _randn(gen, rows, hidden, dtype=BF16).requires_grad_()
    t = 1000 * torch.rand(steps, generator=gen)
    ti = torch.randint(0, steps, (rows,), generator=gen)
    tag = torch.randint(0, 3, (rows,), generator=gen)
    return (x, t, ti, tag), _randn(gen, rows, hidden, dtype=BF16)


def _forward_backward(fn, model, inputs, dy):
    leaves = dict(model.named_parameters(), x=inputs[0])
    for leaf in leaves.values():
        leaf.grad = None
    out = fn(*inputs)
    out.backward(dy)
    return out.detach(), {name: leaf.grad for name, leaf in leaves.items()}


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(as_bits(a), as_bits(b))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_compiled_model_gives_the_eager_bits_with_and_without_grad(backend):
    """fullgraph=True: no graph break. Inductor generates the model's own arithmetic between our ops
    (`x * (1 + scale) + shift`, the index): with emulate_precision_casts its bf16 roundings are eager's, so
    the comparison stays bitwise. No compile caches: a cached graph keeps the fake implementations' layouts
    of the run that stored it."""
    model = TinyDiT()
    inputs, dy = _model_inputs()
    want, want_grads = _forward_backward(model, model, inputs, dy)
    with torch._inductor.config.patch(emulate_precision_casts=True, compile_threads=1, force_disable_caches=True):
        compiled = torch.compile(model, backend=backend, fullgraph=True)
        got, got_grads = _forward_backward(compiled, model, inputs, dy)
        with torch.no_grad():
            got_inference, want_inference = compiled(*inputs), model(*inputs)
    assert _same_bits(got, want)
    assert [name for name in want_grads if not _same_bits(got_grads[name], want_grads[name])] == []
    assert _same_bits(got_inference, want_inference) and _same_bits(want_inference, want)


def test_the_captured_graph_calls_the_custom_ops():
    """Each public function is one call of its op in the graph dynamo captures (not traced into)."""
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    model = TinyDiT()
    inputs, dy = _model_inputs()
    torch.compile(model, backend=record, fullgraph=True)(*inputs).backward(dy)
    (graph,) = graphs
    called = [str(node.target) for node in graph.graph.nodes if node.op == "call_function"]
    assert sorted(c for c in called if c.startswith("h3bench.")) == sorted(f"h3bench.{op}.default" for op in APIS)


def test_an_eager_call_does_not_go_through_the_custom_ops(monkeypatch):
    def refused(*args, **kwargs):
        raise AssertionError("an eager call reached a custom op")

    for api in APIS.values():
        monkeypatch.setattr(api, "_op", refused)
    model = TinyDiT()
    inputs, dy = _model_inputs()
    model(*inputs).backward(dy)
    with torch.no_grad():
        model(*inputs)


def test_a_bad_argument_under_compile_is_named_and_an_index_out_of_range_raises():
    """The fake implementation runs the eager call's argument checks while dynamo traces; the index range
    check (a host sync) runs in the op, when the compiled graph does."""
    gen = torch.Generator().manual_seed(0)
    x, sh, sc = _randn(gen, 8, 16), _randn(gen, 3, 16), _randn(gen, 3, 16)
    idx = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    compiled = torch.compile(lambda *a: norm_modulate(*a), backend="aot_eager", fullgraph=True)
    with pytest.raises(Exception, match=r"w must have shape \(16,\)"):
        compiled(x, torch.ones(15), sh, sc, idx)
    torch._dynamo.reset()
    idx[3] = 3
    with pytest.raises(IndexError, match=r"idx\[3\] = 3 is outside \[0, 3\)"):
        compiled(x, torch.ones(16), sh, sc, idx)


def test_a_launch_config_reaches_the_compiled_call():
    """A config passes to the op as its fields (`config_fields`) and back (`config_of`); compiled with one,
    gate_residual gives what the eager call with it gives."""
    for config in (SMALL_GATE, adaln_row_gather_kernel.launch_config(24), timestep_sinusoid_kernel.launch_config(16)):
        assert config_of(type(config), config_fields(config)) == config
    assert config_of(gate_residual_kernel.LaunchConfig, []) is None
    gen = torch.Generator().manual_seed(0)
    res, y = _randn(gen, 40, 24).requires_grad_(), _randn(gen, 40, 24).requires_grad_()
    gate = _randn(gen, 5, 24).requires_grad_()
    idx = torch.randint(0, 5, (40,), generator=gen)
    dout = _randn(gen, 40, 24)
    results = []
    for fn in (gate_residual, torch.compile(gate_residual, backend="aot_eager", fullgraph=True)):
        for t in (res, y, gate):
            t.grad = None
        out = fn(res, y, gate, idx, config=SMALL_GATE)
        out.backward(dout)
        results.append([out.detach(), res.grad, y.grad, gate.grad])
    assert all(_same_bits(a, b) for a, b in zip(*results))


# --- each op's fake implementation against its real outputs (torch.library.opcheck) ------------------------

def _needs_grad(*tensors):
    return tuple(t.detach().requires_grad_() if t.is_floating_point() else t for t in tensors)


def _norm_modulate_cases():
    gen = torch.Generator().manual_seed(0)
    table = _randn(gen, 9, 32, scale=0.1, dtype=BF16)
    nine = (_randn(gen, 2, 6, 16, dtype=BF16), _randn(gen, 16, dtype=BF16), *table.chunk(2, dim=1),
            torch.randint(0, 9, (2, 6), generator=gen))
    twenty = (_randn(gen, 12, 16), _randn(gen, 16, dtype=torch.float16), _randn(gen, 20, 16, dtype=BF16),
              _randn(gen, 20, 16), torch.randint(0, 20, (12,), generator=gen, dtype=torch.int32))
    empty = (_randn(gen, 0, 16, dtype=BF16), _randn(gen, 16, dtype=BF16), _randn(gen, 3, 16, dtype=BF16),
             _randn(gen, 3, 16, dtype=BF16), torch.zeros(0, dtype=torch.int64))
    return [
        ("3-D x, table chunks (local plan)", _needs_grad(*nine) + (1e-5, True, True), [True] * 4),
        ("M = 20 (global plan)", _needs_grad(*twenty) + (1e-5, True, True), [True, False, True, False]),
        ("no grad", nine + (1e-5, True, False), None),
        ("zero rows", _needs_grad(*empty) + (1e-5, True, True), [True] * 4),
    ]


def _norm_modulate_backward(args, out, needs):
    x, w, sh, sc, idx = args[:5]
    return _randn(torch.Generator().manual_seed(2), *x.shape, dtype=x.dtype), x, w, sh, sc, idx, out[1], out[2], needs


def _gate_residual_cases():
    gen = torch.Generator().manual_seed(0)
    gate = _randn(gen, 9, 6 * 16, scale=0.1, dtype=BF16)[:, 32:48]
    res, y = _randn(gen, 2, 5, 16), _randn(gen, 2, 5, 16, dtype=BF16)
    idx = torch.randint(0, 9, (2, 5), generator=gen)
    return [
        ("3-D rows, a table chunk", _needs_grad(res, y, gate, idx) + (True, []), [True] * 3),
        ("a launch config", _needs_grad(res, y, gate, idx) + (True, config_fields(SMALL_GATE)), [False, True, True]),
    ]


def _gate_residual_backward(args, out, needs):
    return (_randn(torch.Generator().manual_seed(2), *out.shape, dtype=out.dtype), *args[:4], args[5], needs)


def _adaln_row_gather_cases():
    gen = torch.Generator().manual_seed(0)
    table = _randn(gen, 2 * 3, 6 * 8, dtype=BF16)
    ti, tag = torch.randint(0, 2, (10,), generator=gen), torch.randint(0, 3, (10,), generator=gen, dtype=torch.int32)
    config = config_fields(adaln_row_gather_kernel.launch_config(8))
    return [
        ("training", (table.detach().requires_grad_(), ti, tag, 3, 6, True, [], True), [True]),
        ("no grad, a launch config", (table, ti, tag, 3, 6, True, config, False), None),
    ]


def _adaln_row_gather_backward(args, out, needs):
    table, chunks, config = args[0], args[4], args[6]
    grads = _randn(torch.Generator().manual_seed(2), *out[0].shape, dtype=out[0].dtype)
    return grads, out[1], table.shape[0], table.shape[1] // chunks, table.dtype, config


def _adaln_projection_cases():
    gen = torch.Generator().manual_seed(0)
    temb, w, b = _randn(gen, 3, 40), _randn(gen, 48, 40, scale=0.1, dtype=BF16), _randn(gen, 48, dtype=BF16)
    return [
        ("training (a with its ones column)", _needs_grad(temb, w, b) + (True,), [True, True, True]),
        ("training, some gradients", _needs_grad(temb, w, b) + (True,), [False, True, False]),
        ("no grad", (temb, w, b, False), None),
    ]


def _adaln_projection_backward(args, out, needs):
    dy = _randn(torch.Generator().manual_seed(2), *out[0].shape, dtype=out[0].dtype)
    return dy, args[0], args[1], out[1], needs


def _timestep_mlp_cases():
    gen = torch.Generator().manual_seed(0)
    weights = (_randn(gen, 32, 16, scale=0.1), _randn(gen, 32), _randn(gen, 24, 32, scale=0.1), _randn(gen, 24))
    x = _randn(gen, 3, 16)
    return [
        ("training", _needs_grad(x, *weights) + (True,), [True] * 5),
        ("training, some gradients", _needs_grad(x, *weights) + (True,), [False, True, False, False, True]),
        ("no grad", (x, *weights, False), None),
    ]


def _timestep_mlp_backward(args, out, needs):
    x, w1, _, w2 = args[:4]
    return _randn(torch.Generator().manual_seed(2), *out[0].shape), x, w1, w2, out[1], needs


def _final_adaln_out_cases():
    gen = torch.Generator().manual_seed(0)
    params = (_randn(gen, 16, dtype=BF16), _randn(gen, 3, 24), _randn(gen, 32, 24, scale=0.1, dtype=BF16),
              _randn(gen, 32, dtype=BF16))
    x, ti = _randn(gen, 2, 5, 16, dtype=BF16), torch.randint(0, 3, (2, 5), generator=gen)
    many = (_randn(gen, 12, 16), _randn(gen, 16), _randn(gen, 20, 24), _randn(gen, 32, 24, scale=0.1),
            _randn(gen, 32), torch.randint(0, 20, (12,), generator=gen))
    return [
        ("3-D x", _needs_grad(x, *params, ti) + (1e-5, True, True), [True] * 5),
        ("T = 20 (global plan), some gradients", _needs_grad(*many) + (1e-5, True, True),
         [True, False, True, False, True]),
        ("no grad", (x, *params, ti, 1e-5, True, False), None),
    ]


def _final_adaln_out_backward(args, out, needs):
    x, nw, temb, w, _, ti = args[:6]
    dy = _randn(torch.Generator().manual_seed(2), *x.shape, dtype=x.dtype)
    return dy, x, nw, temb, w, ti, out[1], out[2], out[3], out[4], needs


def _timestep_sinusoid_cases():
    t = 1000 * torch.rand(10, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    config = config_fields(timestep_sinusoid_kernel.LaunchConfig(rows=4, warps=1))
    return [("strided float64 t, a launch config", (t[::2], 16, 10000.0, 1.0, config), None),
            ("default", (t.float(), 32, 10000.0, 0.0, []), None)]


CASES = {"norm_modulate": (_norm_modulate_cases, _norm_modulate_backward),
         "gate_residual": (_gate_residual_cases, _gate_residual_backward),
         "adaln_row_gather": (_adaln_row_gather_cases, _adaln_row_gather_backward),
         "adaln_projection": (_adaln_projection_cases, _adaln_projection_backward),
         "timestep_mlp": (_timestep_mlp_cases, _timestep_mlp_backward),
         "final_adaln_out": (_final_adaln_out_cases, _final_adaln_out_backward),
         "timestep_sinusoid": (_timestep_sinusoid_cases, None)}
PARAMS = [pytest.param(op, i, id=f"{op}: {case[0]}") for op, (cases, _) in CASES.items()
          for i, case in enumerate(cases())]


@pytest.mark.parametrize("op,case", PARAMS)
def test_fake_outputs_match_the_real_ones(op, case):
    """opcheck: the fake implementation's outputs against the real ones (shapes, dtypes, strides, storage
    offsets), the schema (no input mutated or aliased), the autograd registration, and the op under
    AOTAutograd with dynamic shapes; for the forward op and, where the case has a backward (`needs`: which
    inputs get gradients), for the backward op on the forward op's real outputs."""
    make_cases, backward_args = CASES[op]
    _, args, needs = make_cases()[case]
    forward = APIS[op]._op
    torch.library.opcheck(forward, args)
    if needs is None:
        return
    out = forward(*_detached(args))
    torch.library.opcheck(APIS[op]._backward_op, _detached(backward_args(args, out, needs)))


def _detached(args) -> tuple:
    """A backward op is not differentiable itself: its inputs as a backward hands them, without grad."""
    return tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
