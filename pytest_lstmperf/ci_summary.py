"""The speed gate's verdict for CI: Markdown for a GitHub Actions job summary and JUnit XML properties.

The gate builds one :class:`SummaryRow` per compared benchmark and a one-line headline (its verdict line), then:

- :func:`write_step_summary` appends :func:`markdown` to the file named by ``$GITHUB_STEP_SUMMARY`` (GitHub shows
  it on the run's summary page and, for a pull request, behind the failed check);
- :func:`junit_properties` gives name/value pairs to attach as ``<testsuite>`` properties of ``--junitxml``
  (:func:`add_junit_properties` attaches them, from a ``pytest_sessionfinish`` hook that runs before the
  junitxml plugin writes its file, i.e. ``@pytest.hookimpl(tryfirst=True)``).

Only the standard library is used here, so that the module can be imported and tested without the gate.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: the verdicts listed in the table; every other verdict is counted below it. ``inconclusive`` is listed:
#: it fails ``--benchmark-compare`` unless accepted, and an accepted one is still worth reading.
FAILING_VERDICTS: frozenset[str] = frozenset(
    {"regressed", "kernel-changed", "host-work-changed", "path-lost", "inconclusive"}
)

#: the environment variable GitHub Actions sets to the job's summary file
STEP_SUMMARY_ENV = "GITHUB_STEP_SUMMARY"

#: the prefix of every JUnit property name
PROPERTY_PREFIX = "lstmperf"


@dataclass(frozen=True)
class SummaryRow:
    """One benchmark's verdict as CI shows it.

    ``ratio``: now / baseline of the metric that decided (None where nothing was compared); ``limit``: the ratio
    at which it would fail (None where no threshold applied); ``kernel``: the kernel/precision that ran now, or
    ``"then -> now"`` when it changed; ``note``: one line of why (may be empty).
    """

    name: str
    verdict: str
    kernel: str
    ratio: float | None
    limit: float | None
    note: str

    def is_failing(self, failing: Collection[str] = FAILING_VERDICTS) -> bool:
        return self.verdict in failing


class StepSummaryError(Exception):
    """``$GITHUB_STEP_SUMMARY`` names a file that could not be written; ``str()`` says which file and why.

    Raised only by :func:`write_step_summary`, in place of the ``OSError`` behind it (kept as ``__cause__``),
    so that a caller catches exactly this and prints it: a job summary that could not be written must never
    turn into a crash at the end of a run.
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"could not write the job summary to ${STEP_SUMMARY_ENV}={path}: {reason}")
        self.path = path
        self.reason = reason


def _cell(value: str) -> str:
    """A Markdown table cell: pipes escaped, line breaks folded, never empty."""
    text = " ".join(str(value).split())
    return text.replace("\\", "\\\\").replace("|", "\\|") or "-"


def _ratio(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:.3f}x"


