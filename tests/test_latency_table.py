"""tools/latency_table.py on fixtures: the graph figure joins a cell only where the file was graph-timed, and
the header says so."""
from __future__ import annotations

from tests.test_targets import evidence, row, size
from tools import latency_table


def test_graph_figures_join_each_cell_and_the_header():
    timed = size(100.0, fwd_graph_us=40.0, fwd_bwd_net_graph_us=90.0, fwd_bwd_net_us=300.0,
                 fwd_bwd_net_stream_us=250.0, fwd_stream_us=80.0)
    text = latency_table.table(evidence("gate_residual", {"ours": row({4097: timed})}), ["4097"])
    head, _, line = text.splitlines()
    assert "R=4097 fwd sync / stream / graph (floor)" in head
    assert "| 100.0 / 80.0 / 40.0 (90%) | 300.0 / 250.0 / 90.0 (90%) |" in line


def test_a_file_without_graph_figures_keeps_two_timings():
    text = latency_table.table(evidence("gate_residual", {"ours": row({4097: size(100.0)})}), ["4097"])
    head, _, line = text.splitlines()
    assert "graph" not in head and "| 100.0 / 100.0 (90%) |" in line
