"""Baselines keyed by hardware: one pytest-benchmark JSON file per GPU model (or CPU model and thread count).

A baseline file is what ``pytest --benchmark-json`` writes (``machine_info``, ``commit_info``,
``benchmarks`` with ``stats.data`` holding every sample, ``datetime``, ``version``), so pytest-benchmark's
``--benchmark-compare=FILE`` reads it as its own, plus a ``lstmperf``
section: the format version, the hardware fields that key it (GPU model and compute capability; CPU model
and threads), the full device fingerprint and the provenance (commit, machine, date, command) of the run
that created and of the run that last updated it. Each benchmark entry carries its own ``lstmperf`` part:
the software versions it was recorded with, its kernel, the figures of each recording run
(:class:`~.policy.RunFigures`) and the history of earlier versions' figures (for plots across releases).

The file name is derived from the hardware fields, so ``--benchmark-compare`` with no argument finds this
device's file, and a file of other hardware is refused with the differing fields named. A file of the
older format 1 (keyed by driver, CUDA, cuDNN and torch versions too) is read as this format: its entries
keep their kernel, host counters and versions, and their timings move to the history (they were taken
without the anchor, so they are not compared). The file's JSON, its format version and that migration are
:mod:`.records`' (the one reader and writer of records, entries and baseline files).

Writes are explicit, atomic (temporary file in the same folder, fsync, ``os.replace``), take the permissions
of the file they replace (or of the folder's other baselines) and are serialised by an exclusive ``flock`` on
the baselines folder itself (no lock file is left behind), so two processes recording at once neither lose
nor interleave entries and an interrupt leaves the previous file intact. A file that cannot be read as a
baseline is replaced only by ``--lstmperf-update-baseline``, and kept beside as ``<name>.broken``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from .benchmark_adapter import statistics as benchmark_statistics
from .policy import Reference, recording_runs
from .records import (
    FORMAT,
    Anchor,
    BaselineDocument,
    BaselineEntry,
    BenchRecord,
    EntryPart,
    FormatProblem,
    HistoryPoint,
    entry_stats,
    format_of,
    parse_baseline,
)

BROKEN_SUFFIX = ".broken"
LOCK_TIMEOUT_S = 120.0


class BaselineError(Exception):
    """A baseline that cannot be used or written; the message says why and what to do."""


def differences(baseline: Mapping[str, str], current: Mapping[str, str]) -> list[str]:
    """Human-readable differing fields: ``gpu NVIDIA A100 (baseline) vs NVIDIA H100 (this device)``. A baseline
    recorded before CPUs were keyed by family, model and stepping (no ``cpu_id``) matches on the rest."""
    out = []
    for name in dict.fromkeys([*baseline, *current]):
        then, now = baseline.get(name), current.get(name)
        if name == "cpu_id" and then is None:
            continue
        if then != now:
            out.append(
                f"{name} {then if then is not None else '<absent>'} (baseline) vs "
                f"{now if now is not None else '<absent>'} (this device)"
            )
    return out


# ------------------------------------------------------------------------------------------- entries
def bench_entry(
    record: BenchRecord,
    recorded: Mapping[str, object] | None = None,
    versions: Mapping[str, str] | None = None,
    siblings: Sequence[BenchRecord] = (),
) -> BaselineEntry:
    """One benchmark in pytest-benchmark's JSON layout, its statistics computed from the raw samples; with
    ``versions`` (a baseline's entry) also its ``lstmperf`` part: versions, kernel, the figures of each
    recording process (this one's and its ``siblings``', the same benchmark timed in independent processes;
    a process that broke is left out and named in ``left_out``, :func:`~.policy.recording_runs`).
    """
    data = [float(x) for x in record.data]
    if not data:
        raise ValueError(f"{record.fullname}: no samples")
    part = None
    if versions is not None:
        measured = record.measurement()
        runs, left_out = recording_runs([measured, *(r.measurement() for r in siblings)])
        sitting = str((recorded or {}).get("date") or "")  # when the recording command started: its sitting
        runs = [replace(run, sitting=sitting) for run in runs]
        part = EntryPart(dict(versions), measured.kernel, tuple(runs), (), tuple(left_out))
    return BaselineEntry(
        fullname=record.fullname,
        name=record.name,
        group=record.group,
        params=record.params,
        param=record.param,
        extra_info=dict(record.extra_info),
        options=dict(record.options),
        stats=entry_stats(benchmark_statistics(data), data, record.iterations),
        recorded=dict(recorded) if recorded is not None else None,
        part=part,
    )


def history_point(entry: BaselineEntry, date: str | None = None) -> HistoryPoint:
    """What an entry's figures were under its versions, kept when newer versions replace them."""
    part = entry.lstmperf
    reference = reference_of(entry)
    return HistoryPoint(
        versions=dict(part.versions),
        date=date or entry.recorded_date,
        kernel=part.kernel,
        per_call_s=_median(entry.samples),
        device_s=entry.device_time_s,
        per_call=reference.value("per-call"),
        device=reference.value("device"),
    )


def reference_of(entry: BaselineEntry) -> Reference:
    """The :class:`~.policy.Reference` of a baseline entry."""
    part = entry.lstmperf
    mode = entry.extra_info.get("mode")
    return Reference(
        name=entry.fullname,
        runs=part.runs,
        kernel=part.kernel,
        versions=dict(part.versions),
        mode=mode if isinstance(mode, str) else "",
        anchor_kind=Anchor.from_json(entry.extra_info.get("anchor")).kind,
    )


def _median(values: Sequence[float]) -> float | None:
    import statistics

    vals = [float(v) for v in values if v]
    return statistics.median(vals) if vals else None


# ------------------------------------------------------------------------------------------- files
@dataclass
class Baseline:
    """A loaded, validated baseline file."""

    path: Path
    document: BaselineDocument

    @property
    def fields(self) -> dict[str, str]:
        return dict(self.document.section.hardware)

    @property
    def migrated_from(self) -> int | None:
        """The older format this file was read from (in memory; writing it gives the current format)."""
        return self.document.section.migrated_from

    @property
    def benchmarks(self) -> Mapping[str, BaselineEntry]:
        """The file's entries by benchmark name."""
        return self.document.entries

    def samples(self, fullname: str) -> list[float]:
        return list(self.document.entries[fullname].samples)


def hint(record_hint: str) -> str:
    return f" Record one with: {record_hint}" if record_hint else ""


def replace_command(record_hint: str) -> str:
    """The recording command that replaces entries (and a broken file): ``--lstmperf-update-baseline``."""
    if "--lstmperf-save-baseline" in record_hint:
        return record_hint.replace("--lstmperf-save-baseline", "--lstmperf-update-baseline")
    return record_hint


def load(path: Path, record_hint: str = "") -> Baseline:
    """Read and validate one baseline file (:func:`.records.parse_baseline`); :class:`BaselineError` names the
    problem and the fix."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BaselineError(f"baseline {path} does not exist.{hint(record_hint)}") from None
    except IsADirectoryError:
        raise BaselineError(f"baseline {path} is a folder, not a file.{hint(record_hint)}") from None
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise BaselineError(f"baseline {path} cannot be read: {why}") from None
    restore = (
        f"{_git_restore(path)} Record it again, replacing it (the broken file is kept as {path.name}{BROKEN_SUFFIX})"
    )
    restore += f", with: {replace_command(record_hint)}" if record_hint else " with --lstmperf-update-baseline."
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        # a file cut short fails in its last token (a number, a literal or a string the cut ended, or at the end
        # itself); one with a damaged middle fails where the structure after the damage still follows
        cut = exc.msg.startswith("Unterminated string") or not re.search(r"[{}\[\],:]", text[exc.pos :])
        what = "truncated" if cut else "corrupt"
        raise BaselineError(
            f"baseline {path} is {what}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})." + restore
        ) from None
    try:
        return Baseline(path, parse_baseline(data))
    except FormatProblem as exc:
        then = {"restore": restore, "record": hint(record_hint)}.get(exc.then, "")
        raise BaselineError(exc.text.replace("{path}", str(path)) + then) from None


def _git_restore(path: Path) -> str:
    """`` Restore it with: git checkout -- PATH.`` where git tracks the file, else ``""``: the advice is given only
    where it works (a baseline recorded and never committed has no committed version to restore)."""
    import subprocess

    try:
        done = subprocess.run(
            ["git", "ls-files", "--error-unmatch", path.name], cwd=path.parent, capture_output=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return f" Restore the committed version with: git checkout -- {path}." if done.returncode == 0 else ""


def file_mode(path: Path) -> int:
    """The permissions a file written at ``path`` gets: those of the file it replaces, else of a neighbour
    of the same kind (another ``*.json`` in the folder), else the umask's default for a new file."""
    for candidate in (path, *sorted(path.parent.glob(f"*{path.suffix}"))):
        with contextlib.suppress(OSError):
            if candidate.is_file():
                return stat.S_IMODE(candidate.stat().st_mode)
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def atomic_write(path: Path, payload: str) -> None:
    """Write ``payload`` to ``path`` atomically: readers see the old file or the new one, never half; the
    file keeps the permissions of the one it replaces (see :func:`file_mode`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = file_mode(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:  # an interrupt included: the previous file stays as it was
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # make the rename durable where the platform allows
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


@contextlib.contextmanager
def locked(directory: Path, timeout: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold an exclusive ``flock`` on the folder itself (POSIX; a no-op elsewhere): no lock file to leave
    behind or to show up as untracked."""
    directory.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: single-writer assumption
        yield
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise BaselineError(
                        f"another process has held the lock on {directory} for over {timeout:.0f} s; is a "
                        f"recording still running?"
                    ) from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def old_format(path: Path) -> int | None:
    """The format number of a parseable file of an older format, else None."""
    try:
        version = format_of(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return None
    return version if version is not None and version < FORMAT else None
