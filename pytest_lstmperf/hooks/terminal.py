"""The run's report on the terminal: the sections of :class:`~..run_report.RunReport` as they are built, printed with
their markup (the ``lstmperf speed`` section after every other summary, its verdict last)."""

from __future__ import annotations

from typing import Any

from ..run_report import Line


def print_lines(tr: Any, lines: tuple[Line, ...] | tuple[str, ...]) -> None:
    for line in lines:
        if isinstance(line, Line):
            tr.write_line(line.text, **line.style)
        else:
            tr.write_line(line)


def print_speed_section(tr: Any, lines: tuple[Line, ...]) -> None:
    """The ``lstmperf speed`` section, where the report has one."""
    if not lines:
        return
    tr.section("lstmperf speed", sep="=", bold=True)
    print_lines(tr, lines)
