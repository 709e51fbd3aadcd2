"""The baseline store: a run's records saved into the hardware's baseline file (``--lstmperf-save-baseline``
entries the file lacks, ``--lstmperf-update-baseline`` replacing them, ``--lstmperf-add-baseline-run`` one more
recording run, judged against the runs before it by the gate's rule), and the file a compare reads. The file
itself (its entries, reading, atomic writes and locking) is :mod:`.baseline_file`, its JSON, format and
migration :mod:`.records`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..device import hardware_key
from ..options import THRESHOLD
from .baseline_file import (
    BROKEN_SUFFIX,
    Baseline,
    BaselineError,
    atomic_write,
    bench_entry,
    differences,
    hint,
    history_point,
    load,
    locked,
    old_format,
    reference_of,
)
from .policy import (
    OUTLIER_FACTOR,
    Blind,
    Check,
    Reference,
    RunFigures,
    check,
    decide,
    metrics_of,
    pooled,
    recording_runs,
)
from .records import (
    BaselineDocument,
    BaselineEntry,
    BaselineSection,
    BenchRecord,
    Header,
    JSONObject,
    date_of,
    recorded_of,
)


@dataclass
class SaveReport:
    path: Path
    created: list[str] = field(default_factory=list)  # entries new to the file
    updated: list[str] = field(default_factory=list)  # entries replaced (update mode)
    #: entries an update found unchanged, which keep their earlier sittings beside this one (update mode)
    sittings: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # entries present and left alone (save mode)
    untouched: int = 0  # entries of the file this run did not measure
    new_file: bool = False
    broken: Path | None = None  # where an unreadable file this run replaced was kept
    migrated: Path | None = None  # the format-1 file this one was read from
    refused: list[str] = field(default_factory=list)  # recording runs not added (another version, a broken run)
    left_out: list[str] = field(default_factory=list)  # recording processes left out of an entry (broke)
    outliers: list[str] = field(default_factory=list)  # recording runs added outside the runs before them
    #: benchmarks no compare will see a 1.5x slowdown on (their processes, or their sittings, lie too far apart)
    blind: dict[str, Blind] = field(default_factory=dict)
    #: ... with as many processes as a compare takes at the run's resolution goal (policy.compare_processes)
    compare_processes: int = 4
    added_run: bool = False  # --lstmperf-add-baseline-run: recording runs added, no entry replaced
    entries: dict[str, BaselineEntry] = field(default_factory=dict)  # the file's entries as written

    def describe(self) -> str:
        parts = []
        if self.created:
            parts.append(f"{len(self.created)} recorded")
        if self.updated:
            parts.append(f"{len(self.updated)} updated")
        if self.sittings:
            parts.append(
                f"{len(self.sittings)} of them unchanged by the rule, which keep their earlier recording beside this "
                "one (how far recordings made at different times lie apart is measured from them)"
            )
        if self.kept:
            parts.append(f"{len(self.kept)} kept (already in the baseline; --lstmperf-update-baseline replaces them)")
        if self.untouched:
            parts.append(f"{self.untouched} not measured in this run, left as they were")
        what = "created" if self.new_file else "written"
        if self.added_run:
            parts = [f"a recording run added to {len(self.updated)} benchmark(s)"]
            if self.outliers:
                parts.append(
                    f"{len(self.outliers)} of them outside the limits of the runs before (their resolution widens)"
                )
            if self.refused:
                parts.append(
                    f"refused for {len(self.refused)} (a figure more than twice the others', or other versions)"
                )
            if self.kept:
                parts.append(f"{len(self.kept)} not in the baseline (record them with --lstmperf-save-baseline)")
        if not self.created and not self.updated:
            what = "unchanged"
        if self.left_out:
            parts.append(
                f"{len(self.left_out)} recording process(es) left out of their entry (a figure more than twice "
                "the other processes')"
            )
        text = f"baseline {self.path} {what}: " + (", ".join(parts) or "nothing to record")
        if self.migrated is not None:
            text += f" (migrated from the format-1 file {self.migrated.name}, left in place: delete it)"
        if self.broken is not None:
            text += f" (replaced an unreadable file, kept as {self.broken})"
        return text


class BaselineStore:
    """The baselines folder: one file per hardware (GPU model, or CPU model and threads)."""

    def __init__(self, directory: Path | str, record_hint: str = "") -> None:
        self.directory = Path(directory)
        self.record_hint = record_hint

    def path_for(self, fields: Mapping[str, str]) -> Path:
        return self.directory / f"{hardware_key(fields)}.json"

    def find(self, fields: Mapping[str, str]) -> Baseline | None:
        """This hardware's baseline (a format-1 file of the same hardware, read as the current format, where
        no current one exists), or None when there is none; a broken file raises BaselineError."""
        path = self.path_for(fields)
        if not path.exists():
            return self._older(fields)
        baseline = load(path, self.record_hint)
        diff = differences(baseline.fields, dict(fields))
        if diff:  # a renamed or hand-copied file
            raise BaselineError(f"baseline {path} is for other hardware: {'; '.join(diff)}")
        return baseline

    def _older(self, fields: Mapping[str, str]) -> Baseline | None:
        """The newest format-1 file of this hardware, migrated in memory."""
        if not self.directory.is_dir():
            return None
        found = []
        for candidate in sorted(self.directory.glob("*.json")):
            if old_format(candidate) != 1:
                continue
            try:
                old = load(candidate, self.record_hint)
            except BaselineError:
                continue
            if not differences(old.fields, dict(fields)):
                found.append((old.document.section.updated_date, candidate.name, old))
        return max(found, key=lambda item: item[:2])[2] if found else None

    def others(self, fields: Mapping[str, str]) -> list[tuple[Path, list[str]]]:
        """The other hardware's baselines of the same kind, each with what differs (closest first)."""
        found: list[tuple[Path, list[str]]] = []
        if not self.directory.is_dir():
            return found
        for path in sorted(self.directory.glob("*.json")):
            try:
                other = load(path)
            except BaselineError:
                continue
            if other.fields.get("kind") != fields.get("kind"):
                continue
            diff = differences(other.fields, dict(fields))
            if diff:
                found.append((path, diff))
        return sorted(found, key=lambda item: len(item[1]))

    def missing_message(self, fields: Mapping[str, str]) -> str:
        path = self.path_for(fields)
        where = "" if self.directory.is_dir() else f" (the folder {self.directory} does not exist)"
        text = f"no baseline for this hardware: {path} is missing{where}."
        closest = self.others(fields)
        if closest:
            other, diff = closest[0]
            text += f" The closest, {other.name}, is of other hardware ({'; '.join(diff)}): not comparable."
        return text + hint(self.record_hint)

    def check_writable(self, fields: Mapping[str, str]) -> None:
        """Before any test runs: the baseline this run would record can be written (the folder exists or can be
        made, is writable; an existing file is readable). Raises :class:`BaselineError` naming what is wrong."""
        path = self.path_for(fields)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BaselineError(
                f"cannot record: the baseline folder {self.directory} cannot be made: {exc.strerror or exc}. "
                f"Record into another folder with --lstmperf-baselines=DIR."
            ) from None
        if not os.access(self.directory, os.W_OK | os.X_OK):
            raise BaselineError(
                f"cannot record: the baseline folder {self.directory} is not writable. Make it writable, or record "
                f"into another folder with --lstmperf-baselines=DIR."
            )
        if path.exists() and not os.access(path, os.R_OK):
            raise BaselineError(f"cannot record: the baseline {path} is not readable.")

    def save(
        self,
        records: Iterable[BenchRecord],
        *,
        fields: Mapping[str, str],
        fingerprint: Mapping[str, str],
        versions: Mapping[str, str],
        provenance: JSONObject,
        header: Header,
        update: bool,
        add_run: bool = False,
        threshold: float | None = None,
        siblings: Mapping[str, list[BenchRecord]] | None = None,
    ) -> SaveReport:
        """Merge ``records`` into this hardware's file under the lock and write it atomically.

        Without ``update`` entries already in the file are kept (never overwritten), except those that have no
        figures yet (migrated from format 1), which this run fills; with it they are replaced, their figures
        kept in their history when ``versions`` differ from theirs, and so is a file that cannot be read as a
        baseline (kept beside as ``<name>.broken``). With ``add_run`` no entry is replaced: each measured entry
        gains this run's figures as one more recording run: a run outside the entry's limit (the gate's own
        :func:`~.policy.check` at ``threshold``) is added and named (clean runs lie that far apart here, and the
        entry's resolution takes it in), a run more than :data:`~.policy.OUTLIER_FACTOR` from the entry's figure
        (a run that broke) or of other software versions is refused and named. Entries not measured in this run
        stay. ``siblings`` holds, per benchmark, its records from the other recording processes of this
        recording (:mod:`.recording`): every entry written or run added takes their figures too. A file-system
        error is a :class:`BaselineError` naming the path and the cause; the previous file is
        then untouched.
        """
        path = self.path_for(fields)
        try:
            with locked(self.directory):
                existing, report = self._existing(path, fields, update)
                siblings = siblings or {}
                if add_run:
                    sitting = date_of(provenance) or ""
                    self._add_run(existing, path, list(records), versions, threshold, report, siblings, sitting)
                else:
                    self._save(existing, list(records), versions, provenance, update, report, siblings)
                if not report.created and not report.updated:
                    return report
                section = BaselineSection(
                    hardware=dict(fields),
                    fingerprint=dict(fingerprint),
                    created=existing.section.created if existing is not None else dict(provenance),
                    updated=dict(provenance),
                )
                if existing is not None:  # this run's header, the file's where this run has none
                    header = Header(
                        header.machine_info or existing.header.machine_info,
                        header.commit_info or existing.header.commit_info,
                        header.version or existing.header.version,
                    )
                out = BaselineDocument(section, report.entries, header, date_of(provenance))
                atomic_write(path, out.dumps())
                return report
        except OSError as exc:
            where = exc.filename or path
            raise BaselineError(
                f"not recording: cannot write the baseline {path}: {exc.strerror or exc} ({where}). Make the "
                f"folder writable, or record into another folder with --lstmperf-baselines=DIR."
            ) from None

    def _existing(
        self, path: Path, fields: Mapping[str, str], update: bool
    ) -> tuple[BaselineDocument | None, SaveReport]:
        """The file's current content (a format-1 file of this hardware where no current one exists); a broken
        file is an error, or (``update``) moved aside."""
        report = SaveReport(path)
        if not path.exists():
            older = self._older(fields)
            if older is not None:
                report.migrated = older.path
            data = older.document if older is not None else None
        else:
            try:
                data = load(path, self.record_hint).document
            except BaselineError as exc:
                if not update:
                    raise BaselineError(f"not recording: {exc}") from None
                report.broken = path.with_name(path.name + BROKEN_SUFFIX)
                os.replace(path, report.broken)
                data = None
        if data is not None:
            diff = differences(data.section.hardware, dict(fields))
            if diff:
                raise BaselineError(f"not recording: {path} is for other hardware: {'; '.join(diff)}")
            report.entries = dict(data.entries)
        report.new_file = data is None
        return data, report

    def _save(
        self,
        existing: BaselineDocument | None,
        records: list[BenchRecord],
        versions: Mapping[str, str],
        provenance: JSONObject,
        update: bool,
        report: SaveReport,
        siblings: Mapping[str, list[BenchRecord]],
    ) -> None:
        recorded = recorded_of(provenance)
        entries = report.entries
        references = pooled({name: reference_of(entry) for name, entry in entries.items()}) if update else {}
        for record in records:
            name = record.fullname
            old = entries.get(name)
            empty = old is not None and not any((r.per_call or r.device) for r in old.lstmperf.runs)
            if old is not None and not update and not empty:
                report.kept.append(name)
                continue
            (report.updated if old is not None else report.created).append(name)
            entry = bench_entry(record, recorded, versions, siblings.get(name, ()))
            report.left_out += [f"{name}: {why}" for why in entry.lstmperf.left_out]
            if old is not None:
                history = list(old.lstmperf.history)
                if not empty and dict(old.lstmperf.versions) != dict(versions):
                    history.append(history_point(old))
                entry = replace(entry, part=replace(entry.lstmperf, history=tuple(history)))
                if not empty and _unchanged(old, entry, references.get(name), record, siblings.get(name, ())):
                    entry = replace(entry, part=replace(entry.lstmperf, runs=_kept_sittings(old, entry)))
                    report.sittings.append(name)
            entries[name] = entry
        report.untouched = len(set(entries) - {r.fullname for r in records})

    def _add_run(
        self,
        existing: BaselineDocument | None,
        path: Path,
        records: list[BenchRecord],
        versions: Mapping[str, str],
        threshold: float | None,
        report: SaveReport,
        siblings: Mapping[str, list[BenchRecord]],
        sitting: str = "",
    ) -> None:

        if existing is None:
            raise BaselineError(
                f"not recording: --lstmperf-add-baseline-run adds to a recorded baseline and {path} does not "
                f"exist; record it first with --lstmperf-save-baseline"
            )
        report.added_run = True
        references = pooled({name: reference_of(entry) for name, entry in report.entries.items()})
        for record in records:
            name = record.fullname
            entry = report.entries.get(name)
            if entry is None:
                report.kept.append(name)  # not in the baseline: nothing to add to
                continue
            part = entry.lstmperf
            if dict(part.versions) != dict(versions):
                report.refused.append(f"{name}: recorded with other versions; record it anew")
                continue
            measured = record.measurement()
            reference = references[name]
            limit = measured.threshold or threshold or THRESHOLD
            runs, left_out = recording_runs([measured, *(r.measurement() for r in siblings.get(name, ()))])
            runs = [replace(run, sitting=sitting) for run in runs]  # a sitting of its own
            report.left_out += [f"{name}: {why}" for why in left_out]
            added: list[RunFigures] = []
            refused: list[str] = []
            for run in runs:
                checks = []
                for m in metrics_of(reference, measured.first):
                    variant = reference.variant(m)
                    figure = run.get(m, variant)
                    value = reference.value(m, variant)
                    if figure is not None and value:
                        checks.append(
                            (
                                m,
                                figure.value / value,
                                check(m, measured.first.samples(m, variant), reference, limit, variant),
                            )
                        )
                broken = [f"{m}: {r:.3f}x" for m, r, _ in checks if not 1 / OUTLIER_FACTOR <= r <= OUTLIER_FACTOR]
                if broken:  # a run more than twice as slow or fast as the entry's figure broke: refused, said
                    refused.append("; ".join(broken))
                    continue
                added.append(run)
            if refused:  # one line per benchmark, however many of its processes were refused
                count = f" ({len(refused)} of {len(runs)} processes)" if len(runs) > 1 else ""
                report.refused.append(f"{name}: more than {OUTLIER_FACTOR}x off{count}: {refused[0]}")
            outside = []
            for m, r, c in checks if runs else []:
                bound = c.limit or limit  # no spread known yet: the threshold
                if not 1 / bound <= r <= bound:
                    outside.append(c.text() if c.ratio is not None else f"{m}: {r:.3f}x (limit {bound:.3f})")
            if added and outside:  # added: clean runs lie this far apart here, and the resolution says so
                report.outliers.append(f"{name}: {'; '.join(outside)}")
            if added:
                report.entries[name] = replace(entry, part=replace(part, runs=(*part.runs, *added)))
                report.updated.append(name)
        report.untouched = len(set(report.entries) - set(report.updated))


