"""The RFC's global batch-invariant modes from vLLM, SGLang and Megatron-Core (docs/operators.md, Modes).

Each switch imports only the library's batch-invariance module (adapters/COMPETITORS.md lists the files
the GPU machine carries and why), switches it on, and checks through the dispatcher that the aten ops the
library replaces on the device's dispatch key really are replaced (`require_replaced`); the evidence
records which ones, the torch flags the mode sets, and every place where h3bench changes what the library
would do (`patched`). None of the three libraries computes float64 GEMMs in its replaced kernels
(sglang and megatron raise KeyError: torch.float64; vLLM computes a float64 mean in float32), so the
float64 reference runs with the mode switched off (`reference_with_mode_off`).

What each replaces on an H200 (capability 9.0), read in vllm 0.34.0, sglang 0.5.23, megatron-core 0.19.2:
- vllm: `mean.dim`, `_log_softmax`, `softmax`, `_softmax`, `bmm`, `bmm.out`; NOT mm/addmm (on Hopper vLLM
  keeps cuBLASLt and makes it invariant with CUBLAS_WORKSPACE_CONFIG=:16:8, CUBLASLT_WORKSPACE_SIZE=1,
  reduced-precision reductions off and cuBLASLt preferred). On Ampere it also replaces the GEMMs.
- sglang: `mm`, `mm.out`, `addmm`, `_log_softmax`, `mean.dim`, `rms_norm`, `mm.dtype`, `bmm` (Triton
  persistent GEMM; fp32 `tl.dot` is TF32 unless TRITON_F32_DEFAULT=ieee: the `_ieee` mode).
- megatron: `mm`, `addmm`, `_log_softmax`, `mean.dim` (Triton). Released megatron-core (0.17-0.19.2) has no
  `backend=` argument: it always routes to Triton, which is what later code calls backend="triton";
  backend="te_native" exists only in unreleased Megatron-LM, so that mode is unavailable with the TypeError.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import os
import sys
import types
from typing import Any, Callable, Optional

import torch

from h3bench.harness.modes.base import ActiveMode, ModeNotActive, ModeSpec, dispatch_state, require_replaced

WATCHED_OPS = ("aten::mm", "aten::mm.out", "aten::mm.dtype", "aten::addmm", "aten::addmm.out", "aten::bmm",
               "aten::bmm.out", "aten::matmul", "aten::linear", "aten::mean.dim", "aten::_log_softmax",
               "aten::softmax", "aten::_softmax", "aten::rms_norm")
VLLM_MODULE = "vllm.model_executor.determinism.batch_invariant"
SGLANG_MODULE = "sglang.srt.batch_invariant_ops.batch_invariant_ops"
MEGATRON_MODULE = "megatron.core.transformer.custom_layers.batch_invariant_kernels"
IEEE = {"TRITON_F32_DEFAULT": "ieee"}


def _dispatch_key() -> str:
    return "CUDA" if torch.cuda.is_available() else "CPU"


def _found(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _torch_flags() -> dict[str, Any]:
    matmul = torch.backends.cuda.matmul
    flags = {"allow_tf32": matmul.allow_tf32,
             "allow_bf16_reduced_precision_reduction": matmul.allow_bf16_reduced_precision_reduction,
             "allow_fp16_reduced_precision_reduction": matmul.allow_fp16_reduced_precision_reduction}
    try:
        flags["preferred_blas_library"] = str(torch.backends.cuda.preferred_blas_library())
    except RuntimeError as exc:  # a build without cuBLASLt (the CPU wheel)
        flags["preferred_blas_library"] = f"{type(exc).__name__}: {exc}"
    return flags


def _checked(mode: str, before: dict[str, str], expected: tuple[str, ...], key: str,
             extra: Callable[[], dict[str, Any]] = dict) -> Callable[[], dict[str, Any]]:
    def check() -> dict[str, Any]:
        replaced = require_replaced(mode, before, expected, key)
        missing = sorted(set(expected) - set(replaced))
        if missing:
            raise ModeNotActive(f"mode {mode} is only partly active: {', '.join(missing)} not replaced on {key}")
        return {"dispatch_key": key, "replaced": replaced, "torch_flags": _torch_flags(), **extra()}
    return check


# --- vLLM ---------------------------------------------------------------------------------------------

def vllm_expected(capability: Optional[tuple[int, int]]) -> tuple[str, ...]:
    common = ("aten::mean.dim", "aten::_log_softmax", "aten::softmax", "aten::_softmax", "aten::bmm",
              "aten::bmm.out")
    if capability is not None and capability[0] == 8:  # vllm: is_device_capability_family(80)
        return ("aten::mm", "aten::mm.dtype", "aten::addmm", "aten::mm.out", "aten::addmm.out", "aten::matmul",
                "aten::linear") + common
    return common


def _load_vllm() -> tuple[types.ModuleType, list[str]]:
    """The module, and what h3bench changed to import it without vLLM's compiled extension (88.7 MB, built
    for torch 2.14; the mode's Hopper path uses none of its kernels)."""
    patched = []
    if "vllm._C_stable_libtorch" not in sys.modules and not _found("vllm._C_stable_libtorch"):
        # vllm/platforms/cuda.py imports it only to register its custom ops
        sys.modules["vllm._C_stable_libtorch"] = types.ModuleType("vllm._C_stable_libtorch")
        patched.append("vllm._C_stable_libtorch: empty module (extension not carried)")
    module = importlib.import_module(VLLM_MODULE)
    if not _found("vllm._custom_ops") or patched:
        # enable() sizes vLLM's Triton tiles from the device's shared memory through that extension; torch reads
        # the same attribute (cudaDevAttrMaxSharedMemoryPerBlockOptin)
        def get_max_shared_memory_bytes(gpu: int = 0) -> int:
            return int(torch.cuda.get_device_properties(gpu).shared_memory_per_block_optin)

        module.get_max_shared_memory_bytes = get_max_shared_memory_bytes
        patched.append("get_max_shared_memory_bytes: read through torch.cuda.get_device_properties")
    return module, patched


