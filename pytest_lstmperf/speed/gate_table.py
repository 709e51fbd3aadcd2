"""The speed gate's verdict table: one row per benchmark decision, as the terminal and the report show it.

The gate's rule (:mod:`.policy`) decides; this module only presents its decisions: the columns
(:data:`TABLE_HEADER`), the cells of each decision (:func:`table_rows`: time per call, each metric's ratio and
resolution, kernels, verdict) and the terminal's aligned text (:func:`format_table`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..meters import format_seconds
from .policy import Decision

TABLE_HEADER = ("test", "per call", "ratio", "device ratio", "resolves", "kernel then", "kernel now", "verdict")


def table_rows(decisions: Sequence[Decision]) -> list[tuple[str, ...]]:
    """One row of cells per decision, under :data:`TABLE_HEADER`: test, per call now, each metric's ratio and
    resolution, kernels, verdict (the terminal's table and the report's)."""
    rows: list[tuple[str, ...]] = []
    for d in decisions:
        per_call = next((c for c in d.checks if c.metric == "per-call"), None)
        device = next((c for c in d.checks if c.metric == "device"), None)
        resolves = [c.resolves for c in (per_call, device) if c is not None and c.resolves is not None]
        rows.append(
            (
                d.name,
                format_seconds(d.per_call_s),
                "-" if per_call is None or per_call.ratio is None else f"{per_call.ratio:.3f}",
                "-" if device is None or device.ratio is None else f"{device.ratio:.3f}",
                "/".join("none" if math.isinf(r) else f"{r:.2f}" for r in resolves) or "-",
                d.kernel_then or "-",
                d.kernel_now or "-",
                d.verdict,
            )
        )
    return rows


def format_table(decisions: Sequence[Decision]) -> list[str]:
    """Rows for the terminal: :func:`table_rows` under :data:`TABLE_HEADER`, in aligned columns."""
    header = TABLE_HEADER
    rows = [header, *table_rows(decisions)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines
