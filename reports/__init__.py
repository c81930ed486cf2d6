"""Reports from evidence files: tables, plots, comparison of two runs, merging of partial runs.

Everything here reads evidence through `harness.schema` and renders from the typed model; nothing
parses a rendered table back.
"""
