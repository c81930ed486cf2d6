"""The files a command writes, checked before anything runs: writable, and not a file the user named that
would be overwritten without --force."""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Sequence

from h3bench.harness.commands import BadInput


def check_writable(path: Path) -> None:
    if path.exists() and path.is_dir():
        raise BadInput(f"--out {path}: is a directory")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".h3bench-probe-"):
            pass
    except OSError as exc:
        raise BadInput(f"--out {path}: cannot write there ({exc.strerror or exc})") from None


def refuse_overwrite(paths: Sequence[Path], force: bool, flag: str) -> None:
    """Files the user pointed an output option at are not overwritten silently: without --force it is an
    error (a default path is timestamped and never collides). `report`, `compare` and `merge` use it too."""
    existing = [str(p) for p in paths if Path(p).is_file()]
    if existing and not force:
        raise BadInput(f"{flag}: {', '.join(existing)} {'exists' if len(existing) == 1 else 'exist'}; "
                       f"pass --force to overwrite")