def _counts(rows: Sequence[SummaryRow]) -> str:
    """``3 unchanged, 1 improved``: verdicts by count, most frequent first, ties by name."""
    counts = Counter(row.verdict for row in rows)
    return ", ".join(f"{n} {verdict}" for verdict, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def markdown(rows: Sequence[SummaryRow], headline: str, *, failing: Collection[str] = FAILING_VERDICTS) -> str:
    """The verdict as a GitHub-flavoured Markdown section: a heading, the headline, a table of the failing rows
    (verdicts in ``failing``, in the order given), then one line counting the other rows by verdict.

    Cells have ``|`` escaped and line breaks folded, so a benchmark name or a note cannot break the table.
    """
    bad = [row for row in rows if row.is_failing(failing)]
    others = [row for row in rows if not row.is_failing(failing)]
    lines = ["### lstmperf speed gate", "", " ".join(headline.split()) or "-", ""]
    if bad:
        lines += [
            "| benchmark | verdict | kernel | now / baseline | fails at | note |",
            "|---|---|---|---:|---:|---|",
        ]
        lines += [
            f"| {_cell(r.name)} | {_cell(r.verdict)} | {_cell(r.kernel)} | {_ratio(r.ratio)} | {_ratio(r.limit)} "
            f"| {_cell(r.note)} |"
            for r in bad
        ]
        lines.append("")
    if others:
        noun = "other benchmark" if bad else "benchmark"
        lines.append(f"{len(others)} {noun}{'s' if len(others) != 1 else ''}: {_counts(others)}.")
    elif not bad:
        lines.append("No benchmark was compared.")
    return "\n".join(lines) + "\n"


def write_step_summary(
    rows: Sequence[SummaryRow],
    headline: str,
    environ: Mapping[str, str] = os.environ,
) -> Path | None:
    """Append :func:`markdown` to the file named by ``$GITHUB_STEP_SUMMARY`` and return that file's path.

    Returns None, writing nothing, when the variable is unset or empty (not running under GitHub Actions).
    Raises :class:`StepSummaryError` (and no other exception) when the file cannot be written: a missing folder,
    no permission, a full disk. The caller prints it and goes on; the gate's verdict does not depend on it.
    """
    target = environ.get(STEP_SUMMARY_ENV, "")
    if not target:
        return None
    text = markdown(rows, headline)
    path = Path(target)
    try:
        with path.open("a", encoding="utf-8") as handle:
            handle.write(("\n" if _needs_separator(path) else "") + text)
    except OSError as exc:
        raise StepSummaryError(target, exc.strerror or str(exc)) from exc
    return path


def _needs_separator(path: Path) -> bool:
    """A file that already holds text not ending in a blank line gets one before the section."""
    try:
        size = path.stat().st_size
        if size == 0:
            return False
        with path.open("rb") as handle:
            handle.seek(max(size - 2, 0))
            return not handle.read().endswith(b"\n\n")
    except OSError:
        return False


def junit_properties(
    rows: Sequence[SummaryRow], headline: str, *, failing: Collection[str] = FAILING_VERDICTS
) -> list[tuple[str, str]]:
    """Name/value pairs for the ``<testsuite>`` properties of a JUnit XML report.

    ``lstmperf.gate``: the headline; ``lstmperf.gate.failed``: how many rows failed; ``lstmperf.gate.compared``:
    how many rows there are; ``lstmperf.gate.<verdict>``: the count of each verdict seen; then one
    ``lstmperf.gate.failed.<benchmark>`` per failing row, in the order given, whose value reads
    ``regressed: kernel cudnn/fp32, 1.450x (fails at 1.100x); note``.
    """
    bad = [row for row in rows if row.is_failing(failing)]
    pairs = [
        (f"{PROPERTY_PREFIX}.gate", " ".join(headline.split())),
        (f"{PROPERTY_PREFIX}.gate.failed", str(len(bad))),
        (f"{PROPERTY_PREFIX}.gate.compared", str(len(rows))),
    ]
    counts = Counter(row.verdict for row in rows)
    pairs += [(f"{PROPERTY_PREFIX}.gate.{verdict}", str(n)) for verdict, n in sorted(counts.items())]
    for row in bad:
        value = f"{row.verdict}: kernel {row.kernel or '-'}, {_ratio(row.ratio)}"
        if row.limit is not None:
            value += f" (fails at {_ratio(row.limit)})"
        note = " ".join(row.note.split())
        pairs.append((f"{PROPERTY_PREFIX}.gate.failed.{row.name}", f"{value}; {note}" if note else value))
    return pairs


def add_junit_properties(config: Any, pairs: Sequence[tuple[str, str]]) -> bool:
    """Attach ``pairs`` to the ``<testsuite>`` of ``--junitxml``; False when no JUnit report is being written.

    Call it from a ``pytest_sessionfinish`` hook marked ``tryfirst=True``: pytest's junitxml plugin writes its
    file in its own ``pytest_sessionfinish``. (This uses the stash key of pytest's junitxml plugin, the same
    object the ``record_testsuite_property`` fixture writes to.)
    """
    try:
        from _pytest.junitxml import xml_key
    except ImportError:  # a pytest without the junitxml plugin's stash key
        return False
    xml = config.stash.get(xml_key, None)
    if xml is None:
        return False
    for name, value in pairs:
        xml.add_global_property(name, value)
    return True
