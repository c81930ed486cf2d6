"""The common ops (rms_norm, layer_norm, linear, softmax): their declarations at the default config, their
float64 references against torch's own functions in float64, each quick plan end to end
through the torch row (a file that validates, accuracy within the dtype's tolerance, the control flagged,
the plan's counts), and the library rows' calls against recording fakes (the libraries need a GPU)."""
from __future__ import annotations

import json
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from h3bench.adapters import builtin_adapters, control_composition
from h3bench.harness import control, semantics
from h3bench.harness.adapter import Loaded
from h3bench.harness.config import load_config
from h3bench.harness.ops import COMMON_OPS, all_ops, get_op
from h3bench.harness.probes import batch_invariance as bi
from h3bench.harness.runner import RunRequest, run
from tests.helpers import needs_cuda, quick_config
from h3bench.harness.schema import ControlResult, RowResult, from_json, to_dict

CPU, CUDA = torch.device("cpu"), torch.device("cuda")

# op -> (its inputs: name -> (shape at the default config for `ROWS` rows, dtype), its output's width)
ROWS = 3
DECLARED = {
    "rms_norm": ({"x": ((ROWS, 4096), torch.bfloat16), "w": ((4096,), torch.bfloat16)}, 4096),
    "layer_norm": ({"x": ((ROWS, 5120), torch.bfloat16), "w": ((5120,), torch.float32),
                    "b": ((5120,), torch.float32)}, 5120),
    "linear": ({"x": ((ROWS, 4096), torch.bfloat16), "w": ((4096, 4096), torch.bfloat16)}, 4096),
    "softmax": ({"x": ((ROWS, 4096), torch.float32)}, 4096),
}
LIBRARY_ROWS = {"rms_norm": {"liger", "quack", "transformer_engine"}, "layer_norm": {"liger", "transformer_engine"},
                "linear": {"transformer_engine"}, "softmax": {"liger", "quack"}}
COMPILED = ("torch_compile", "torch_compile_max_autotune")


def torch_float64(op: str, params, t: dict[str, torch.Tensor]) -> torch.Tensor:
    """torch's own function for the op, on float64 tensors."""
    width = t["x"].shape[-1]
    if op == "rms_norm":
        return F.rms_norm(t["x"], (width,), t["w"], params.eps)
    if op == "layer_norm":
        return F.layer_norm(t["x"], (width,), t["w"], t["b"], params.eps)
    if op == "linear":
        return F.linear(t["x"], t["w"])
    return torch.softmax(t["x"], dim=-1)


def torch_row(op: str):
    return next(a for a in builtin_adapters(op) if a.name == "torch")


def torch_result(evidence, op: str):
    """The torch row's result in the plain mode (linear's rows carry the mode: `torch[plain]`)."""
    return evidence.results["plain"][get_op(op).row_name("torch", "plain")]


# --- declarations ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", COMMON_OPS)
def test_inputs_and_outputs_have_the_models_shapes_at_the_default_config(op):
    spec, params = get_op(op), load_config(op).inputs
    inputs, width = DECLARED[op]
    case = spec.make_inputs(params, ROWS, seed=3, device=CPU)
    assert list(case.tensors) == list(spec.input_names) == list(inputs)
    for name, (shape, dtype) in inputs.items():
        assert (tuple(case.tensors[name].shape), case.tensors[name].dtype) == (shape, dtype), name
    assert spec.row_inputs == ("x",) and spec.row_grads == ("x",)
    assert spec.param_grads == tuple(n for n in inputs if n != "x")
    (grad_out,) = spec.make_grad_outs(params, ROWS, seed=9, device=CPU)
    assert (tuple(grad_out.shape), grad_out.dtype) == ((ROWS, width), inputs["x"][1])
    # parameters are the same in every case; the rows follow the case seed
    other = spec.make_inputs(params, ROWS, seed=4, device=CPU)
    assert not torch.equal(other.tensors["x"], case.tensors["x"])
    for name in spec.param_grads:
        assert torch.equal(other.tensors[name], case.tensors[name]), name