def _vllm_switch() -> ActiveMode:
    module, patched = _load_vllm()
    key = module.current_platform.dispatch_key
    if key != _dispatch_key():
        raise ModeNotActive(f"vLLM chose platform {type(module.current_platform).__name__} (dispatch key {key}); "
                            f"this process runs on {_dispatch_key()}")
    capability = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
    expected = vllm_expected(capability)
    before = dispatch_state(WATCHED_OPS, key)
    module.enable_batch_invariant_mode()

    def off() -> None:  # vLLM has no disable: drop its registrations (its flags and variables stay)
        if module._batch_invariant_LIB is not None:
            module._batch_invariant_LIB._destroy()
        module._batch_invariant_LIB = None
        module._batch_invariant_MODE = False

    return ActiveMode(check=_checked("vllm", before, expected, key,
                                     lambda: {"platform": type(module.current_platform).__name__}),
                      off=off, on=module.enable_batch_invariant_mode,
                      record={"switch": f"{VLLM_MODULE}.enable_batch_invariant_mode()", "patched": patched})


# --- SGLang -------------------------------------------------------------------------------------------

SGLANG_EXPECTED = ("aten::mm", "aten::mm.out", "aten::addmm", "aten::_log_softmax", "aten::mean.dim",
                   "aten::rms_norm", "aten::mm.dtype", "aten::bmm")


def _sglang_switch() -> ActiveMode:
    module = importlib.import_module(SGLANG_MODULE)
    key = _dispatch_key()
    before = dispatch_state(WATCHED_OPS, key)
    module.enable_batch_invariant_mode()

    def deepgemm() -> dict[str, Any]:
        return {"deepgemm_for_bf16": bool(getattr(module, "ENABLE_JIT_DEEPGEMM", False)
                                          and getattr(module, "_ENABLE_MM_DEEPGEMM", False)),
                "TRITON_F32_DEFAULT": os.environ.get("TRITON_F32_DEFAULT")}

    # Off around the reference by disable + enable: sglang's own set_batch_invariant_mode(False) leaves the
    # module saying "enabled" with nothing registered once it exits (read in batch_invariant_ops.py).
    return ActiveMode(check=_checked("sglang", before, SGLANG_EXPECTED, key, deepgemm),
                      off=module.disable_batch_invariant_mode, on=module.enable_batch_invariant_mode,
                      record={"switch": f"{SGLANG_MODULE}.enable_batch_invariant_mode()"})


# --- Megatron-Core ------------------------------------------------------------------------------------

