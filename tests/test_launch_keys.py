"""Launch keys name everything triton's binder specializes on (kernels.common.launch_keyed).

A keyed launch reuses the compiled kernel of the first launch with the same key, so a key that leaves
out something the binder looks at (a tensor's dtype, a pointer's 16-byte alignment, an integer's
specialization, a constexpr) runs a kernel compiled for other arguments: a wrong dtype stored, a
vector load off alignment. That happened once (the norm_modulate parameter stage's key lacked dsc's
dtype; the H200's mixed-dtype tests caught it). Here every keyed launch of a run through many argument
kinds is recorded with the specialization the binder would derive, computed in Python from the
arguments (the same rules, conservatively: any int not in `do_not_specialize` is taken as specialized
on == 1 and on divisibility by 16), and no key may be seen with two different specializations. The
interpreter launches every call the plain way, so this runs on the CPU: what it checks is the keys.
"""
import pytest
import torch

from h3bench.harness.ops.norm_modulate import OP as NM_OP
from h3bench.kernels import common, gemm
from h3bench.kernels import norm_modulate_kernel as K
from h3bench.kernels.adaln_projection_api import adaln_projection
from h3bench.kernels.final_adaln_out_api import final_adaln_out
from h3bench.kernels.norm_modulate_api import norm_modulate
from h3bench.kernels.timestep_mlp_api import timestep_mlp
from tests.helpers import nm_params, shifted
from tests.test_kernel_gemm import ADA_NAMES, MLP_NAMES, ada_case, mlp_case

I32 = (-(1 << 31), (1 << 31) - 1)
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _options(kernel) -> tuple[set, set]:
    """(do_not_specialize, do_not_specialize_on_alignment) of a jitted or an interpreted kernel, by name."""
    if hasattr(kernel, "params"):
        return ({p.name for p in kernel.params if p.do_not_specialize},
                {p.name for p in kernel.params if p.do_not_specialize_on_alignment})
    names = kernel.arg_names
    as_names = lambda given: {names[i] if isinstance(i, int) else i for i in (given or ())}  # noqa: E731
    options = kernel.kwargs
    return as_names(options.get("do_not_specialize")), as_names(options.get("do_not_specialize_on_alignment"))


def specialization(kernel, args: tuple, meta: dict) -> tuple:
    """What triton's binder derives from these arguments (the rules above)."""
    plain, any_alignment = _options(kernel)
    spec = []
    for name, value in zip(kernel.arg_names, args):
        if isinstance(value, torch.Tensor):
            spec.append(("tensor", value.dtype, None if name in any_alignment else value.data_ptr() % 16 == 0))
        elif value is None or isinstance(value, (bool, float)):
            spec.append(type(value).__name__ if not isinstance(value, bool) else ("bool", value))
        elif isinstance(value, int):
            fits = I32[0] <= value <= I32[1]
            spec.append(("int", fits) if name in plain else ("int", fits, value == 1, value % 16 == 0))
        else:
            spec.append(("other", repr(value)))
    return kernel, tuple(spec), tuple(sorted(meta.items()))


@pytest.fixture
def keyed_launches(monkeypatch):
    """Records every keyed launch's (key -> specialization); returns the list of conflicts, which must
    stay empty. The recorded launch then goes on as usual."""
    seen: dict = {}
    conflicts: list = []
    real = common.launch_keyed

    def spy(kernel, grid, device, key, args, meta):
        spec = specialization(kernel, args, meta)
        if seen.setdefault(key, spec) != spec:
            conflicts.append((key, seen[key], spec))
        real(kernel, grid, device, key, args, meta)

    for module in (K, gemm):
        monkeypatch.setattr(module, "launch_keyed", spy)
    yield seen, conflicts


def _nm_run(t: dict, wrt: tuple) -> None:
    leaves = {n: (v.detach().requires_grad_() if n in wrt else v) for n, v in t.items()}
    y = norm_modulate(leaves["x"], leaves["w"], leaves["sh"], leaves["sc"], leaves["idx"])
    y.float().sum().backward()


