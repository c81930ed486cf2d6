"""CPU tests for the competitor adapters: clear unavailable reasons, and argument plumbing.

The libraries need a GPU (and mostly are not installed here), so they are replaced by fakes that
record their arguments and compute the documented math in float64. The adapters only look at
`device.type` while loading, so they are loaded for "cuda" and then called with CPU tensors.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
import textwrap
import types
from importlib import metadata

import pytest
import torch

from h3bench.harness.adapter import Loaded
from tests.helpers import needs_interpreter, nm_params

CUDA = torch.device("cuda")
CPU = torch.device("cpu")
R, H, M, EPS = 6, 32, 9, 1e-5
PARAMS = nm_params(H, eps=EPS)
IDX = torch.tensor([0, 4, 8, 4, 1, 7])

ADAPTERS = {  # module -> top-level packages it needs (first one missing is named in the reason)
    "h3bench.adapters.norm_modulate.liger": ("liger_kernel",),
    "h3bench.adapters.norm_modulate.liger_rlk_gather": ("liger_kernel", "rl_engine"),
    "h3bench.adapters.norm_modulate.liger_det_gather": ("liger_kernel",),
    "h3bench.adapters.norm_modulate.transformer_engine": ("transformer_engine",),
    "h3bench.adapters.norm_modulate.sglang": ("sglang",),
    "h3bench.adapters.norm_modulate.sglang_indexed": ("sglang",),
    "h3bench.adapters.norm_modulate.rl_kernel": ("rl_engine",),
    "h3bench.adapters.norm_modulate.comfy_kitchen": ("comfy_kitchen",),
    "h3bench.adapters.norm_modulate.comfy_kitchen_triton": ("comfy_kitchen",),
}
# rows whose library also runs on a CPU (comfy-kitchen's eager backend): not "needs CUDA" there
RUN_ON_CPU = ("h3bench.adapters.norm_modulate.comfy_kitchen",)
LIBRARIES = ("liger_kernel", "rl_engine", "transformer_engine", "sglang", "nvidia_cutlass_dsl",
             "cutlass", "comfy_kitchen")


def rms(x, w, eps=EPS):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def norm_modulate(x, w, sh, sc, idx, eps=EPS):
    return rms(x, w, eps) * (1 + sc[idx]) + sh[idx]


def norm_only(x, w, sh, sc, idx, eps=EPS):
    return rms(x, w, eps)


@pytest.fixture
def fresh(monkeypatch):
    """fresh(*tops): those packages start absent from sys.modules; what the test imports is dropped."""
    tracked: set[str] = set()

    def use(*tops):
        tracked.update(tops)
        for name in list(sys.modules):
            if name.split(".")[0] in tops:
                monkeypatch.delitem(sys.modules, name)

    yield use
    for name in list(sys.modules):
        if name.split(".")[0] in tracked:
            del sys.modules[name]


@pytest.fixture
def versions(monkeypatch):
    known = {"liger-kernel": "0.8.5", "sglang": "0.5.23", "nvidia-cutlass-dsl-libs-base": "4.8.0",
             "transformer_engine": "2.20.2", "comfy-kitchen": "0.2.40"}

    def version(dist):
        if dist in known:
            return known[dist]
        raise metadata.PackageNotFoundError(dist)

    monkeypatch.setattr(metadata, "version", version)


def install(monkeypatch, name, **attrs):
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    monkeypatch.setitem(sys.modules, name, module)
    return module


def write_tree(root, files):
    for path, text in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(textwrap.dedent(text))


def load(module_name, device=CUDA):
    loaded = importlib.import_module(module_name).ADAPTER.try_load(device, PARAMS)
    assert isinstance(loaded, Loaded), loaded
    return loaded


def make_inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(R, H, generator=g, dtype=torch.float64) * 2
    w = 0.5 + torch.rand(H, generator=g, dtype=torch.float64)
    table = torch.randn(M, 6 * H, generator=g, dtype=torch.float64) * 0.1
    return x, w, table


def check(fn, grads, ref=norm_modulate, seed=0, grad_tol=1e-12):
    """fn's output and `grads` equal ref's; sh, sc are chunks 0 and 1 of one [M, 6H] table."""
    x, w, table = make_inputs(seed)

    def run(f):
        lx, lw, lt = (t.clone().requires_grad_(bool(grads)) for t in (x, w, table))
        y = f(lx, lw, lt[:, :H], lt[:, H:2 * H], IDX)
        if not grads:
            return y, {}
        y.backward(torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view_as(y))
        got = {"x": lambda: lx.grad, "w": lambda: lw.grad, "sh": lambda: lt.grad[:, :H],
               "sc": lambda: lt.grad[:, H:2 * H]}
        return y, {name: got[name]() for name in grads}

    (y, got), (expected_y, expected) = run(fn), run(ref)
    torch.testing.assert_close(y, expected_y, rtol=1e-12, atol=1e-12)
    for name in grads:
        torch.testing.assert_close(got[name], expected[name], rtol=grad_tol, atol=grad_tol, msg=name)
    return y


def test_import_does_not_import_libraries(fresh):
    fresh(*LIBRARIES, "h3bench.adapters")  # re-import the adapter modules themselves too
    for name in ADAPTERS:
        importlib.import_module(name)
    assert not [lib for lib in LIBRARIES if lib in sys.modules]


@pytest.mark.parametrize("module_name", [m for m in ADAPTERS if m not in RUN_ON_CPU])
def test_unavailable_on_cpu(module_name):
    reason = importlib.import_module(module_name).ADAPTER.try_load(CPU, PARAMS)
    assert isinstance(reason, str)
    assert reason.startswith("RuntimeError: needs CUDA") and "\n" not in reason


@pytest.mark.parametrize("module_name", ADAPTERS)
def test_unavailable_without_library(module_name, fresh, monkeypatch):
    first = ADAPTERS[module_name][0]
    fresh(first)
    monkeypatch.setitem(sys.modules, first, None)  # as if not installed, whatever this machine has
    reason = importlib.import_module(module_name).ADAPTER.try_load(CUDA, PARAMS)
    assert isinstance(reason, str) and "\n" not in reason
    assert reason.startswith("ModuleNotFoundError: ") and first in reason


# --- Liger ------------------------------------------------------------------------------------


def fake_liger(monkeypatch):
    calls = []

    class LigerModulatedRMSNormFunction:
        @staticmethod
        def apply(X, W, scale, shift, eps, offset=0.0, casting_mode="llama", in_place=True):
            calls.append(dict(X=X, W=W, scale=scale, shift=shift, eps=eps, offset=offset,
                              casting_mode=casting_mode, in_place=in_place))
            return rms(X, W, eps) * (1 + scale) + shift

    install(monkeypatch, "liger_kernel")
    install(monkeypatch, "liger_kernel.ops")
    install(monkeypatch, "liger_kernel.ops.modulated_rms_norm",
            LigerModulatedRMSNormFunction=LigerModulatedRMSNormFunction)
    return calls


def check_liger_call(call, x, sh, sc):
    assert call["X"] is x
    assert torch.equal(call["scale"], sc[IDX]) and torch.equal(call["shift"], sh[IDX])
    settings = (call["eps"], call["offset"], call["casting_mode"], call["in_place"])
    assert settings == (EPS, 0.0, "llama", False)


def test_liger_plumbing(fresh, monkeypatch, versions):
    fresh("liger_kernel")
    calls = fake_liger(monkeypatch)
    loaded = load("h3bench.adapters.norm_modulate.liger")
    assert loaded.source == "Liger 0.8.5 modulated RMSNorm + index_select"
    check(loaded.fn, ("x", "w", "sh", "sc"))
    x, w, table = make_inputs()
    sh, sc = table.chunk(6, dim=-1)[:2]
    loaded.fn(x, w, sh, sc, IDX)
    check_liger_call(calls[-1], x, sh, sc)
    assert calls[-1]["W"] is w


@needs_interpreter("the fake Liger runs on the CPU, with our row gather on CPU tensors")
def test_liger_det_gather_plumbing(fresh, monkeypatch, versions):
    """Rows come from our deterministic gather: same values as index_select, and gradients reach the
    tables through its fixed-order backward (compared with index_select's, in float64)."""
    fresh("liger_kernel")
    calls = fake_liger(monkeypatch)
    loaded = load("h3bench.adapters.norm_modulate.liger_det_gather")
    assert loaded.source == ("Liger 0.8.5 modulated RMSNorm + h3bench deterministic row gather "
                             "(kernels/row_gather.py)")
    # The gather's backward accumulates in fp32 by design (one rounding of a fixed-order sum), so its
    # table gradients match float64 index_select to fp32 precision, not 1e-12; a swapped table or a
    # wrong row would be off by O(1).
    check(loaded.fn, ("x", "w", "sh", "sc"), grad_tol=1e-6)
    x, w, table = make_inputs()
    sh, sc = table.chunk(6, dim=-1)[:2]
    loaded.fn(x, w, sh, sc, IDX)
    check_liger_call(calls[-1], x, sh, sc)


# --- rl_engine --------------------------------------------------------------------------------


def fake_rl_engine(monkeypatch, leaf, **ops):
    install(monkeypatch, "rl_engine", __version__="0.0.test")
    for module, (class_name, cls) in ops.items():
        install(monkeypatch, f"rl_engine.{leaf}.{module}", **{class_name: cls})


def fake_rmsnorm_op(calls, available=True):
    class H3RMSNormCudaOp:
        def __init__(self):
            if not available:
                raise RuntimeError("rl_engine._C lacks h3_rmsnorm_*; rebuild")

        def forward_modulated(self, x, weight, shift, scale, index, eps=1e-5, *, check_range=True):
            calls.append(dict(x=x, weight=weight, shift=shift, scale=scale, index=index, eps=eps))
            return norm_modulate(x, weight, shift, scale, index, eps)

    return H3RMSNormCudaOp


@pytest.mark.parametrize("leaf", ["kernels.ops.cuda.h3", "backends.cuda.model_specific.minimax_h3"])
def test_rl_kernel_plumbing(leaf, fresh, monkeypatch):
    fresh("rl_engine")
    calls = []
    fake_rl_engine(monkeypatch, leaf, rmsnorm=("H3RMSNormCudaOp", fake_rmsnorm_op(calls)))
    loaded = load("h3bench.adapters.norm_modulate.rl_kernel")
    assert loaded.source == (f"rl-kernel H3RMSNormCudaOp.forward_modulated (rl_engine.{leaf}.rmsnorm, "
                             "rl_engine 0.0.test)")
    check(loaded.fn, ("x", "w", "sh", "sc"))
    x, w, table = make_inputs()
    sh, sc = table.chunk(6, dim=-1)[:2]
    loaded.fn(x, w, sh, sc, IDX)
    call = calls[-1]
    assert call["x"] is x and call["weight"] is w and call["shift"] is sh and call["scale"] is sc
    assert call["index"] is IDX and call["eps"] == EPS


def test_rl_kernel_without_extension(fresh, monkeypatch):
    fresh("rl_engine")
    fake_rl_engine(monkeypatch, "kernels.ops.cuda.h3",
                   rmsnorm=("H3RMSNormCudaOp", fake_rmsnorm_op([], available=False)))
    reason = importlib.import_module("h3bench.adapters.norm_modulate.rl_kernel").ADAPTER.try_load(CUDA, PARAMS)
    assert reason == "RuntimeError: rl_engine._C lacks h3_rmsnorm_*; rebuild"


def test_rl_kernel_without_op(fresh, monkeypatch):
    fresh("rl_engine")
    install(monkeypatch, "rl_engine")
    reason = importlib.import_module("h3bench.adapters.norm_modulate.rl_kernel").ADAPTER.try_load(CUDA, PARAMS)
    assert reason.startswith("ImportError: rl_engine has no H3RMSNormCudaOp: tried rl_engine.kernels")


def test_liger_rlk_gather_plumbing(fresh, monkeypatch, versions):
    fresh("liger_kernel", "rl_engine")
    liger_calls, gather_calls = fake_liger(monkeypatch), []

    class H3AdaLNRowGatherCudaOp:
        def __call__(self, rows, timestep_indices, token_tags):
            gather_calls.append(dict(rows=rows, ti=timestep_indices, tags=token_tags))
            return tuple(rows.index_select(0, timestep_indices * 3 + token_tags).chunk(6, dim=1))

    fake_rl_engine(monkeypatch, "kernels.ops.cuda.h3",
                   adaln_row_gather=("H3AdaLNRowGatherCudaOp", H3AdaLNRowGatherCudaOp))
    loaded = load("h3bench.adapters.norm_modulate.liger_rlk_gather")
    assert loaded.source == ("Liger 0.8.5 modulated RMSNorm + rl-kernel row gather "
                             "(H3AdaLNRowGatherCudaOp from rl_engine.kernels.ops.cuda.h3.adaln_row_gather, "
                             "rl_engine 0.0.test)")
    check(loaded.fn, ("x", "w", "sh", "sc"))
    x, w, table = make_inputs()
    sh, sc = table.chunk(6, dim=-1)[:2]
    loaded.fn(x, w, sh, sc, IDX)
    rows = gather_calls[-1]["rows"]
    assert rows.shape == (M, 6 * H)
    assert torch.equal(rows[:, :H], sh) and torch.equal(rows[:, H:2 * H], sc)
    assert not rows[:, 2 * H:].any()
    ti, tags = gather_calls[-1]["ti"], gather_calls[-1]["tags"]
    assert torch.equal(ti, IDX // 3) and torch.equal(tags, IDX % 3)
    check_liger_call(liger_calls[-1], x, sh, sc)


def test_liger_rlk_gather_without_rl_engine(fresh, monkeypatch):
    fresh("liger_kernel", "rl_engine")
    fake_liger(monkeypatch)
    monkeypatch.setitem(sys.modules, "rl_engine", None)
    reason = importlib.import_module("h3bench.adapters.norm_modulate.liger_rlk_gather").ADAPTER.try_load(CUDA, PARAMS)
    assert reason.startswith("ModuleNotFoundError: ") and "rl_engine" in reason


# --- Transformer Engine -----------------------------------------------------------------------

FAKE_TE = {
    "transformer_engine/__init__.py": """
        from . import pytorch
        try:
            from . import jax
        except ImportError:
            pass
    """,
    "transformer_engine/jax/__init__.py": "raise AssertionError('TE JAX bindings imported')\n",
    "transformer_engine/pytorch/__init__.py": """
        import torch
        INSTANCES = []

        class RMSNorm(torch.nn.Module):
            def __init__(self, normalized_shape, eps=1e-5, sequence_parallel=None, params_dtype=None,
                         zero_centered_gamma=False, hidden_size=None, **kwargs):
                super().__init__()
                self.args = dict(normalized_shape=normalized_shape, eps=eps,
                                 params_dtype=params_dtype, **kwargs)
                INSTANCES.append(self)
                # float64 rather than params_dtype so the test compares exactly; NaN until copied
                self.weight = torch.nn.Parameter(torch.full((normalized_shape,), float("nan"),
                                                            dtype=torch.float64))

            def forward(self, x):
                # like TE, the backward uses the module's own weight
                return torch.nn.functional.rms_norm(x, (x.shape[-1],), self.weight, self.args["eps"])
    """,
}


def test_transformer_engine_plumbing(fresh, monkeypatch, tmp_path, versions):
    fresh("transformer_engine")
    write_tree(tmp_path, FAKE_TE)
    monkeypatch.syspath_prepend(str(tmp_path))
    loaded = load("h3bench.adapters.norm_modulate.transformer_engine")
    assert "transformer_engine.jax" not in sys.modules  # blocked while importing, then unblocked
    assert loaded.source == "TE 2.20.2 RMSNorm (no modulation)"
    check(loaded.fn, ("x",), ref=norm_only, seed=0)
    check(loaded.fn, ("x",), ref=norm_only, seed=1)  # a new w must reach the module each call
    instances = sys.modules["transformer_engine.pytorch"].INSTANCES
    assert len(instances) == 1
    assert instances[0].args == dict(normalized_shape=H, eps=EPS, params_dtype=torch.bfloat16,
                                     device=CPU)
    x, w, table = make_inputs()
    w = w.requires_grad_()
    loaded.fn(x, w, table[:, :H], table[:, H:2 * H], IDX).sum().backward()
    assert w.grad is None  # copied under no_grad: TE's parameter gets the gradient instead


# --- SGLang -----------------------------------------------------------------------------------

RAISE = "raise AssertionError('package body must be skipped')\n"
NORM = "sglang/kernels/ops/diffusion/norm"
FAKE_SGLANG = {
    "sglang/__init__.py": RAISE,
    "sglang/kernels/__init__.py": RAISE,
    "sglang/kernels/ops/__init__.py": RAISE,
    "sglang/kernels/ops/diffusion/__init__.py": RAISE,
    "sglang/srt/utils/__init__.py": RAISE,  # sglang/srt has no __init__.py in the wheel either
    "sglang/srt/environ.py": "",
    "sglang/srt/utils/custom_op.py": """
        import sglang.srt.environ  # as the real chain does (via sglang.srt.utils.common)

        def register_custom_op(**kwargs):
            return lambda fn: fn
    """,
    f"{NORM}/__init__.py": "",
    "sglang/kernels/kda_kernels/__init__.py": "",
    "sglang/kernels/kda_kernels/norm_scale_shift_jit.py": "",
    f"{NORM}/scale_residual_norm_cutedsl.py": """
        import torch
        CALLS = []

        def fused_norm_scale_shift(x, weight, bias, scale, shift, norm_type, eps=1e-5):
            CALLS.append(dict(x=x, weight=weight, bias=bias, scale=scale, shift=shift,
                              norm_type=norm_type, eps=eps))
            assert x.ndim == 3 and scale.shape == shift.shape == x.shape
            n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight
            return n * (1 + scale) + shift
    """,
    f"{NORM}/rmsnorm_scale_shift_triton.py": """
        import torch
        from sglang.srt.utils.custom_op import register_custom_op
        CALLS = []

        @register_custom_op(op_name="rmsnorm_indexed_scale_shift_cuda", out_shape="x")
        def _cuda(x, weight, shift, scale, indices, eps):
            CALLS.append(dict(x=x, weight=weight, shift=shift, scale=scale, indices=indices, eps=eps))
            assert x.is_contiguous() and shift.stride() == scale.stride()
            n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight
            return n * (1 + scale[indices]) + shift[indices]

        def rmsnorm_indexed_scale_shift(x, weight, shift, scale, indices, eps):
            return _cuda(x, weight, shift, scale, indices, eps)
    """,
}


@pytest.fixture
def fake_sglang(fresh, monkeypatch, tmp_path, versions):
    fresh("sglang", "cutlass", "nvidia_cutlass_dsl")
    write_tree(tmp_path, FAKE_SGLANG)
    monkeypatch.syspath_prepend(str(tmp_path))
    return lambda module: sys.modules[f"sglang.kernels.ops.diffusion.norm.{module}"].CALLS


def test_sglang_plumbing(fake_sglang):
    loaded = load("h3bench.adapters.norm_modulate.sglang")
    assert loaded.source == ("SGLang 0.5.23 fused_norm_scale_shift (forward only; CuTe DSL, "
                             "nvidia-cutlass-dsl 4.8.0; rows pre-gathered with index_select)")
    assert "sglang.kernels.kda_kernels.norm_scale_shift_jit" in sys.modules  # imported before timing
    y = check(loaded.fn, ())
    assert y.shape == (R, H)
    call = fake_sglang("scale_residual_norm_cutedsl")[-1]
    x, w, table = make_inputs()
    assert call["x"].shape == (1, R, H) and torch.equal(call["x"][0], x)
    assert torch.equal(call["weight"], w) and call["bias"] is None
    assert torch.equal(call["scale"][0], table[:, H:2 * H][IDX])
    assert torch.equal(call["shift"][0], table[:, :H][IDX])
    assert (call["norm_type"], call["eps"]) == ("rms", EPS)


def test_sglang_indexed_plumbing(fake_sglang):
    loaded = load("h3bench.adapters.norm_modulate.sglang_indexed")
    assert loaded.source == ("SGLang 0.5.23 rmsnorm_indexed_scale_shift (forward only; Triton, gathers "
                             "table rows by idx in the kernel)")
    check(loaded.fn, ())
    x, w, table = make_inputs()
    sh, sc = table[:, :H], table[:, H:2 * H]
    loaded.fn(x, w, sh, sc, IDX)
    call = fake_sglang("rmsnorm_scale_shift_triton")[-1]
    assert call["x"] is x and call["weight"] is w and call["shift"] is sh and call["scale"] is sc
    assert call["indices"] is IDX and call["eps"] == EPS
    # tables of different layouts are made contiguous: the kernel uses one row stride for both
    y = loaded.fn(x, w, sh.contiguous(), sc, IDX)
    torch.testing.assert_close(y, norm_modulate(x, w, sh, sc, IDX))


def test_ensure_cutlass_dsl_on_path(fresh, monkeypatch, tmp_path):
    fresh("cutlass", "nvidia_cutlass_dsl")
    write_tree(tmp_path, {"nvidia_cutlass_dsl/dsl_packages/cutlass/__init__.py": "FAKE = True\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "path", list(sys.path))  # restore after the helper's insert
    from h3bench.adapters._sglang_import import ensure_cutlass_dsl_on_path

    assert importlib.util.find_spec("cutlass") is None
    ensure_cutlass_dsl_on_path()
    assert importlib.import_module("cutlass").FAKE


# --- comfy-kitchen ----------------------------------------------------------------------------

CK_ROW = "h3bench.adapters.norm_modulate.comfy_kitchen"
CK_TRITON = "h3bench.adapters.norm_modulate.comfy_kitchen_triton"
CK_ORDER = ("ascend", "cuda", "triton", "eager")  # comfy-kitchen's dispatch order (registry.py)


def unweighted(x, w, sh, sc, idx, eps=EPS):
    """What comfy-kitchen's rms_adaln computes from ComfyUI's call: the norm without its weight, modulated."""
    return rms(x, 1.0, eps) * (1 + sc[idx]) + sh[idx]


def fake_comfy_kitchen(monkeypatch, available=("cuda", "triton", "eager"), declines=(), reasons=None):
    """A comfy_kitchen module whose registry dispatches as the real one: a `use_backend` override first, where
    it is available and takes the call, then the backends in order; `declines`: backends whose rules reject the
    call. `rms_adaln` records its arguments and the backend the dispatch picked."""
    import contextlib

    calls, override = [], []

    class Registry:
        def get_capable_backend(self, func_name, kwargs):
            assert func_name == "rms_adaln" and set(kwargs) == {"x", "scale", "shift", "eps"}
            for name in override[-1:] + list(CK_ORDER):
                if name in available and name not in declines:
                    return name
            raise RuntimeError("No capable backend found for 'rms_adaln'\n(every backend declined)")

    def list_backends():
        return {name: {"available": name in available, "disabled": False,
                       "unavailable_reason": None if name in available else (reasons or {}).get(name, "absent"),
                       "capabilities": ["rms_adaln"]} for name in CK_ORDER}

    @contextlib.contextmanager
    def use_backend(name):
        assert name in available
        override.append(name)
        try:
            yield
        finally:
            override.pop()

    def rms_adaln(x, scale, shift, eps=1e-6):
        kwargs = dict(x=x, scale=scale, shift=shift, eps=eps)
        calls.append(dict(kwargs, backend=registry.get_capable_backend("rms_adaln", kwargs)))
        return rms(x, 1.0, eps) * (1 + scale) + shift

    registry = Registry()
    install(monkeypatch, "comfy_kitchen", registry=registry, list_backends=list_backends, use_backend=use_backend,
            rms_adaln=rms_adaln)
    # the load asks the dispatch with arguments on the run's device; here the "cuda" runs use CPU tensors
    for module_name in (CK_ROW, CK_TRITON):
        helper = importlib.import_module(module_name).load_rms_adaln.__globals__
        probe = helper["_probe_call"]
        monkeypatch.setitem(helper, "_probe_call", lambda device, params, probe=probe: probe(CPU, params))
    return calls


def test_comfy_kitchen_rows_are_forward_only_and_judged_against_the_op():
    for module_name in (CK_ROW, CK_TRITON):
        adapter = importlib.import_module(module_name).ADAPTER
        # no reference variant: ComfyUI's call leaves the norm weight out, and the accuracy columns must show it
        assert adapter.grads == () and adapter.reference is None


def test_comfy_kitchen_unavailable_without_library_on_cpu(fresh, monkeypatch):
    fresh("comfy_kitchen")
    monkeypatch.setitem(sys.modules, "comfy_kitchen", None)
    reason = importlib.import_module(CK_ROW).ADAPTER.try_load(CPU, PARAMS)
    assert reason.startswith("ModuleNotFoundError: ") and "comfy_kitchen" in reason and "\n" not in reason


GPU_MACHINE, CPU_MACHINE = ("cuda", "triton", "eager"), ("eager",)  # the backends comfy-kitchen registers there


@pytest.mark.parametrize("module_name, device, available, backend", [
    (CK_ROW, CUDA, GPU_MACHINE, "cuda"), (CK_ROW, CPU, CPU_MACHINE, "eager"), (CK_TRITON, CUDA, GPU_MACHINE, "triton")])
def test_comfy_kitchen_plumbing(module_name, device, available, backend, fresh, monkeypatch, versions):
    fresh("comfy_kitchen")
    calls = fake_comfy_kitchen(monkeypatch, available=available)
    loaded = load(module_name, device)
    assert loaded.source == (f"comfy-kitchen 0.2.40 rms_adaln, {backend} backend (forward only; as ComfyUI PR "
                             "#15621 calls it: rms_adaln(x, sc[idx], sh[idx], eps), no norm weight)")
    check(loaded.fn, (), ref=unweighted)
    x, w, table = make_inputs()
    sh, sc = table.chunk(6, dim=-1)[:2]
    y = loaded.fn(x, w, sh, sc, IDX)
    call = calls[-1]
    assert call["x"] is x and call["eps"] == EPS and call["backend"] == backend
    assert torch.equal(call["scale"], sc[IDX]) and torch.equal(call["shift"], sh[IDX])  # not swapped
    assert torch.equal(loaded.fn(x, 2 * w, sh, sc, IDX), y)  # the weight never reaches the kernel


def test_comfy_kitchen_backend_unavailable(fresh, monkeypatch):
    fresh("comfy_kitchen")
    fake_comfy_kitchen(monkeypatch, available=("eager",),
                       reasons={"cuda": "Failed to load extension: libcublasLt.so.13: cannot open shared object file",
                                "triton": "Neither CUDA nor XPU available on this system"})
    assert importlib.import_module(CK_ROW).ADAPTER.try_load(CUDA, PARAMS) == (
        "RuntimeError: comfy-kitchen's cuda backend is unavailable: Failed to load extension: libcublasLt.so.13: "
        "cannot open shared object file")
    assert importlib.import_module(CK_TRITON).ADAPTER.try_load(CUDA, PARAMS) == (
        "RuntimeError: comfy-kitchen's triton backend is unavailable: Neither CUDA nor XPU available on this system")


@pytest.mark.parametrize("module_name, declined, instead", [(CK_ROW, "cuda", "triton"), (CK_TRITON, "triton", "cuda")])
def test_comfy_kitchen_dispatch_elsewhere_is_unavailable(module_name, declined, instead, fresh, monkeypatch):
    """Where the row's backend declines the run's calls, the dispatch would quietly run the next one: the row is
    unavailable instead, naming both."""
    fresh("comfy_kitchen")
    fake_comfy_kitchen(monkeypatch, declines=(declined,))
    assert importlib.import_module(module_name).ADAPTER.try_load(CUDA, PARAMS) == (
        f"RuntimeError: comfy-kitchen dispatches rms_adaln on bfloat16 cuda tensors to its {instead} backend here, "
        f"not {declined}")


def test_comfy_kitchen_no_backend_takes_the_call(fresh, monkeypatch):
    fresh("comfy_kitchen")
    fake_comfy_kitchen(monkeypatch, declines=("cuda", "triton", "eager"))
    assert importlib.import_module(CK_ROW).ADAPTER.try_load(CUDA, PARAMS) == (
        "RuntimeError: comfy-kitchen has no backend for rms_adaln on bfloat16 cuda tensors: No capable backend "
        "found for 'rms_adaln'")


@pytest.mark.skipif(importlib.util.find_spec("comfy_kitchen") is None,
                    reason="comfy-kitchen is not installed (not in the CI install; tools/pack_devpkgs.sh carries it "
                           "to the GPU machine)")
def test_comfy_kitchen_row_on_cpu_is_the_eager_backend_as_comfyui_calls_it():
    """With the real package: on a CPU the row is comfy-kitchen's eager backend, its bits are those of the call
    ComfyUI makes, and the norm weight plays no part (so against the op it is off by what the weight does)."""
    import comfy_kitchen as ck

    from h3bench.harness.ops import get_op

    params = nm_params(H, eps=EPS)
    loaded = importlib.import_module(CK_ROW).ADAPTER.load(CPU, params)
    assert loaded.source.startswith(f"comfy-kitchen {metadata.version('comfy-kitchen')} rms_adaln, eager backend")
    op = get_op("norm_modulate")
    inputs = op.make_inputs(params, 40, seed=3, device=CPU).tensors
    x, w, sh, sc, idx = (inputs[k] for k in ("x", "w", "sh", "sc", "idx"))
    y = loaded.fn(x, w, sh, sc, idx)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert torch.equal(y, ck.rms_adaln(x, sc[idx], sh[idx], eps=EPS))
    assert torch.equal(loaded.fn(x, w + 1, sh, sc, idx), y)
    as64 = [t.double() if t.is_floating_point() else t for t in (x, w, sh, sc, idx)]
    torch.testing.assert_close(y.double(), unweighted(*as64), rtol=2e-2, atol=2e-2)  # bf16 roundings
    assert (y.double() - norm_modulate(*as64)).abs().max() > 0.1  # w is 0.5 + rand: leaving it out shows
