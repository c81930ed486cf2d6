"""comfy-kitchen's fused `rms_adaln` (forward only) on the backend ComfyUI's dispatch gives it: the CUDA kernel on a
GPU, the eager torch composition on a CPU.

ComfyUI keeps comfy-kitchen's cuda backend on where torch is built for CUDA 13 or later and its triton backend off
unless started with --enable-triton-backend (comfy/quant_ops.py); comfy-kitchen then tries ascend, cuda, triton,
eager in that order. So the row calls `ck.rms_adaln` with no backend forced and checks at load that the dispatch
picks cuda on a GPU and eager on a CPU. The call, and why w is not passed: adapters/_comfy_kitchen.py.
"""
from __future__ import annotations

import torch

from h3bench.adapters._comfy_kitchen import load_rms_adaln
from h3bench.harness.adapter import Adapter, Loaded
from h3bench.harness.ops.norm_modulate import NormModulateParams


def _load(device: torch.device, params: NormModulateParams) -> Loaded:
    return load_rms_adaln(device, params, "cuda" if device.type == "cuda" else "eager", forced=False)


ADAPTER = Adapter(name="comfy_kitchen", op="norm_modulate", grads=(), load=_load,
                  summary="comfy-kitchen rms_adaln on ComfyUI's backend (no norm weight, as ComfyUI calls it)")