@pytest.mark.parametrize("op", COMMON_OPS)
def test_reference_is_torchs_own_function_in_float64(op):
    spec, params = get_op(op), load_config(op, quick=True).inputs
    case = spec.make_inputs(params, 5, seed=3, device=CPU)
    grad_outs = spec.make_grad_outs(params, 5, seed=9, device=CPU)
    ref = spec.reference(params, case, grad_outs, spec.differentiable, spec.name)
    leaves = {n: t.detach().double().requires_grad_() for n, t in case.tensors.items()}
    expected = torch_float64(op, params, leaves)
    expected.backward(grad_outs[0].double())
    assert ref.outputs[0].dtype == torch.float64
    torch.testing.assert_close(ref.outputs[0], expected.detach(), rtol=1e-12, atol=1e-12)
    assert set(ref.grads) == set(spec.differentiable)
    for name in spec.differentiable:
        torch.testing.assert_close(ref.grads[name], leaves[name].grad, rtol=1e-10, atol=1e-10, msg=name)


@pytest.mark.parametrize("op", COMMON_OPS)
def test_floor_traffic_grows_with_rows_and_the_backward(op):
    spec, params = get_op(op), load_config(op).inputs
    one, two = (spec.floor_traffic(params, rows, backward=False) for rows in (1000, 2000))
    both = spec.floor_traffic(params, 1000, backward=True)
    assert 0 < one.read < two.read and 0 < one.written < two.written
    assert both.read > one.read and both.written > one.written


def test_common_ops_rows_and_their_composition():
    for op in COMMON_OPS:
        rows = {a.name: a for a in builtin_adapters(op)}
        names = list(rows)
        assert names[0] == "torch" and set(names[1:-2]) == LIBRARY_ROWS[op] and tuple(names[-2:]) == COMPILED
        assert get_op(op).composition_row == "torch"
        for name in COMPILED:
            assert rows[name].grads == rows["torch"].grads
        assert rows["torch"].grads == get_op(op).differentiable


def test_only_linear_is_measured_under_each_mode_by_name():
    assert get_op("linear").row_name("torch", "vllm") == "torch[vllm]"
    assert get_op("linear").row_name("transformer_engine", "vllm") == "transformer_engine"
    assert get_op("rms_norm").row_name("torch", "vllm") == "torch"


def test_op_all_is_the_rfcs_seven_ops():
    assert not set(COMMON_OPS) & set(all_ops())
    assert all_ops()[:7] == ["norm_modulate", "timestep_sinusoid", "timestep_mlp", "adaln_projection",
                             "adaln_row_gather", "gate_residual", "final_adaln_out"]


# --- each quick plan end to end through the torch row ------------------------------------------------------

@pytest.fixture(scope="module")
def quick_runs():
    """Each common op's quick plan through its torch row, plain mode, one timing repeat, the control on."""
    from tests.conftest import DEVICE

    found = {}
    for op in COMMON_OPS:
        config = quick_config(op)
        found[op] = (config, run(RunRequest(config=config, device=torch.device(DEVICE), adapters=[torch_row(op)],
                                            modes=["plain"], out=None, measure_bandwidth=False,
                                            control_adapter=control_composition(op))))
    return found


@pytest.mark.parametrize("op", COMMON_OPS)
def test_quick_plan_runs_end_to_end_and_its_file_validates(quick_runs, op):
    _, evidence = quick_runs[op]
    data = json.loads(json.dumps(to_dict(evidence)))
    assert data["op"] == op and list(data["results"]["plain"]) == [get_op(op).row_name("torch", "plain")]
    assert semantics.problems(from_json(data)) == []


@pytest.mark.parametrize("op", COMMON_OPS)
def test_quick_plan_counts_equal_the_plans_totals(quick_runs, op):
    config, evidence = quick_runs[op]
    row = torch_result(evidence, op)
    assert isinstance(row, RowResult), row
    inv = row.batch_invariance
    assert sum(c.rows for c in inv.all_rows.values()) == bi.all_rows_total(config.all_rows)
    assert inv.full_vs_sub_batches.sub_batches == bi.sub_batches_total(config.full_vs_sub)
    assert inv.batch_size_sweep.comparisons == bi.sweep_total(config.sweep)
    assert row.has_backward
    assert (inv.params_repeatable is None) == (not get_op(op).param_grads)  # softmax has no parameters


