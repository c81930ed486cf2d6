"""Global modes planted for the tests of the child-process machinery (registered through
H3BENCH_MODE_MODULES, which the children inherit): one that really patches an aten op on the CPU, one
whose switch does nothing, one that cannot import, one that crashes its process, one that hangs."""
from __future__ import annotations

import os
import time

import torch

from h3bench.harness.modes.base import ActiveMode, ModeSpec, dispatch_state, require_replaced

PATCHED_OP = "aten::rsqrt"
_LIBRARIES: list = []  # a torch.library.Library lives only as long as its object


def _patch_rsqrt() -> ActiveMode:
    before = dispatch_state([PATCHED_OP], key="CPU")
    library = torch.library.Library("aten", "IMPL")
    library.impl("rsqrt", lambda x: torch.reciprocal(torch.sqrt(x)), "CPU")
    _LIBRARIES.append(library)

    def check() -> dict:
        return {"replaced": require_replaced("fake_aten", before, [PATCHED_OP], key="CPU"),
                "variable": os.environ.get("H3BENCH_FAKE_MODE_VARIABLE")}

    return ActiveMode(check=check, record={"switch": "torch.library override of aten::rsqrt (CPU)"})


def _does_nothing() -> ActiveMode:
    before = dispatch_state([PATCHED_OP], key="CPU")
    return ActiveMode(check=lambda: {"replaced": require_replaced("fake_inactive", before, [PATCHED_OP], "CPU")})


def _cannot_import() -> ActiveMode:
    import no_such_batch_invariant_library  # noqa: F401

    raise AssertionError("unreachable")


def _crashes() -> ActiveMode:
    os._exit(3)


def _hangs() -> ActiveMode:
    time.sleep(3600)
    raise AssertionError("unreachable")


MODES = [
    ModeSpec(name="fake_aten", summary="patches aten::rsqrt on the CPU", switch=_patch_rsqrt,
             environment={"H3BENCH_FAKE_MODE_VARIABLE": "set-before-start"}, needs=("torch",)),
    ModeSpec(name="fake_inactive", summary="a switch that switches nothing on", switch=_does_nothing),
    ModeSpec(name="fake_unimportable", summary="its library is not installed", switch=_cannot_import),
    ModeSpec(name="fake_crash", summary="kills its process", switch=_crashes),
    ModeSpec(name="fake_hang", summary="never returns", switch=_hangs),
]