MEGATRON_EXPECTED = ("aten::mm", "aten::addmm", "aten::_log_softmax", "aten::mean.dim")


def _load_megatron() -> tuple[types.ModuleType, list[str]]:
    module = importlib.import_module(MEGATRON_MODULE)
    patched = []
    missing = [n for n in ("transformer_engine.pytorch", "megatron.core.extensions.transformer_engine")
               if not _found(n)]
    if missing:
        # 0.19.2's enable ends by patching Transformer Engine's own GEMM and RMSNorm entry points and raises when
        # TE is absent, after the aten ops are registered; its docstring promises a no-op then. F.linear never
        # goes through TE, so the no-op changes nothing measured here.
        module._te_patch_for_batch_invariant = lambda: None
        patched.append(f"_te_patch_for_batch_invariant: no-op ({', '.join(missing)} not importable)")
    return module, patched


def _megatron_enable(module: types.ModuleType, backend: str) -> Callable[[], None]:
    parameters = inspect.signature(module.enable_batch_invariant_mode).parameters
    if "backend" in parameters:
        return lambda: module.enable_batch_invariant_mode(backend=backend)
    if backend == "triton":  # released versions: no argument, always Triton
        return module.enable_batch_invariant_mode
    raise TypeError(f"megatron-core {_version('megatron-core')}: enable_batch_invariant_mode"
                    f"{inspect.signature(module.enable_batch_invariant_mode)} has no backend={backend!r} "
                    "(only unreleased Megatron-LM main has te_native)")


def _megatron_switch(backend: str) -> Callable[[], ActiveMode]:
    def switch() -> ActiveMode:
        module, patched = _load_megatron()
        enable = _megatron_enable(module, backend)
        key = _dispatch_key()
        before = dispatch_state(WATCHED_OPS, key)
        enable()
        expected = MEGATRON_EXPECTED if backend == "triton" else ()
        return ActiveMode(check=_checked(f"megatron_{backend}", before, expected, key),
                          off=module.disable_batch_invariant_mode, on=enable,
                          record={"switch": f"{MEGATRON_MODULE}.enable_batch_invariant_mode"
                                            f"({'' if backend == 'triton' else f'backend={backend!r}'})",
                                  "patched": patched})
    return switch


def _version(dist: str) -> str:
    from importlib import metadata

    with contextlib.suppress(metadata.PackageNotFoundError):
        return metadata.version(dist)
    return "(not installed)"


VLLM = ModeSpec(name="vllm", summary="vLLM enable_batch_invariant_mode()", switch=_vllm_switch,
                environment={"CUBLAS_WORKSPACE_CONFIG": ":16:8", "CUBLASLT_WORKSPACE_SIZE": "1"}, needs=("vllm",),
                reference_with_mode_off=True)
SGLANG = ModeSpec(name="sglang", summary="SGLang enable_batch_invariant_mode()", switch=_sglang_switch,
                  needs=("sglang",), reference_with_mode_off=True)
SGLANG_IEEE = ModeSpec(name="sglang_ieee", summary="SGLang's mode, fp32 Triton dots in IEEE fp32",
                       switch=_sglang_switch, environment=IEEE, needs=("sglang",), reference_with_mode_off=True)
MEGATRON_TE_NATIVE = ModeSpec(name="megatron_te_native", summary="Megatron-Core, backend te_native",
                              switch=_megatron_switch("te_native"), environment={"CUBLASLT_WORKSPACE_SIZE": "0"},
                              needs=("megatron-core", "transformer_engine"), reference_with_mode_off=True)
MEGATRON_TRITON = ModeSpec(name="megatron_triton", summary="Megatron-Core, backend triton",
                           switch=_megatron_switch("triton"), needs=("megatron-core",), reference_with_mode_off=True)
MEGATRON_TRITON_IEEE = ModeSpec(name="megatron_triton_ieee", summary="Megatron-Core triton, IEEE fp32 dots",
                                switch=_megatron_switch("triton"), environment=IEEE, needs=("megatron-core",),
                                reference_with_mode_off=True)
LIBRARY_MODES = (VLLM, SGLANG, SGLANG_IEEE, MEGATRON_TE_NATIVE, MEGATRON_TRITON, MEGATRON_TRITON_IEEE)