@pytest.mark.parametrize("op", COMMON_OPS)
def test_torch_row_is_accurate_within_its_dtypes_tolerance(quick_runs, op):
    """Forward and every gradient within 8 units of the activations' dtype's epsilon (relative to float64):
    bf16 rounds at 2^-8, fp32 at 2^-23; a wrong formula or a transposed weight is off by order one."""
    config, evidence = quick_runs[op]
    eps = torch.finfo(config.inputs.torch_dtype).eps
    row = torch_result(evidence, op)
    assert set(row.accuracy_latency) == {str(n) for n in config.accuracy.rows}
    for size, figures in row.accuracy_latency.items():
        assert 0 <= figures.fwd_rel_err < 8 * eps, size
        assert set(figures.grad_rel_err) == set(get_op(op).differentiable)
        for name, err in figures.grad_rel_err.items():
            assert 0 <= err < 8 * eps, (size, name)


@pytest.mark.parametrize("op", COMMON_OPS)
def test_quick_plan_flags_the_control_planted_in_the_torch_row(quick_runs, op):
    _, evidence = quick_runs[op]
    record = evidence.control
    assert isinstance(record, ControlResult), record
    assert record.flagged is True and control.flagged(record)
    assert record.source.startswith(torch_row(op).load(CPU, load_config(op).inputs).source)
    assert record.row_grads == ["x"]


# --- library rows: their calls, against recording fakes ----------------------------------------------------

def fake_module(monkeypatch, name: str, **attrs):
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    monkeypatch.setitem(sys.modules, name, module)
    parent, _, child = name.rpartition(".")
    if parent:
        monkeypatch.setattr(sys.modules[parent], child, module, raising=False)
    return module


def recording_function(calls: list, math):
    """A stand-in autograd Function: `apply(*args)` records its arguments and returns `math(*args)`."""
    return type("Recorded", (), {"apply": staticmethod(lambda *args: calls.append(args) or math(*args))})


def small_case(op: str, seed: int = 0):
    spec, params = get_op(op), load_config(op, quick=True).inputs
    return params, spec.make_inputs(params, 4, seed=seed, device=CPU).tensors


def load_row(op: str, name: str, params) -> Loaded:
    adapter = next(a for a in builtin_adapters(op) if a.name == name)
    assert isinstance(adapter.try_load(CPU, params), str)  # every library row needs CUDA
    loaded = adapter.try_load(CUDA, params)  # only device.type is looked at while loading
    assert isinstance(loaded, Loaded), loaded
    return loaded


def test_liger_rows_call_its_functions_as_its_functional_api(monkeypatch):
    calls: list = []
    fake_module(monkeypatch, "liger_kernel")
    fake_module(monkeypatch, "liger_kernel.ops",
                LigerRMSNormFunction=recording_function(
                    calls, lambda x, w, eps, *_: F.rms_norm(x, (x.shape[-1],), w, eps)),
                LigerLayerNormFunction=recording_function(
                    calls, lambda x, w, b, eps: F.layer_norm(x, (x.shape[-1],), w, b, eps)),
                LigerSoftmaxFunction=recording_function(calls, lambda x: torch.softmax(x, -1)))
    for op in ("rms_norm", "layer_norm", "softmax"):
        params, t = small_case(op)
        calls.clear()
        y = load_row(op, "liger", params).fn(*t.values())
        assert torch.equal(y, torch_row(op).load(CPU, params).fn(*t.values()))
        (args,) = calls
        assert all(a is b for a, b in zip(args, t.values()))
        # after the tensors: eps, offset, casting mode, in_place (False: dx must not overwrite dy)
        constants = {"rms_norm": lambda: (params.eps, 0.0, "llama", False), "layer_norm": lambda: (params.eps,),
                     "softmax": lambda: ()}[op]()
        assert args[len(t):] == constants, op


def test_quack_rows_call_rmsnorm_and_softmax(monkeypatch):
    calls: list = []

    def rmsnorm(x, weight=None, *, eps=1e-6):
        calls.append(("rmsnorm", eps))
        return F.rms_norm(x, (x.shape[-1],), weight, eps)

    def softmax(x):
        calls.append(("softmax",))
        return torch.softmax(x, -1)

    fake_module(monkeypatch, "quack", rmsnorm=rmsnorm, softmax=softmax)
    for op, expected in (("rms_norm", ("rmsnorm", load_config("rms_norm", quick=True).inputs.eps)),
                         ("softmax", ("softmax",))):
        params, t = small_case(op)
        calls.clear()
        assert torch.equal(load_row(op, "quack", params).fn(*t.values()),
                           torch_row(op).load(CPU, params).fn(*t.values()))
        assert calls == [expected]


