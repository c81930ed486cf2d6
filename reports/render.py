"""Every report artifact of one evidence file: <name>.md, <name>.html and three PNGs, next to the JSON."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Optional, Union

from h3bench.harness import schema
from h3bench.reports import plots, table
from h3bench.reports.index import write_index

PLOTS = (("latency", "Latency per implementation", plots.plot_latency),
         ("accuracy", "Relative error per implementation", plots.plot_accuracy),
         ("verdicts", "Batch-invariance verdicts", plots.plot_verdicts))


def _write_png(draw, evidence: schema.Evidence, path: Path) -> Path:
    # Draw into a temporary name and rename, like schema.save: a watcher never sees half a PNG.
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".png", dir=path.parent)
    os.close(fd)
    try:
        draw(evidence, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def artifact_paths(evidence_path: Union[str, Path], out_dir: Optional[Union[str, Path]] = None,
                   csv: bool = False) -> list[Path]:
    """The files `render_all` (and with `csv` long_csv.write_csv) would write for one evidence file."""
    evidence_path = Path(evidence_path)
    out = Path(out_dir) if out_dir is not None else evidence_path.parent
    name = evidence_path.stem
    found = [out / f"{name}.md", out / f"{name}.html", *(out / f"{name}_{suffix}.png" for suffix, _, _ in PLOTS)]
    return found + ([out / f"{name}.csv"] if csv else [])


def render_all(evidence_path: Union[str, Path], out_dir: Optional[Union[str, Path]] = None,
               show_control: bool = False) -> list[Path]:
    """Write the Markdown, HTML and PNG report of one evidence file; returns the paths written. The negative
    control is not a row: its section is written only with `show_control`.

    The HTML inlines the PNGs (it must survive being mailed or uploaded alone); the Markdown links
    them by relative name, so keep the files together.
    """
    evidence_path = Path(evidence_path)
    if not evidence_path.exists():   # a folder goes on to schema.load, which names it
        raise FileNotFoundError(f"evidence file not found: {evidence_path}")
    evidence = schema.load(evidence_path)
    out = Path(out_dir) if out_dir is not None else evidence_path.parent
    out.mkdir(parents=True, exist_ok=True)
    name = evidence_path.stem
    pngs = {caption: _write_png(draw, evidence, out / f"{name}_{suffix}.png") for suffix, caption, draw in PLOTS}
    md = schema.write_atomic(out / f"{name}.md",
                             table.render_markdown(evidence, {c: p.name for c, p in pngs.items()}, show_control))
    page = schema.write_atomic(out / f"{name}.html",
                               table.render_html(evidence, {c: p.read_bytes() for c, p in pngs.items()}, show_control))
    paths = [md, page, *pngs.values()]
    for path in paths:
        # mkstemp (here and in schema.write_atomic) creates 0600; reports are meant to be shared.
        path.chmod(0o644)
    return paths


def render_run(paths: list[Path]) -> list[Path]:
    """The renderings a run writes: each evidence file's (`render_all`), and an index page beside them when
    the run wrote several."""
    written: list[Path] = []
    for path in paths:
        written += render_all(path)
    if len(paths) > 1:
        written += write_index(paths, Path(paths[0]).parent)
    return written
