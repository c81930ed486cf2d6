"""A rendered table as data: its cells and its spec, shared by the Markdown and HTML renderers
(reports/table.py) and every section that hands them a table (reports/control_section.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class Cell:
    text: str
    cls: str = ""  # CSS class: "num", "yes", "no", "na", "" (text)


@dataclass
class TableSpec:
    title: str
    headers: list[str]
    rows: list[list[Cell]]
    groups: Optional[list[tuple[str, int]]] = None  # spanning header labels over `headers`
    note: str = ""
    beside: bool = False  # narrow table: HTML places consecutive `beside` tables side by side