class FakeTE(torch.nn.Module):
    """Records its constructor's arguments; NaN parameters until the row copies the op's into them."""

    instances: list = []

    def __init__(self, kind, *shape, **kwargs):
        super().__init__()
        self.kind, self.shape, self.kwargs = kind, shape, kwargs
        FakeTE.instances.append(self)
        dtype = kwargs["params_dtype"]
        weight = (shape[1], shape[0]) if kind == "linear" else shape[:1]  # Linear(in, out): weight [out, in]
        self.weight = torch.nn.Parameter(torch.full(weight, float("nan"), dtype=dtype))
        if kind == "layer_norm":
            self.bias = torch.nn.Parameter(torch.full(weight, float("nan"), dtype=dtype))

    def forward(self, x):
        if self.kind == "rms_norm":
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.kwargs["eps"])
        if self.kind == "layer_norm":  # like TE: computes in its parameters' dtype and returns it
            return F.layer_norm(x.to(self.weight.dtype), (x.shape[-1],), self.weight, self.bias, self.kwargs["eps"])
        return F.linear(x, self.weight)


def fake_te(monkeypatch, module_class) -> None:
    """transformer_engine.pytorch's RMSNorm, LayerNorm and Linear as `module_class` for the test."""
    fake_module(monkeypatch, "transformer_engine")
    fake_module(monkeypatch, "transformer_engine.pytorch",
                RMSNorm=lambda *a, **k: module_class("rms_norm", *a, **k),
                LayerNorm=lambda *a, **k: module_class("layer_norm", *a, **k),
                Linear=lambda *a, **k: module_class("linear", *a, **k))


def test_transformer_engine_rows_copy_the_ops_parameters_into_its_modules(monkeypatch):
    FakeTE.instances = []
    fake_te(monkeypatch, FakeTE)
    for op in ("rms_norm", "layer_norm", "linear"):
        params = load_config(op, quick=True).inputs
        loaded = load_row(op, "transformer_engine", params)
        for seed in (0, 1):  # new parameters reach the module on each call
            _, t = small_case(op, seed)
            t = {n: (v * (1 + seed) if n != "x" else v) for n, v in t.items()}
            got = loaded.fn(*t.values())
            expected = torch_row(op).load(CPU, params).fn(*t.values())
            assert got.dtype == t["x"].dtype
            torch.testing.assert_close(got, expected)  # within the dtype's tolerance: NaN if not copied
    kinds = [(m.kind, m.shape, m.kwargs) for m in FakeTE.instances]
    quick = {op: load_config(op, quick=True).inputs for op in ("rms_norm", "layer_norm", "linear")}
    assert kinds == [
        ("rms_norm", (quick["rms_norm"].hidden,), dict(eps=quick["rms_norm"].eps, params_dtype=torch.bfloat16,
                                                       device=CPU)),
        ("layer_norm", (quick["layer_norm"].hidden,), dict(eps=quick["layer_norm"].eps, params_dtype=torch.float32,
                                                           device=CPU)),
        ("linear", (quick["linear"].in_features, quick["linear"].out_features),
         dict(bias=False, params_dtype=torch.bfloat16, device=CPU)),
    ]