#: the sittings (recording commands at different times) an entry keeps at most: an update that finds an entry
#: unchanged keeps its earlier ones beside its own, the oldest dropped first
SITTINGS_KEPT = 3


def _unchanged(
    old: BaselineEntry,
    new: BaselineEntry,
    reference: Reference | None,
    record: BenchRecord,
    siblings: Iterable[BenchRecord],
) -> bool:
    """Whether an update's recording of a benchmark is the same benchmark as its entry's, timed at another time:
    the same software versions and kernel, and every figure judged unchanged by the rule against the entry
    (:func:`~.policy.decide`, this recording's processes as a compare's), or inconclusive only because the
    entry's own processes and sittings blind it (:attr:`~.policy.Check.settled_by_baseline`), within its limit:
    nothing says it changed, and the sittings that measured how far it moves stay (replaced, the next compares
    would assume 1.5% for a benchmark whose recordings lay 30% apart). Only then are the entry's earlier sittings
    kept: an intended change, or an upgrade, replaces them."""
    if reference is None or dict(old.lstmperf.versions) != dict(new.lstmperf.versions):
        return False
    if old.lstmperf.kernel != new.lstmperf.kernel:
        return False
    decision = decide(record.measurement(), reference, more=[r.measurement() for r in siblings])

    def same(c: Check) -> bool:
        if c.verdict == "unchanged":
            return True
        blinded = c.verdict == "inconclusive" and c.settled_by_baseline
        return blinded and c.ratio is not None and c.limit is not None and 1 / c.limit <= c.ratio <= c.limit

    return decision.verdict in ("unchanged", "inconclusive") and all(same(c) for c in decision.checks)


def _kept_sittings(old: BaselineEntry, new: BaselineEntry) -> tuple[RunFigures, ...]:
    """The entry's processes with the update's: its earlier sittings (an untagged process keeps the entry's
    recording date as its sitting) and the update's own, at most :data:`SITTINGS_KEPT` sittings, newest kept."""
    earlier = tuple(replace(r, sitting=r.sitting or old.recorded_date or "") for r in old.lstmperf.runs)
    runs = (*earlier, *new.lstmperf.runs)
    keep = sorted({r.sitting for r in runs})[-SITTINGS_KEPT:]
    return tuple(r for r in runs if r.sitting in keep)