@pytest.mark.parametrize("table_rows", [3, 40])   # the local plan and the global one
def test_norm_modulate_keys_name_the_specialization(device, keyed_launches, table_rows):
    seen, conflicts = keyed_launches
    params = nm_params(16, "bfloat16", timesteps=table_rows, modalities=1)
    base = NM_OP.make_inputs(params, 12, 3, device).tensors
    # every dtype of each float input, one at a time and all together; aligned and shifted; all
    # gradients and x's alone (no parameter stage); int32 and int64 indices
    cases = []
    for name in ("x", "w", "sh", "sc"):
        for dtype in DTYPES:
            cases.append({**base, name: base[name].to(dtype)})
    cases += [{**base, "x": base["x"].float(), "w": base["w"].half(), "sh": base["sh"].float(),
               "sc": base["sc"].half()},
              {**base, "idx": base["idx"].to(torch.int32)},
              {n: shifted(v) for n, v in base.items()},
              {**base, "sc": shifted(base["sc"]), "x": shifted(base["x"])}]
    for t in cases:
        for wrt in (("x", "w", "sh", "sc"), ("x",)):
            _nm_run(t, wrt)
    assert len(seen) >= 3 and not conflicts, conflicts[:2]


def test_final_adaln_out_keys_name_the_specialization(device, keyed_launches):
    """final_adaln_out's backward hands norm_modulate's backward the halves of one [T, 2H] buffer (`out=`)."""
    from h3bench.harness.ops import get_op
    from h3bench.harness.config import load_config
    seen, conflicts = keyed_launches
    op, params = get_op("final_adaln_out"), load_config("final_adaln_out", quick=True).inputs
    base = op.make_inputs(params, 9, 3, device).tensors
    for t in (base, {n: shifted(v) for n, v in base.items()}):
        values = [t[n].detach().requires_grad_() if n in op.differentiable else t[n] for n in op.input_names]
        final_adaln_out(*values).float().sum().backward()
    assert seen and not conflicts, conflicts[:2]


@pytest.mark.parametrize("op", ["timestep_mlp", "adaln_projection"])
def test_gemm_keys_name_the_specialization(device, keyed_launches, op):
    seen, conflicts = keyed_launches
    fn, names, case = ((timestep_mlp, MLP_NAMES, mlp_case) if op == "timestep_mlp"
                       else (adaln_projection, ADA_NAMES, ada_case))
    for rows in (1, 5):
        inputs, dy = case(device, rows)
        variants = [inputs.tensors, {n: shifted(v) for n, v in inputs.tensors.items()}]
        if op == "adaln_projection":
            variants.append({**inputs.tensors, "temb": inputs.tensors["temb"].to(torch.bfloat16)})
        for t in variants:
            leaves = [t[n].detach().requires_grad_() for n in names]
            fn(*leaves).backward(dy)
    assert seen and not conflicts, conflicts[:2]


def test_tma_gemm_keys_name_the_specialization(device, keyed_launches):
    """tma configs: `_gemm_tma_kernel`'s launches, and the pointer kernel's for operands a descriptor cannot
    read (shifted off 16-byte alignment), at several row counts; forward, split dtemb, dW with db."""
    import dataclasses

    seen, conflicts = keyed_launches
    cfg = gemm.LaunchConfig(32, 64, 32, tma=True, persistent=True)
    split = dataclasses.replace(cfg, split_k=2)
    g = torch.Generator().manual_seed(3)
    bf16 = torch.bfloat16
    w = torch.randn(400, 96, generator=g).to(bf16).to(device)
    b = torch.randn(400, generator=g).to(bf16).to(device)
    for rows in (1, 5, 37):
        temb = torch.randn(rows, 96, generator=g).to(device)
        dy = torch.randn(rows, 400, generator=g).to(bf16).to(device)
        a = gemm.silu_cast(temb, bf16, ones_column=True)
        for w_, dy_ in ((w, dy), (shifted(w), shifted(dy))):
            gemm.forward(a, w_, b, cfg, out_dtype=bf16)
            gemm.input_grad(dy_, w_, split, dsilu_of=temb)
            gemm.weight_grad(dy_, a, cfg, a_ones="stored", dw_dtype=bf16, db_dtype=bf16)
    kernels = {spec[0] for spec in seen.values()}
    assert {gemm._gemm_tma_kernel, gemm._gemm_kernel} <= kernels and not conflicts, conflicts[:2]


def test_a_key_missing_a_dtype_is_caught(device, monkeypatch, keyed_launches):
    """The control: the fixture must see a key that leaves out a dtype. norm_modulate's forward key
    without its tensors' keys collides across x's dtypes."""
    seen, conflicts = keyed_launches
    monkeypatch.setattr(K, "tensor_key", lambda t: None)
    params = nm_params(16, "bfloat16", timesteps=3, modalities=1)
    base = NM_OP.make_inputs(params, 12, 3, device).tensors
    for dtype in (torch.bfloat16, torch.float32):
        _nm_run({**base, "x": base["x"].to(dtype)}, ("x",))
    assert conflicts