class StampedTE(FakeTE):
    """FakeTE whose backward adds 1 to each parameter's gradient: a reduction of its own, like TE's."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for p in self.parameters():
            p.register_hook(lambda g: g + 1)


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm", "linear"])
def test_transformer_engine_rows_report_the_gradients_of_the_modules_own_parameters(monkeypatch, op):
    fake_te(monkeypatch, StampedTE)
    params, t = small_case(op)
    loaded, torch_fn = load_row(op, "transformer_engine", params), torch_row(op).load(CPU, params).fn
    adapter = next(a for a in builtin_adapters(op) if a.name == "transformer_engine")
    assert adapter.grads == tuple(t) == get_op(op).differentiable  # every input: x and the parameters
    upstream = torch.randn(torch_fn(*t.values()).shape, generator=torch.Generator().manual_seed(1)).to(t["x"].dtype)

    def grads(fn, frozen=()):
        leaves = {n: v.detach().clone().requires_grad_(n not in frozen) for n, v in t.items()}
        out = fn(*leaves.values())
        out.backward(upstream)
        return out.detach(), {n: v.grad for n, v in leaves.items()}

    out, got = grads(loaded.fn)
    expected_out, expected = grads(torch_fn)
    torch.testing.assert_close(out, expected_out)
    torch.testing.assert_close(got["x"], expected["x"])
    for name in t:
        if name != "x":  # the module's gradient, its own reduction's stamp included, in the op's dtype
            assert got[name].dtype == t[name].dtype
            torch.testing.assert_close(got[name], (expected[name].float() + 1).to(t[name].dtype))
    _, frozen = grads(loaded.fn, frozen=[n for n in t if n != "x"])  # parameters frozen: x's alone
    assert all(frozen[n] is None for n in t if n != "x") and torch.equal(frozen["x"], got["x"])
    with torch.no_grad():  # forward only: the module's call, no graph
        assert torch.equal(loaded.fn(*t.values()), out)


@pytest.mark.parametrize("op", COMMON_OPS)
def test_library_rows_are_unavailable_on_a_cpu_with_one_line(op):
    params = load_config(op, quick=True).inputs
    for adapter in builtin_adapters(op):
        if adapter.name in LIBRARY_ROWS[op]:
            reason = adapter.try_load(CPU, params)
            assert isinstance(reason, str) and "\n" not in reason and "needs CUDA" in reason, (adapter.name, reason)



@pytest.mark.parametrize("setting, message", [("param_dtype=int8", "param_dtype must be one of"),
                                              ("hidden=0", "hidden must be >= 1")])
def test_a_bad_constant_is_one_line_and_exit_2(invoke, setting, message):
    result, text = invoke("run", "--op", "layer_norm", "--device", "cpu", "--quick", "--set", setting,
                          "--no-render", "--quiet")
    assert result.exit_code == 2 and message in text and "Traceback" not in result.output


@needs_cuda("needs CUDA: every library row is a GPU kernel")
@pytest.mark.parametrize("op", COMMON_OPS)
def test_installed_library_rows_are_accurate_on_a_gpu(op):
    """Each library row that loads computes the op: its forward within 8 units of the dtype's epsilon of the
    float64 reference, relative to the reference's largest element (a swapped or missing parameter is off
    by order one)."""
    spec, params = get_op(op), load_config(op, quick=True).inputs
    case = spec.make_inputs(params, 130, seed=3, device=CUDA)
    (ref,) = spec.reference(params, case, None, (), spec.name).outputs
    eps, ran = torch.finfo(params.torch_dtype).eps, []
    for adapter in builtin_adapters(op):
        loaded = adapter.try_load(CUDA, params) if adapter.name in LIBRARY_ROWS[op] else None
        if not isinstance(loaded, Loaded):
            continue
        with torch.no_grad():
            got = loaded.fn(*case.tensors.values())
        assert (got.shape, got.dtype) == (ref.shape, params.torch_dtype), adapter.name
        assert float((got.double() - ref).abs().max() / ref.abs().max()) < 8 * eps, adapter.name
        ran.append(adapter.name)
    if not ran:
        pytest.skip(f"no library row of {op} loads here ({', '.join(sorted(LIBRARY_ROWS[op]))})")


def test_the_layer_norm_torch_row_is_diffusers_fp32_layer_norm_bitwise():
    """The op's shape is Wan2.1's FP32LayerNorm (bf16 x, fp32 w and b): the torch row computes it as that
    module does, in fp32 with x cast up and the output cast back, gradients included. F.layer_norm on the
    mixed dtypes directly raises on CUDA."""
    from diffusers.models.normalization import FP32LayerNorm

    params, t = small_case("layer_norm")
    module = FP32LayerNorm(params.hidden, eps=params.eps, elementwise_affine=True)
    with torch.no_grad():
        module.weight.copy_(t["w"])
        module.bias.copy_(t["b"])
    x = t["x"].detach().requires_grad_()
    y = module(x)
    y.float().square().sum().backward()
    expected = (y.detach(), x.grad, module.weight.grad, module.bias.grad)

    leaves = [v.detach().requires_grad_() for v in t.values()]
    got = torch_row("layer_norm").load(CPU, params).fn(*leaves)
    got.float().square().sum().backward()
    assert t["x"].dtype == torch.bfloat16 and t["w"].dtype == torch.float32
    for a, b in zip((got.detach(), *(leaf.grad for leaf in leaves)), expected):
        assert a.dtype == b.dtype and torch.equal(a, b)
