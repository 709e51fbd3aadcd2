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
without the anchor, so they are not compared).

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
import stat
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..device import HARDWARE_FIELDS, hardware_key
from .benchmark_adapter import statistics as benchmark_statistics
from .policy import Measurement, Reference, RunFigures, recording_runs

#: version of the ``lstmperf`` section; bump when its meaning changes
FORMAT = 2
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
    record: Mapping[str, Any],
    recorded: Mapping[str, Any] | None = None,
    versions: Mapping[str, str] | None = None,
    siblings: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """One benchmark in pytest-benchmark's JSON layout, its statistics computed from the raw samples; with
    ``versions`` (a baseline's entry) also its ``lstmperf`` part: versions, kernel, the figures of each
    recording process (this one's and its ``siblings``', the same benchmark timed in independent processes;
    a process that broke is left out and named in ``left_out``, :func:`~.policy.recording_runs`).

    ``record`` holds ``fullname``, ``name``, ``group``, ``param``, ``params``, ``extra_info``, ``options``,
    ``data`` (seconds per call, one per round) and ``iterations``.
    """
    data = [float(x) for x in record["data"]]
    if not data:
        raise ValueError(f"{record.get('fullname')}: no samples")
    stats_dict = benchmark_statistics(data)
    stats_dict["data"] = data
    stats_dict["iterations"] = int(record.get("iterations", 1))
    entry = {
        "group": record.get("group"),
        "name": record["name"],
        "fullname": record["fullname"],
        "params": record.get("params"),
        "param": record.get("param"),
        "extra_info": dict(record.get("extra_info") or {}),
        "options": dict(record.get("options") or {}),
        "stats": stats_dict,
    }
    if recorded is not None:
        entry["recorded"] = dict(recorded)
    if versions is not None:
        measured = Measurement.from_record(record)
        runs, left_out = recording_runs([measured, *(Measurement.from_record(r) for r in siblings)])
        entry["lstmperf"] = {
            "versions": dict(versions),
            "kernel": measured.kernel,
            "runs": [run.to_dict() for run in runs],
            "history": [],
        }
        if left_out:
            entry["lstmperf"]["left_out"] = left_out
    return entry


def history_point(entry: Mapping[str, Any], date: str | None = None) -> dict[str, Any]:
    """What an entry's figures were under its versions, kept when newer versions replace them."""
    part = entry.get("lstmperf") or {}
    extra = entry.get("extra_info") or {}
    reference = reference_of(entry)
    return {
        "versions": dict(part.get("versions") or {}),
        "date": date or (entry.get("recorded") or {}).get("date"),
        "kernel": part.get("kernel", ""),
        "per_call_s": _median(entry.get("stats", {}).get("data") or []),
        "device_s": extra.get("device_time_s"),
        "per_call": reference.value("per-call"),
        "device": reference.value("device"),
    }


def reference_of(entry: Mapping[str, Any]) -> Any:
    """The :class:`~.policy.Reference` of a baseline entry."""
    part = entry.get("lstmperf") or {}
    return Reference(
        name=entry["fullname"],
        runs=tuple(RunFigures.from_dict(r) for r in part.get("runs") or []),
        kernel=str(part.get("kernel", "")),
        versions=dict(part.get("versions") or {}),
    )


def _median(values: Any) -> float | None:
    import statistics

    vals = [float(v) for v in values or [] if v]
    return statistics.median(vals) if vals else None


# ------------------------------------------------------------------------------------------- files
@dataclass
class Baseline:
    """A loaded, validated baseline file."""

    path: Path
    data: dict[str, Any]

    @property
    def section(self) -> dict[str, Any]:
        return self.data["lstmperf"]

    @property
    def fields(self) -> dict[str, str]:
        return dict(self.section.get("hardware", {}))

    @property
    def migrated_from(self) -> int | None:
        """The older format this file was read from (in memory; writing it gives the current format)."""
        return self.section.get("migrated_from")

    @property
    def entries(self) -> dict[str, dict[str, Any]]:
        return {bench["fullname"]: bench for bench in self.data["benchmarks"]}

    def samples(self, fullname: str) -> list[float]:
        return list(self.entries[fullname]["stats"]["data"])


def _hint(record_hint: str) -> str:
    return f" Record one with: {record_hint}" if record_hint else ""


def replace_command(record_hint: str) -> str:
    """The recording command that replaces entries (and a broken file): ``--lstmperf-update-baseline``."""
    if "--lstmperf-save-baseline" in record_hint:
        return record_hint.replace("--lstmperf-save-baseline", "--lstmperf-update-baseline")
    return record_hint


