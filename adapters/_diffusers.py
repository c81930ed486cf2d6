"""Shared by every op's diffusers row: the note its source string ends with.

The diffusers rows replay diffusers' ops with torch alone (they never import diffusers), so the note only
records which diffusers, if any, sat beside the replay when the evidence was taken."""
from __future__ import annotations

from importlib import metadata


def diffusers_installed() -> str:
    """For source strings: ' (diffusers X installed)', or nothing when diffusers is not installed."""
    try:
        return f" (diffusers {metadata.version('diffusers')} installed)"
    except metadata.PackageNotFoundError:
        return ""
