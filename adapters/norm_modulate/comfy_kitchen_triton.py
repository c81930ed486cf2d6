"""comfy-kitchen's fused `rms_adaln` (forward only) on its Triton backend: what ComfyUI started with
--enable-triton-backend runs where comfy-kitchen's cuda backend is off (a torch built for CUDA older than 13, which
ComfyUI warns about) or fails to load. The backend is forced with `ck.use_backend("triton")` around each call (a
thread-local override, so it holds in whichever thread calls the row). The call, and why w is not passed:
adapters/_comfy_kitchen.py.
"""
from __future__ import annotations

import torch

from h3bench.adapters._comfy_kitchen import load_rms_adaln
from h3bench.harness.adapter import Adapter, Loaded
from h3bench.harness.ops.norm_modulate import NormModulateParams


def _load(device: torch.device, params: NormModulateParams) -> Loaded:
    if device.type != "cuda":
        raise RuntimeError(f"needs CUDA (Triton kernel), got device {device}")
    return load_rms_adaln(device, params, "triton", forced=True)


ADAPTER = Adapter(name="comfy_kitchen_triton", op="norm_modulate", grads=(), load=_load,
                  summary="comfy-kitchen rms_adaln on its Triton backend (no norm weight, as ComfyUI calls it)")
