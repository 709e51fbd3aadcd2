"""Baselines keyed by device: one pytest-benchmark JSON file per comparable device, with raw samples.

A baseline file is what ``pytest --benchmark-json`` writes (``machine_info``, ``commit_info``,
``benchmarks`` with ``stats.data`` holding every sample, ``datetime``, ``version``), so pytest-benchmark's
``--benchmark-compare=FILE`` and ``--benchmark-compare-fail`` read it as their own, plus a ``lstmperf``
section: the format version, the fields that make timings comparable (GPU model, compute capability,
driver, CUDA, cuDNN and torch versions; CPU model, thread count and torch version on the CPU), the full
device fingerprint and the provenance (commit, machine, date, command) of the run that created and of
the run that last updated it. Each benchmark entry also carries its own ``recorded`` provenance.

The file name is derived from the comparable fields, so ``--benchmark-compare`` with no argument finds
this device's file, and a file of another device is refused with the differing fields named.

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
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..device import device_key

#: version of the ``lstmperf`` section; bump when its meaning changes
FORMAT = 1
BROKEN_SUFFIX = ".broken"
LOCK_TIMEOUT_S = 120.0

#: other frameworks whose version matters for the benchmarks of their paths (checked per benchmark)
FRAMEWORK_DISTRIBUTIONS = ("keras", "tensorflow")


class BaselineError(Exception):
    """A baseline that cannot be used or written; the message says why and what to do."""


def differences(baseline: Mapping[str, str], current: Mapping[str, str]) -> list[str]:
    """Human-readable differing fields: ``driver 570.86 (baseline) vs 575.51 (this device)``."""
    out = []
    for name in dict.fromkeys([*baseline, *current]):
        then, now = baseline.get(name), current.get(name)
        if then != now:
            out.append(
                f"{name} {then if then is not None else '<absent>'} (baseline) vs "
                f"{now if now is not None else '<absent>'} (this device)"
            )
    return out


def framework_versions() -> dict[str, str]:
    """Installed versions of the non-torch frameworks, read without importing them."""
    from importlib import metadata

    versions = {}
    for dist in FRAMEWORK_DISTRIBUTIONS:
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return versions


# ------------------------------------------------------------------------------------------- entries
def bench_entry(record: Mapping[str, Any], recorded: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One benchmark in pytest-benchmark's JSON layout, its statistics computed from the raw samples.

    ``record`` holds ``fullname``, ``name``, ``group``, ``param``, ``params``, ``extra_info``, ``options``,
    ``data`` (seconds per call, one per round) and ``iterations``.
    """
    from pytest_benchmark.stats import Stats

    data = [float(x) for x in record["data"]]
    if not data:
        raise ValueError(f"{record.get('fullname')}: no samples")
    stats = Stats()
    for value in data:
        stats.update(value)
    stats_dict = stats.as_dict()
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
    return entry


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
        return dict(self.section.get("comparable", {}))

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
        raise BaselineError(f"baseline {path} cannot be read: {exc.strerror or exc}") from None
    restore = (
        f" Restore it from version control (git checkout -- {path}), or record it again, replacing it (the "
        f"broken file is kept as {path.name}{BROKEN_SUFFIX})"
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
    if version < FORMAT:
        raise BaselineError(
            f"baseline {path} has the older format {version} (this version reads format {FORMAT}). Record it "
            f"again, replacing the old file, with --lstmperf-update-baseline."
        )
    if not isinstance(section.get("comparable"), dict):
        raise BaselineError(f"baseline {path} has no device fields ('lstmperf.comparable')." + restore)
    for bench in data["benchmarks"]:
        stats = bench.get("stats") if isinstance(bench, dict) else None
        if not isinstance(stats, dict) or "fullname" not in bench:
            raise BaselineError(f"baseline {path} has a malformed benchmark entry." + restore)
        samples = stats.get("data")
        if not isinstance(samples, list) or not samples or not all(isinstance(x, (int, float)) for x in samples):
            raise BaselineError(
                f"baseline {path}: benchmark {bench['fullname']} has no raw samples (stats.data); the rank test "
                f"needs them." + restore
            )
    return Baseline(path, data)


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


@dataclass
class SaveReport:
    path: Path
    created: list[str] = field(default_factory=list)  # entries new to the file
    updated: list[str] = field(default_factory=list)  # entries replaced (update mode)
    kept: list[str] = field(default_factory=list)  # entries present and left alone (save mode)
    untouched: int = 0  # entries of the file this run did not measure
    new_file: bool = False
    replaced_format: int | None = None
    broken: Path | None = None  # where an unreadable file this run replaced was kept
    flags: list[str] = field(default_factory=list)  # bimodal entries, said at recording time
    added_run: bool = False  # --lstmperf-add-baseline-run: noise bands extended, no entry replaced

    def describe(self) -> str:
        parts = []
        if self.created:
            parts.append(f"{len(self.created)} recorded")
        if self.updated:
            parts.append(f"{len(self.updated)} updated")
        if self.kept:
            parts.append(f"{len(self.kept)} kept (already in the baseline; --lstmperf-update-baseline replaces them)")
        if self.untouched:
            parts.append(f"{self.untouched} not measured in this run, left as they were")
        what = "created" if self.new_file else "written"
        if self.added_run:
            parts = [f"a recording run added to the noise band of {len(self.updated)} benchmark(s)"]
            if self.kept:
                parts.append(f"{len(self.kept)} not in the baseline (record them with --lstmperf-save-baseline)")
        if not self.created and not self.updated:
            what = "unchanged"
        text = f"baseline {self.path} {what}: " + (", ".join(parts) or "nothing to record")
        if self.replaced_format is not None:
            text += f" (replaced a format-{self.replaced_format} file)"
        if self.broken is not None:
            text += f" (replaced an unreadable file, kept as {self.broken})"
        return text


class BaselineStore:
    """The baselines folder: one file per comparable device."""

    def __init__(self, directory: Path | str, record_hint: str = "") -> None:
        self.directory = Path(directory)
        self.record_hint = record_hint

    def path_for(self, fields: Mapping[str, str]) -> Path:
        return self.directory / f"{device_key(fields)}.json"

    def find(self, fields: Mapping[str, str]) -> Baseline | None:
        """This device's baseline, or None when there is none; a broken file raises BaselineError."""
        path = self.path_for(fields)
        if not path.exists():
            return None
        baseline = load(path, self.record_hint)
        diff = differences(baseline.fields, dict(fields))
        if diff:  # a renamed or hand-copied file
            raise BaselineError(f"baseline {path} is for another device: {'; '.join(diff)}")
        return baseline

    def others(self, fields: Mapping[str, str]) -> list[tuple[Path, list[str]]]:
        """The other devices' baselines of the same kind, each with what differs (closest first)."""
        found = []
        if not self.directory.is_dir():
            return found
        for path in sorted(self.directory.glob("*.json")):
            if path == self.path_for(fields):
                continue
            try:
                other = load(path)
            except BaselineError:
                continue
            if other.fields.get("kind") != fields.get("kind"):
                continue
            found.append((path, differences(other.fields, dict(fields))))
        return sorted(found, key=lambda item: len(item[1]))

    def missing_message(self, fields: Mapping[str, str]) -> str:
        path = self.path_for(fields)
        where = "" if self.directory.is_dir() else f" (the folder {self.directory} does not exist)"
        text = f"no baseline for this device: {path} is missing{where}."
        closest = self.others(fields)
        if closest:
            other, diff = closest[0]
            text += f" The closest, {other.name}, differs in: {'; '.join(diff)}; it is not comparable."
        return text + _hint(self.record_hint)

    def save(
        self,
        records: Iterable[Mapping[str, Any]],
        *,
        fields: Mapping[str, str],
        fingerprint: Mapping[str, str],
        provenance: Mapping[str, Any],
        header: Mapping[str, Any],
        update: bool,
        add_run: bool = False,
    ) -> SaveReport:
        """Merge ``records`` into this device's file under the lock and write it atomically.

        With ``add_run`` no entry is replaced: each measured entry's noise band gains this run's medians and
        host counters (:func:`add_recording_run`), so that the band covers the spread between clean runs.

        Without ``update`` entries already in the file are kept (never overwritten); with it they are
        replaced, and so is a file that cannot be read as a baseline (kept beside as ``<name>.broken``).
        Entries not measured in this run stay. ``header`` gives pytest-benchmark's top-level keys
        (``machine_info``, ``commit_info``, ``version``). A file-system error is a :class:`BaselineError`
        naming the path and the cause; the previous file is then untouched.
        """
        path = self.path_for(fields)
        try:
            with locked(self.directory):
                if add_run:
                    return self._add_run_locked(path, list(records), fields)
                return self._save_locked(path, list(records), fields, fingerprint, provenance, header, update)
        except OSError as exc:
            where = exc.filename or path
            raise BaselineError(
                f"not recording: cannot write the baseline {path}: {exc.strerror or exc} ({where}). Make the "
                f"folder writable, or record into another folder with --lstmperf-baselines=DIR."
            ) from None

    def _add_run_locked(self, path: Path, records: list[Mapping[str, Any]], fields: Mapping[str, str]) -> SaveReport:
        from .regression import own_device_median

        report = SaveReport(path)
        if not path.exists():
            raise BaselineError(
                f"not recording: --lstmperf-add-baseline-run adds to a recorded baseline and {path} does not exist; "
                f"record it first with --lstmperf-save-baseline"
            )
        data = load(path, self.record_hint).data
        diff = differences(data["lstmperf"]["comparable"], dict(fields))
        if diff:
            raise BaselineError(f"not recording: {path} is for another device: {'; '.join(diff)}")
        entries = {b["fullname"]: b for b in data["benchmarks"]}
        for record in records:
            entry = entries.get(record["fullname"])
            if entry is None:
                report.kept.append(record["fullname"])  # not in the baseline: nothing to add to
                continue
            add_recording_run(entry, record)
            report.updated.append(record["fullname"])
            band = entry["extra_info"]["noise_band"]
            flag = band.get("host_counters_unstable")
            if flag:
                report.flags.append(f"{record['fullname']}: host counters differ between recording runs: {flag}")
            if band.get("device_other_method"):
                report.flags.append(f"{record['fullname']}: {band['device_other_method']}")
            extra = entry["extra_info"]
            wide = _device_unsteady(band, extra.get("device_time_method"), own_device_median(extra))
            if wide:
                report.flags.append(f"{record['fullname']}: {wide}")
        report.untouched = len(set(entries) - set(report.updated))
        report.added_run = True
        if report.updated:
            _atomic_write(path, json.dumps(data, indent=1, sort_keys=False, default=str) + "\n")
        return report

    def _existing(self, path: Path, update: bool, report: SaveReport) -> dict[str, Any] | None:
        """The file's current content; a broken file is an error, or (``update``) moved aside."""
        if not path.exists():
            return None
        try:
            return load(path, self.record_hint).data
        except BaselineError as exc:
            if not update:
                raise BaselineError(f"not recording: {exc}") from None
            report.replaced_format = _old_format(path)
            if report.replaced_format is None:  # unreadable: keep it beside, replaced by this run
                report.broken = path.with_name(path.name + BROKEN_SUFFIX)
                os.replace(path, report.broken)
            return None

    def _save_locked(
        self,
        path: Path,
        records: list[Mapping[str, Any]],
        fields: Mapping[str, str],
        fingerprint: Mapping[str, str],
        provenance: Mapping[str, Any],
        header: Mapping[str, Any],
        update: bool,
    ) -> SaveReport:
        from .regression import noise_record

        report = SaveReport(path)
        recorded = {k: provenance.get(k) for k in ("commit", "dirty", "date", "machine")}
        existing = self._existing(path, update, report)
        if existing is not None:
            diff = differences(existing["lstmperf"]["comparable"], dict(fields))
            if diff:
                raise BaselineError(f"not recording: {path} is for another device: {'; '.join(diff)}")
        report.new_file = existing is None
        entries = {} if existing is None else {b["fullname"]: b for b in existing["benchmarks"]}
        measured = set()
        for record in records:
            name = record["fullname"]
            measured.add(name)
            if name in entries and not update:
                report.kept.append(name)
                continue
            (report.updated if name in entries else report.created).append(name)
            entries[name] = bench_entry(record, recorded)
            noise = noise_record(entries[name]["extra_info"], entries[name]["stats"]["data"])
            entries[name]["extra_info"]["noise_band"] = noise
            if noise.get("bimodal"):
                report.flags.append(f"{name}: {noise['bimodal']}")
        report.untouched = len(set(entries) - measured)
        if not report.created and not report.updated:
            return report
        section = {
            "format": FORMAT,
            "device_key": device_key(fields),
            "comparable": dict(fields),
            "fingerprint": dict(fingerprint),
            "frameworks": framework_versions(),
            "created": (existing or {}).get("lstmperf", {}).get("created", dict(provenance)),
            "updated": dict(provenance),
        }
        data = {
            "machine_info": header.get("machine_info", {}),
            "commit_info": header.get("commit_info", {}),
            "benchmarks": [entries[name] for name in sorted(entries)],
            "datetime": provenance.get("date"),
            "version": header.get("version"),
            "lstmperf": section,
        }
        _atomic_write(path, json.dumps(data, indent=1, sort_keys=False, default=str) + "\n")
        return report


def _old_format(path: Path) -> int | None:
    """The format number of a parseable file of an older format, else None."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        version = data["lstmperf"]["format"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return version if isinstance(version, int) and version < FORMAT else None


def add_recording_run(entry: dict[str, Any], record: Mapping[str, Any]) -> None:
    """Extend ``entry``'s noise band with one more clean run of the same benchmark (``record``).

    The band's ``per_call_spread``/``device_spread`` become the larger of the spread within the first run
    (its independent batches) and the relative spread of every recording run's median, with ``source``
    saying how many runs it rests on; exactly compared host counters (ATen ops, kernels, syncs) that moved
    between the recording runs are named in ``host_counters_unstable`` and left out of the comparison, since a
    clean rerun already changed them; the others are still compared, bytes allocated within their recorded
    spread (``regression.alloc_tolerance``).
    """
    from .regression import device_spread, own_device_median, relative_spread, runs_of_method, unstable_counters

    extra = entry["extra_info"]
    band = dict(extra.get("noise_band") or {})
    runs = list(band.get("recording_runs") or [_run_summary(entry["stats"]["data"], extra)])
    now = record["extra_info"]
    runs.append(_run_summary(record["data"], now))
    band["recording_runs"] = runs
    method, own = extra.get("device_time_method"), own_device_median(extra)
    # device time: only the runs timed as the entry's own samples were (a CUDA-graph replay and a batch of
    # event-timed calls measure different things; the gate compares one method with itself)
    alike = [id(r) for r in runs_of_method(runs, method, own)]
    for spread_key in ("per_call_spread", "device_spread"):
        band[f"{spread_key}_within_run"] = band.get(f"{spread_key}_within_run", band.get(spread_key))
    medians = [r["per_call_median"] for r in runs if r.get("per_call_median")]
    candidates = [v for v in (band["per_call_spread_within_run"], relative_spread(medians)) if v is not None]
    band["per_call_spread"] = max(candidates) if candidates else None
    band["device_spread"] = device_spread(band, method, own)[0]  # the gate's own rule
    other = [
        f"{i + 1} ({r.get('device_time_method') or 'method not kept; median far from the entry'})"
        for i, r in enumerate(runs)
        if id(r) not in alike
    ]
    if other:
        band["device_other_method"] = (
            f"device time of recording run(s) {', '.join(other)} taken by another method than the entry's "
            f"({method}): left out of its device band"
        )
    else:
        band.pop("device_other_method", None)
    band["source"] = f"{len(runs)} recording runs (and the batches within the first)"
    band["runs"] = len(runs)
    then = extra.get("host_counters")
    moved = unstable_counters(then, band)  # over every recording run, by the gate's own comparison rule
    if moved:
        band["host_counters_unstable"] = "; ".join(f"{k} {v}" for k, v in sorted(moved.items()))
    else:
        band.pop("host_counters_unstable", None)
    extra["noise_band"] = band


def _device_unsteady(band: Mapping[str, Any], method: str | None = None, own: float | None = None) -> str:
    """A description when the recording runs' device medians (those taken by ``method``, the entry's, whose own
    samples' median is ``own``: ``regression.runs_of_method``) spread so wide that the gate's device threshold
    for the entry rises above the default (``regression.device_threshold``), else ''."""
    from .regression import Thresholds, device_spread, device_threshold, runs_of_method

    runs = [r for r in band.get("recording_runs") or [] if r.get("device_median")]
    medians = [r["device_median"] for r in runs_of_method(runs, method, own)]
    threshold, _ = device_threshold(Thresholds().ratio, band, method=method, own=own)
    if len(medians) < 2 or threshold <= Thresholds().ratio:
        return ""
    shown = ", ".join(f"{m * 1e3:.3g} ms" for m in medians)
    spread = device_spread(band, method, own)[0] or 0.0
    return (
        f"device time unsteady between recording runs ({shown}: {spread:.0%} spread); the "
        f"gate resolves only device slowdowns past {threshold:.2f}x here"
    )


def _run_summary(data: Any, extra: Mapping[str, Any]) -> dict[str, Any]:
    import statistics

    values = [float(x) for x in data or [] if x]
    device = [float(x) for x in extra.get("device_samples") or [] if x]
    return {
        "per_call_median": statistics.median(values) if values else None,
        "device_median": statistics.median(device) if device else None,
        "device_time_method": extra.get("device_time_method"),
        "host_counters": extra.get("host_counters"),
    }
