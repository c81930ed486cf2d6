"""The files a command writes. Before anything runs, each path is checked: writable (in the nearest folder
that exists, making none) and not a file the user named that would be overwritten without --force. While a
run goes, `RunOutputs` makes the folders it needs and, when the run is interrupted or fails, takes back what
it made for the ops it did not finish: their evidence files and library logs, and the folders it made, once
empty. A file or folder that was there before the run stays."""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Optional, Sequence

from h3bench.harness.commands import BadInput


def check_writable(path: Path) -> None:
    if path.is_dir():
        raise BadInput(f"--out {path}: is a directory")
    folder = next((p for p in (path.parent, *path.parent.parents) if p.exists()), Path("."))
    if not folder.is_dir():
        raise BadInput(f"--out {path}: cannot write there ({folder} is a file, not a folder)")
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".h3bench-probe-"):
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


class RunOutputs:
    """The evidence paths of a run, one per op, in the order the ops run."""

    def __init__(self, paths: Sequence[Path]):
        from h3bench.harness.runner import library_log_path

        self.paths = [Path(p) for p in paths]
        self._files = {path: (path, library_log_path(path)) for path in self.paths}
        self._there_before = {f for files in self._files.values() for f in files if f.exists()}
        self._made: list[Path] = []     # folders this run made, outermost first
        self.finished: list[Path] = []  # evidence written whole
        self.current: Optional[Path] = None

    def make_folders(self) -> None:
        for path in self.paths:
            for folder in reversed([p for p in (path.parent, *path.parent.parents) if not p.exists()]):
                try:
                    folder.mkdir()
                except FileExistsError:  # made meanwhile by another process: not ours to take back
                    continue
                self._made.append(folder)

    def finish(self, path: Path) -> None:
        self.finished.append(Path(path))

    @property
    def unfinished(self) -> list[Path]:
        return [p for p in self.paths if p not in self.finished]

    def take_back(self) -> None:
        """Remove what the run made for the ops it did not finish, then the folders it made that are empty."""
        for path in self.unfinished:
            for made in self._files[path]:
                if made not in self._there_before:
                    made.unlink(missing_ok=True)
        for folder in reversed(self._made):
            try:
                folder.rmdir()
            except OSError:  # not empty: a finished op's files, or another's
                pass
