"""Where torch.compile keeps what it compiled, for h3bench's program.

Inductor's caches (the FX graphs, AOTAutograd's, the autotuning results of max-autotune) live under
TORCHINDUCTOR_CACHE_DIR, by default a folder in the system's temporary directory that a reboot or a tmp
cleaner empties; then every torch.compile row compiles cold again, max-autotune's most of all. The program
(not an import: a library must not move a user's caches) points it at a folder that outlasts the run, so
only a machine's first run pays: H3BENCH_CACHE_DIR/inductor, else XDG_CACHE_HOME/h3bench/inductor, else
~/.cache/h3bench/inductor. A TORCHINDUCTOR_CACHE_DIR the user set is kept. Triton's own kernel cache
(~/.triton/cache) already outlasts a run.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import MutableMapping

INDUCTOR_VARIABLE = "TORCHINDUCTOR_CACHE_DIR"
FOLDER_VARIABLE = "H3BENCH_CACHE_DIR"


def persistent_folder(environ: MutableMapping[str, str]) -> Path:
    """The folder Inductor's caches go to when the user named none."""
    if environ.get(FOLDER_VARIABLE):
        return Path(environ[FOLDER_VARIABLE]).expanduser() / "inductor"
    base = Path(environ["XDG_CACHE_HOME"]).expanduser() if environ.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "h3bench" / "inductor"


def keep_inductor_caches(environ: MutableMapping[str, str] = os.environ) -> str:
    """Point Inductor's caches at `persistent_folder` unless the user set TORCHINDUCTOR_CACHE_DIR; returns
    the folder in use. A child process inherits it."""
    if not environ.get(INDUCTOR_VARIABLE):
        environ[INDUCTOR_VARIABLE] = str(persistent_folder(environ))
    return environ[INDUCTOR_VARIABLE]
