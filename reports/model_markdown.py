"""The model evidence file (harness/model_schema.py) as Markdown: the verdict per mode and check, the
origins table (module, op, phase, shapes, rows, ULP), which origins each mode removes against plain, the
op audit lines, and the compiled model's verdict at N, N/2, ..., 1."""
from __future__ import annotations

from pathlib import Path

from h3bench.harness.model_schema import ModeResult, ModelEvidence, from_json
from h3bench.harness.schema import UnavailableMode, read_json, write_atomic


def _shape(shapes) -> str:
    return "; ".join(f"[{' x '.join(map(str, t.shape))}] {t.dtype}" for t in shapes) or "-"


def _key(o) -> tuple:
    return (o.search, o.phase, o.op, o.module_type)


def _rows(rows: list[int]) -> str:
    return ", ".join(map(str, rows[:6])) + (f" ... ({len(rows)})" if len(rows) > 6 else "")


def _origins(result: ModeResult) -> list[str]:
    if not result.origins:
        return ["No origin." if result.invariant else "No origin found: " + "; ".join(
            s.note or s.streams.get("forward", "") for s in result.localisations)]
    lines = ["| # | search | phase | module | op | inputs | outputs | rows | max ULP | times |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for i, o in enumerate(result.origins, 1):
        op = o.op or f"none ({o.reason})"
        if o.backward_op and o.backward_op != o.op:
            op += f" (backward: {o.backward_op})"
        ulp = "-" if o.max_ulp is None else "NaN on one side" if o.max_ulp < 0 else str(o.max_ulp)
        lines.append(f"| {i} | {o.search} | {o.phase} | `{o.module or '(model)'}` ({o.module_type}) | `{op}` | "
                     f"{_shape(o.inputs)} | {_shape(o.outputs)} | {_rows(o.rows)} | {ulp} | {o.count} |")
    return lines


def render_markdown(evidence: ModelEvidence) -> str:
    out = [f"# {evidence.model_type}: batch invariance, module by module", "",
           f"`{evidence.model}` on {evidence.device}, {evidence.plan} plan"
           + (f", {evidence.dtype}" if evidence.dtype else "") + f"; per-row inputs: {', '.join(evidence.per_row)}; "
           f"{evidence.parameters} parameter gradients checked for repeating.", ""]
    if evidence.command:
        out += [f"Command: `{evidence.command}`", ""]
    plain = evidence.modes.get("plain")
    for mode, result in evidence.modes.items():
        out += [f"## Mode `{mode}`", ""]
        if isinstance(result, UnavailableMode):
            out += [f"Unavailable: {result.unavailable}", ""]
            continue
        out += [f"**{'batch-invariant' if result.invariant else 'not batch-invariant'}** ({result.seconds:.1f} s)", "",
                "| check | compared | differ |", "|---|---|---|"]
        out += [f"| {name} | {c.compared} {c.unit} | {c.differ} |" for name, c in result.counts.items()]
        out += ["", *(f"- {f}" for f in result.failures), "", "### Origins", "", *_origins(result), ""]
        for s in result.localisations:
            out.append(f"- search `{s.search}` on `{s.check}` (seed {s.seed}, batch {s.batch}, rows "
                       f"{_rows(s.compared_rows)} against {s.other_rows}): {s.runs} runs, {s.seconds:.2f} s; ops "
                       f"{s.ops}, inherited {s.inherited_ops}, unmapped {s.unmapped_ops}; streams {s.streams}"
                       + (f"; {s.note}" if s.note else ""))
        if mode != "plain" and isinstance(plain, ModeResult):
            removed = {_key(o) for o in plain.origins} - {_key(o) for o in result.origins}
            out += ["", f"Against plain, this mode removes {len(removed)} of {len(plain.origins)} origin(s)"
                    + (": " + "; ".join(f"{p} {op} in {m}" for _, p, op, m in sorted(removed, key=str)) if removed else ".")]
        if result.audits:
            out += ["", "### Audit the origin ops", ""]
            out += [f"- {f'`{a.origin_op}`' if a.origin_op else 'the module'} ({a.module_type}) -> `{a.builtin_op}`: "
                    f"`{a.command}`" for a in result.audits]
        out.append("")
    c = evidence.compiled
    if c is not None:
        out += [f"## Compiled (`{c.mode}`)", ""]
        if c.unavailable:
            out += [f"Unavailable: {c.unavailable}", ""]
        else:
            out += ["| rows | compiled differs from N | eager differs from N | max ULP |", "|---|---|---|---|"]
            out += [f"| {b.batch} | {b.differ} | {b.eager_differ} | {'-' if b.max_ulp is None else b.max_ulp} |"
                    for b in c.batches]
            out += ["", c.inside_graph or "", "", f"Kernels in the compiled graph: {', '.join(c.kernels or []) or '-'}", ""]
    return "\n".join(out)


def write_markdown(path: Path) -> list[Path]:
    """`<file>.md` beside the model evidence file."""
    md = Path(path).with_suffix(".md")
    write_atomic(md, render_markdown(from_json(read_json(path))))
    return [md]
