"""comfy-kitchen's fused `rms_adaln`, called as ComfyUI's MiniMax-H3 fused-norm change calls it (forward only).

ComfyUI's merged MiniMax-H3 block (comfy/ldm/minimax/model.py, `DiTBlock.forward`) normalises with its RMSNorm
module, weight included, and then modulates each segment in place. The fused call comes from ComfyUI pull
request #15621 (open; #15619, closed, makes the same call), which replaces both steps of norm1 and norm2 with

    h = comfy.quant_ops.ck.rms_adaln(x, scale_msa[mod_segments], shift_msa[mod_segments], eps=self.norm1.eps)

where `mod_segments` is a per-token index tensor into the [M, H] AdaLN chunks. comfy-kitchen's
`rms_adaln(x, scale, shift, eps)` computes rmsnorm(x) * (1 + scale) + shift and has no weight argument, so that
call leaves norm1.weight and norm2.weight out. The rows make the same call: `w` is not passed, and they are judged
against the op itself (weight included), so the accuracy columns show what leaving the weight out costs while the
invariance columns are the kernel's own. The gather is the call's advanced indexing (`sc[idx]`).

`ck.rms_adaln` goes through comfy-kitchen's dispatch (a `torch.library` custom op that picks a backend per call
from its registry), as in ComfyUI. Loading checks that the dispatch picks the row's backend for the run's dtype
and device: the dispatch falls back to the next backend without a word where one cannot take a call.
"""
from __future__ import annotations

import torch

from h3bench.harness.adapter import Loaded, installed_version
from h3bench.harness.ops.norm_modulate import NormModulateParams

DISTRIBUTION = "comfy-kitchen"
FUNCTION = "rms_adaln"


def _backend_status(ck, backend: str) -> None:
    """Raise, with comfy-kitchen's own reason, where `backend` cannot run at all."""
    status = ck.list_backends().get(backend)
    if status is None:
        raise RuntimeError(f"comfy-kitchen has no {backend} backend")
    if status["disabled"]:
        raise RuntimeError(f"comfy-kitchen's {backend} backend is disabled")
    if not status["available"]:
        raise RuntimeError(f"comfy-kitchen's {backend} backend is unavailable: {status['unavailable_reason']}")


def _probe_call(device: torch.device, params: NormModulateParams) -> dict:
    """Arguments like the run's calls (dtype, device, width) for asking the dispatch where they would go."""
    x = torch.zeros(2, params.hidden, dtype=params.torch_dtype, device=device)
    return {"x": x, "scale": x, "shift": x, "eps": params.eps}


def _dispatched(ck, device: torch.device, params: NormModulateParams, forced: bool, backend: str) -> str:
    """The backend comfy-kitchen's dispatch picks for an `rms_adaln` call with the run's dtype and device (under
    `use_backend(backend)` when the row forces it). Its rules for rms_adaln look at dtypes and devices only, so a
    call of any row count goes the same way."""
    kwargs = _probe_call(device, params)
    try:
        if forced:
            with ck.use_backend(backend):
                return ck.registry.get_capable_backend(FUNCTION, kwargs)
        return ck.registry.get_capable_backend(FUNCTION, kwargs)
    except Exception as exc:  # NoCapableBackendError: every backend declined
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RuntimeError(f"comfy-kitchen has no backend for {FUNCTION} on {params.dtype} {device.type} "
                           f"tensors: {first}") from exc


def load_rms_adaln(device: torch.device, params: NormModulateParams, backend: str, forced: bool) -> Loaded:
    """The row's callable on `device`: `ck.rms_adaln` on `backend`, which comfy-kitchen's default dispatch must
    pick by itself (`forced=False`: the backend ComfyUI gets) or under `use_backend(backend)` around every call
    (`forced=True`: a backend ComfyUI gets only where the one before it in comfy-kitchen's order is off)."""
    import comfy_kitchen as ck

    _backend_status(ck, backend)
    picked = _dispatched(ck, device, params, forced, backend)
    if picked != backend:
        raise RuntimeError(f"comfy-kitchen dispatches {FUNCTION} on {params.dtype} {device.type} tensors to its "
                           f"{picked} backend here, not {backend}")
    eps = params.eps
    if forced:
        def fn(x, w, sh, sc, idx):
            with ck.use_backend(backend):
                return ck.rms_adaln(x, sc[idx], sh[idx], eps=eps)
    else:
        def fn(x, w, sh, sc, idx):
            return ck.rms_adaln(x, sc[idx], sh[idx], eps=eps)
    return Loaded(fn=fn, source=(
        f"comfy-kitchen {installed_version(DISTRIBUTION)} rms_adaln, {backend} backend (forward only; as ComfyUI "
        f"PR #15621 calls it: rms_adaln(x, sc[idx], sh[idx], eps), no norm weight)"))