def load(path: Path, record_hint: str = "") -> Baseline:
    """Read and validate one baseline file; :class:`BaselineError` names the problem and the fix."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BaselineError(f"baseline {path} does not exist.{_hint(record_hint)}") from None
    except IsADirectoryError:
        raise BaselineError(f"baseline {path} is a folder, not a file.{_hint(record_hint)}") from None
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
        what = "truncated" if not text.rstrip().endswith(("}", "]")) else "corrupt"
        raise BaselineError(
            f"baseline {path} is {what}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})." + restore
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), list):
        raise BaselineError(f"baseline {path} is not a pytest-benchmark JSON file (no 'benchmarks' list)." + restore)
    section = data.get("lstmperf")
    if not isinstance(section, dict):
        raise BaselineError(
            f"{path} is a pytest-benchmark file without pytest-lstmperf's device key (written by "
            f"--benchmark-save or --benchmark-json?), so it cannot be checked against this device."
            f"{_hint(record_hint)}"
        )
    version = section.get("format")
    if not isinstance(version, int):
        raise BaselineError(f"baseline {path} has no format version in its 'lstmperf' section." + restore)
    if version > FORMAT:
        raise BaselineError(
            f"baseline {path} was written by a newer pytest-lstmperf (format {version}; this version reads "
            f"format {FORMAT}). Upgrade pytest-lstmperf."
        )
    if version == 1 and isinstance(section.get("comparable"), dict):
        data = migrate_format_1(data)
        section = data["lstmperf"]
    elif version < FORMAT:
        raise BaselineError(
            f"baseline {path} has the format {version}, which this version cannot read (it reads formats 1 and "
            f"{FORMAT}). Record it again, replacing the old file, with --lstmperf-update-baseline."
        )
    if not isinstance(section.get("hardware"), dict):
        raise BaselineError(f"baseline {path} has no hardware fields ('lstmperf.hardware')." + restore)
    for bench in data["benchmarks"]:
        stats = bench.get("stats") if isinstance(bench, dict) else None
        if not isinstance(stats, dict) or "fullname" not in bench:
            raise BaselineError(f"baseline {path} has a malformed benchmark entry." + restore)
        samples = stats.get("data")
        if not isinstance(samples, list) or not samples or not all(isinstance(x, (int, float)) for x in samples):
            raise BaselineError(
                f"baseline {path}: benchmark {bench['fullname']} has no raw samples (stats.data)." + restore
            )
    return Baseline(path, data)


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


def migrate_format_1(data: dict[str, Any]) -> dict[str, Any]:
    """A format-1 baseline (keyed by device and software versions, timings without an anchor) as format 2: the
    hardware fields key it, each entry keeps its kernel, host counters and versions, and its timings become its
    history's first point. The entries have no recording runs: their timings are not compared (the gate says so)
    until a run records them (``--lstmperf-save-baseline`` fills entries that lack runs)."""
    old = data["lstmperf"]
    comparable = dict(old["comparable"])
    kind = comparable.get("kind", "cuda")
    hardware = {
        "kind": kind,
        **{k: comparable.get(k, "?") for k in HARDWARE_FIELDS.get(kind, ()) if k in comparable or k != "cpu_id"},
    }  # a format-1 file knew no CPU family, model and stepping: it matches on the rest (differences)
    versions = {k: v for k, v in comparable.items() if k not in hardware}
    versions.update(old.get("frameworks") or {})
    for bench in data["benchmarks"]:
        extra = bench.get("extra_info") or {}
        counters = extra.get("host_counters") or {}
        bench["lstmperf"] = {"versions": dict(versions), "kernel": "", "runs": [], "history": []}
        if extra.get("kernel"):
            bench["lstmperf"]["kernel"] = f"{extra.get('kernel')}/{extra.get('precision', '')}"
        if counters:  # the host counts were exact then as now: still compared
            bench["lstmperf"]["runs"] = [{"per_call": None, "device": None, "host_counters": counters}]
        point = history_point(bench, (bench.get("recorded") or {}).get("date"))
        bench["lstmperf"]["history"] = [point]
    data["lstmperf"] = {
        "format": FORMAT,
        "device_key": hardware_key(hardware),
        "hardware": hardware,
        "fingerprint": old.get("fingerprint", {}),
        "created": old.get("created", {}),
        "updated": old.get("updated", {}),
        "migrated_from": 1,
    }
    return data


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


def _atomic_write(path: Path, payload: str) -> None:
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


def _old_format(path: Path) -> int | None:
    """The format number of a parseable file of an older format, else None."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        version = data["lstmperf"]["format"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return version if isinstance(version, int) and version < FORMAT else None
