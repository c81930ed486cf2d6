"""Shared by the common ops' quack rows: importing Quack (quack-kernels, Dao-AILab's CuTe DSL kernels) with
nvidia-cutlass-dsl's packages on sys.path first, as adapters/norm_modulate/quack_rms_norm.py does
(adapters/COMPETITORS.md, "Quack"), and the source string naming both versions."""
from __future__ import annotations

from h3bench.harness.adapter import installed_version


def import_quack():
    """The `quack` package (its __init__ imports rmsnorm, softmax and cross_entropy)."""
    from h3bench.adapters._sglang_import import ensure_cutlass_dsl_on_path

    ensure_cutlass_dsl_on_path()
    import quack

    return quack


def quack_source(what: str) -> str:
    return (f"Quack {installed_version('quack-kernels')} {what} (CuTe DSL, nvidia-cutlass-dsl "
            f"{installed_version('nvidia-cutlass-dsl-libs-base')}; autograd forward and backward)")
