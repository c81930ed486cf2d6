"""Shared bits of the CPU tests: where the prior-art file lives, and the honest composition."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
PRIOR_ART_NAME = "norm_modulate_b200.json"
# shared/ beside the clone (the workspace and CI layout), or inside it (a copied working tree); last, the
# copy under tests/data (taken from shared/prior-art on 2026-12-02), so a lone clone still checks the contract.
PRIOR_ART_CANDIDATES = (REPO.parent / "shared" / "prior-art" / PRIOR_ART_NAME,
                        REPO / "shared" / "prior-art" / PRIOR_ART_NAME,
                        REPO / "tests" / "data" / PRIOR_ART_NAME)


def prior_art_path() -> Optional[Path]:
    return next((p for p in PRIOR_ART_CANDIDATES if p.is_file()), None)


def require_prior_art() -> Path:
    import pytest

    path = prior_art_path()
    if path is None:
        pytest.skip("prior-art file not found; looked at " + ", ".join(map(str, PRIOR_ART_CANDIDATES)))
    return path


def nm_params(hidden: int = 64, dtype: str = "bfloat16", **changes):
    """norm_modulate's parameters at the default config's constants, with `hidden` and `dtype` set."""
    import dataclasses

    from harness.config import load_config

    base = load_config("norm_modulate").inputs
    return dataclasses.replace(base, hidden=hidden, dtype=dtype, **changes)


def composition(x, w, sh, sc, idx):
    """The op as diffusers composes it: F.rms_norm, then index_select modulation."""
    y = F.rms_norm(x, (x.shape[-1],), w, 1e-5)
    return y * (1 + sc.index_select(0, idx)) + sh.index_select(0, idx)


def even(t: torch.Tensor) -> bool:
    return t.shape[0] % 2 == 0
