"""Global modes a run can be made under (docs/operators.md, Modes).

Each mode but `plain` runs in its own child process (harness/children.py). A new mode is one ModeSpec in a
module here plus one line below. Modes from elsewhere (a package's entry points in the `h3bench.modes`
group, or the modules named in H3BENCH_MODE_MODULES, each with a `MODES` sequence: how the tests plant
fake modes) are registered too; a child process inherits the variable, so it knows the same modes.
"""
from __future__ import annotations

import importlib
import os
from importlib import metadata

from h3bench.harness.modes.base import ActiveMode, ModeNotActive, ModeSpec
from h3bench.harness.modes.library_modes import LIBRARY_MODES
from h3bench.harness.modes.torch_modes import DETERMINISTIC, PLAIN

ENTRY_POINT_GROUP = "h3bench.modes"
MODULES_VARIABLE = "H3BENCH_MODE_MODULES"

# The RFC's seven modes in its order, then torch's own deterministic switch.
MODES: dict[str, ModeSpec] = {spec.name: spec for spec in (PLAIN, *LIBRARY_MODES, DETERMINISTIC)}


def register_modules(names: list[str]) -> None:
    """Register the `MODES` of each named module."""
    register([spec for name in names for spec in importlib.import_module(name).MODES])


def register(specs: list[ModeSpec]) -> None:
    for spec in specs:
        if not isinstance(spec, ModeSpec):
            raise TypeError(f"a registered mode must be a ModeSpec, got {type(spec).__name__}")
        if spec.name in MODES and MODES[spec.name] is not spec:
            raise ValueError(f"mode {spec.name!r} is registered twice")
        MODES[spec.name] = spec


def _register_external() -> None:
    register_modules([m.strip() for m in os.environ.get(MODULES_VARIABLE, "").split(",") if m.strip()])
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        found = ep.load()
        register(list(found) if isinstance(found, (list, tuple)) else [found])


_register_external()


def get_mode(name: str) -> ModeSpec:
    try:
        return MODES[name]
    except KeyError:
        raise ValueError(f"unknown mode {name!r}; known modes: {', '.join(MODES)}") from None


def parse_modes(values: list[str]) -> list[str]:
    """`--mode a,b --mode c` or `--mode all` as an ordered list of known mode names, no repeats."""
    names: list[str] = []
    for value in values:
        for name in (v.strip() for v in value.split(",")):
            if not name:
                continue
            names.extend(MODES if name == "all" else [name])
    unknown = [n for n in names if n not in MODES]
    if unknown:
        raise ValueError(f"unknown mode(s) {', '.join(unknown)}; known: {', '.join(MODES)}, or all")
    if not names:
        raise ValueError("no mode named")
    return list(dict.fromkeys(names))


__all__ = ["MODES", "ActiveMode", "ModeNotActive", "ModeSpec", "get_mode", "parse_modes"]
