"""The hardware-keyed baseline store: keys, entries with their versions and recording runs, validation of bad
files, format-1 files read as format 2, explicit and atomic recording, recording runs added or refused, locking."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import pytest

from pytest_lstmperf.device import device_key, hardware_fields, hardware_key
from pytest_lstmperf.speed import baseline as bl
from pytest_lstmperf.speed import baseline_file as bl_file
from pytest_lstmperf.speed.baseline_file import BaselineError
from pytest_lstmperf.speed.records import FORMAT, BaselineEntry, BenchRecord, Header, run_to_json

H100 = {
    "gpu": "NVIDIA H100 80GB HBM3",
    "capability": "9.0",
    "driver": "570.86",
    "cuda": "13.0",
    "cudnn": "91900",
    "torch": "2.11.0",
    "sms": "132",
}
CPU = {"cpu": "AMD EPYC 7B13", "cpu_id": "25.1.1", "threads": "2", "torch": "2.13.0", "onednn": "yes"}
PROV = {
    "commit": "abc123",
    "dirty": False,
    "date": "2026-11-22T10:00:00+00:00",
    "machine": "runner-1",
    "command": "pytest suites/ --lstmperf-save-baseline",
}
HEADER = {"machine_info": {"node": "runner-1"}, "commit_info": {"id": "abc123"}, "version": "5.3.1"}
VERSIONS = {"driver": "570.86", "cuda": "13.0", "cudnn": "91900", "torch": "2.11.0"}


def record(name: str, median: float = 1e-3, n: int = 10, kernel: str = "cudnn", anchor: float = 2e-4) -> dict:
    """A benchmark's record: ``n`` rounds, each paired with an anchor sample (about ``median / anchor`` apart)."""
    return {
        "fullname": f"suites/test_benchmarks.py::test_inference[{name}]",
        "name": f"test_inference[{name}]",
        "group": "forward",
        "param": name,
        "params": {"case": name},
        "extra_info": {
            "kernel": kernel,
            "precision": "fp32",
            "anchor": {"samples": [anchor * (1 + 0.01 * ((3 * i) % n)) for i in range(n)], "repeat": 8},
            "host_counters": {"aten_ops": 40, "kernels": 12, "syncs": 1},
        },
        "options": {"rounds": n},
        "data": [median * (1 + 0.01 * i) for i in range(n)],
        "iterations": 1,
    }


def save(
    store: bl.BaselineStore,
    records: list[dict],
    update: bool = False,
    fp: dict = H100,
    versions: dict = VERSIONS,
    add_run: bool = False,
) -> bl.SaveReport:
    kind = "cuda" if "gpu" in fp else "cpu"
    return store.save(
        [BenchRecord.from_json(r) for r in records],
        fields=hardware_fields(kind, fp),
        fingerprint=fp,
        versions=versions,
        provenance=PROV,
        header=Header.from_json(HEADER),
        update=update,
        add_run=add_run,
        threshold=1.10,
    )


def fields(fp: dict = H100) -> dict:
    return hardware_fields("cuda" if "gpu" in fp else "cpu", fp)


def test_the_key_is_the_hardware_alone() -> None:
    key = hardware_key(fields())
    assert key == "NVIDIA_H100_80GB_HBM3-cc9.0"
    for name in ("gpu", "capability"):
        assert hardware_key(fields({**H100, name: "other"})) != key, name
    for name in ("driver", "cuda", "cudnn", "torch", "sms"):  # software is recorded per entry, not in the key
        assert hardware_key(fields({**H100, name: "other"})) == key, name
    cpu_key = hardware_key(fields(CPU))
    assert cpu_key == "cpu-AMD_EPYC_7B13-25.1.1-2t"
    assert hardware_key(fields({**CPU, "cpu_id": "25.17.0"})) != cpu_key  # a generic name, another CPU
    assert hardware_key(fields({**CPU, "threads": "16"})) != cpu_key
    assert hardware_key(fields({**CPU, "torch": "2.14.0"})) == cpu_key


def test_differences_are_named() -> None:
    diff = bl_file.differences(fields(), fields({**H100, "capability": "8.0"}))
    assert diff == ["capability 9.0 (baseline) vs 8.0 (this device)"]


def test_record_then_load_is_pytest_benchmark_json(tmp_path: Path) -> None:
    store = bl.BaselineStore(tmp_path / "baselines")  # folder created on first save
    report = save(store, [record("a"), record("b")])
    assert report.new_file and sorted(report.created) == sorted(r["fullname"] for r in [record("a"), record("b")])
    assert "created" in report.describe()
    data = json.loads(report.path.read_text())
    assert set(data) >= {"machine_info", "commit_info", "benchmarks", "datetime", "version", "lstmperf"}
    bench = data["benchmarks"][0]
    assert bench["stats"]["data"] == record("a")["data"]
    assert bench["stats"]["median"] == pytest.approx(1.045e-3)
    assert bench["recorded"]["commit"] == "abc123"
    assert data["lstmperf"]["format"] == FORMAT == 2 and data["lstmperf"]["created"]["machine"] == "runner-1"
    assert data["lstmperf"]["hardware"] == fields() and report.path.name == "NVIDIA_H100_80GB_HBM3-cc9.0.json"
    part = bench["lstmperf"]
    assert part["versions"] == VERSIONS and part["kernel"] == "cudnn/fp32" and part["history"] == []
    (run,) = part["runs"]
    assert run["per_call"]["n"] == 10 and run["device"] is None and run["host_counters"]["aten_ops"] == 40
    reference = bl_file.reference_of(BaselineEntry.from_json(bench))
    assert reference.value("per-call") == pytest.approx(run["per_call"]["value"])
    # read back as a typed record (what scripts/gate_trials.py and gate_trust.py read an entry through)
    back = BaselineEntry.from_json(bench).as_record()
    assert (back.kernel, back.framework, back.expected_kernel) == ("cudnn", "", "")
    assert (
        BaselineEntry.from_json({**bench, "extra_info": {"framework": "torch", "expected_kernel": "cudnn"}})
        .as_record()
        .framework
        == "torch"
    )
    # pytest-benchmark's own loader reads it
    from pytest_benchmark.logger import Logger
    from pytest_benchmark.storage.file import FileStorage

    storage = FileStorage(tmp_path / "baselines", logger=Logger(Logger.QUIET))
    loaded = list(storage.load(str(report.path)))
    assert len(loaded) == 1 and len(loaded[0][1]["benchmarks"]) == 2
    found = store.find(fields())
    assert found is not None and found.samples(record("a")["fullname"]) == record("a")["data"]


def test_save_never_overwrites_update_does(tmp_path: Path) -> None:
    store = bl.BaselineStore(tmp_path)
    save(store, [record("a", 1e-3)])
    before = store.path_for(fields()).read_bytes()
    report = save(store, [record("a", 2e-3)])
    assert report.kept and not report.created and not report.updated
    assert "kept" in report.describe() and "unchanged" in report.describe()
    assert store.path_for(fields()).read_bytes() == before
    report = save(store, [record("a", 2e-3), record("b")])  # new entries are added, old ones kept
    assert len(report.created) == 1 and len(report.kept) == 1
    report = save(store, [record("a", 2e-3)], update=True)
    assert len(report.updated) == 1 and report.untouched == 1
    assert store.find(fields()).samples(record("a")["fullname"])[0] == pytest.approx(2e-3)
    assert store.find(fields()).benchmarks[record("a")["fullname"]].lstmperf.history == ()  # same versions


def test_update_under_other_versions_keeps_the_old_figures_in_the_history(tmp_path: Path) -> None:
    """An upgrade accepted with --lstmperf-update-baseline: the entry takes the new versions and figures, and the
    old ones become a point of its history (plots across releases)."""
    store = bl.BaselineStore(tmp_path)
    save(store, [record("a", 1e-3)])
    newer = {**VERSIONS, "torch": "2.12.0"}
    save(store, [record("a", 1.5e-3)], update=True, versions=newer)
    entry = store.find(fields()).benchmarks[record("a")["fullname"]]
    assert entry.lstmperf.versions == newer
    (point,) = entry.lstmperf.history
    assert point.versions == VERSIONS and point.kernel == "cudnn/fp32" and point.date == PROV["date"]
    assert point.per_call_s == pytest.approx(1.045e-3) and point.per_call == pytest.approx(5.2, rel=0.05)


def test_missing_baseline_message(tmp_path: Path) -> None:
    store = bl.BaselineStore(tmp_path / "nope", record_hint="pytest suites/ --lstmperf-save-baseline")
    assert store.find(fields()) is None
    text = store.missing_message(fields())
    assert text.startswith(f"no baseline for this hardware: {store.path_for(fields())} is missing (the folder ")
    assert "does not exist" in text and text.endswith("Record one with: pytest suites/ --lstmperf-save-baseline")
    save(store, [record("a")], fp={**H100, "gpu": "NVIDIA A100-SXM4-40GB"})
    text = store.missing_message(fields())
    assert "does not exist" not in text
    assert (
        "The closest, NVIDIA_A100-SXM4-40GB-cc9.0.json, is of other hardware (gpu NVIDIA A100-SXM4-40GB (baseline) "
        "vs NVIDIA H100 80GB HBM3 (this device)): not comparable." in text
    )


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('{"benchmarks": [', "truncated"),
        ("{]", "corrupt"),
        ("[1, 2]", "not a pytest-benchmark JSON file"),
        ('{"benchmarks": []}', "without pytest-lstmperf's device key"),
        ('{"benchmarks": [], "lstmperf": {"format": 99, "hardware": {}}}', "newer pytest-lstmperf"),
        ('{"benchmarks": [], "lstmperf": {"format": 0, "comparable": {}}}', "has the format 0, which this version"),
        ('{"benchmarks": [], "lstmperf": {"hardware": {}}}', "no format version"),
        ('{"benchmarks": [], "lstmperf": {"format": 2}}', "no hardware fields"),
        ('{"benchmarks": [{"stats": {"data": [1]}}], "lstmperf": {"format": 2, "hardware": {}}}', "malformed"),
        (
            '{"benchmarks": [{"fullname": "x", "stats": {"mean": 1}}], "lstmperf": {"format": 2, "hardware": {}}}',
            "no raw samples",
        ),
        (  # format 1 is read as format 2, and validated the same way
            '{"benchmarks": [{"fullname": "x", "stats": {"mean": 1}}], "lstmperf": {"format": 1, "comparable": {}}}',
            "no raw samples",
        ),
    ],
)
def test_bad_files_are_named(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "b.json"
    path.write_text(content)
    with pytest.raises(BaselineError, match=expected):
        bl_file.load(path, "pytest --lstmperf-save-baseline")


def test_a_file_cut_anywhere_is_named_truncated_and_one_damaged_inside_corrupt(tmp_path: Path) -> None:
    """Wherever a recording's file is cut, it is reported as truncated, also where the cut ends on a closing brace
    or bracket, or after a whole number (an end-of-text heuristic called such a cut corrupt: one run in a few of a
    test that cuts a real recording in half); a character damaged before the end is corrupt."""
    store = bl.BaselineStore(tmp_path)
    save(store, [record("a"), record("b")])
    (path,) = sorted(tmp_path.glob("*.json"))
    good = path.read_text()
    ends: dict[str, list[int]] = {}  # cuts after each kind of character the file holds: 3 of each, and the middle
    for cut in range(1, len(good.rstrip()) - 1):
        ends.setdefault(good[cut - 1], []).append(cut)
    cuts = sorted({c for found in ends.values() for c in found[:2] + found[-1:]} | {len(good) // 2})
    assert len(ends) > 15  # braces, brackets, digits, points, quotes, letters, commas, colons, white space
    for cut in cuts:
        path.write_text(good[:cut])
        with pytest.raises(BaselineError, match="is truncated: not valid JSON"):
            bl_file.load(path)
    middle = len(good) // 2
    path.write_text(good[:middle] + "\x01" + good[middle + 1 :])
    with pytest.raises(BaselineError, match="is corrupt: not valid JSON"):
        bl_file.load(path)


def test_bad_existing_file_is_not_overwritten(tmp_path: Path) -> None:
    """Recording missing entries never touches a broken file; the advice names the option that replaces it."""
    store = bl.BaselineStore(tmp_path, record_hint="pytest suites/ --lstmperf-save-baseline")
    path = store.path_for(fields())
    path.write_text('{"benchmarks": [')
    with pytest.raises(BaselineError, match=r"not recording: .* truncated.*--lstmperf-update-baseline") as exc:
        save(store, [record("a")])
    assert "kept as" in str(exc.value) and path.name + ".broken" in str(exc.value)
    assert path.read_text() == '{"benchmarks": ['


def test_update_replaces_a_broken_file_and_keeps_it_beside(tmp_path: Path) -> None:
    """The advice works: --lstmperf-update-baseline replaces an unreadable file, which is kept as .broken."""
    store = bl.BaselineStore(tmp_path)
    path = store.path_for(fields())
    path.write_text('{"benchmarks": [')
    report = save(store, [record("a")], update=True)
    broken = path.with_name(path.name + ".broken")
    assert report.broken == broken and "kept as" in report.describe()
    assert broken.read_text() == '{"benchmarks": ['
    assert list(store.find(fields()).benchmarks) == [record("a")["fullname"]]


def test_written_files_take_their_neighbours_permissions(tmp_path: Path) -> None:
    """mkstemp's 0600 is not what a baseline gets: a new file takes the umask default (or a neighbour's mode),
    a rewritten file keeps its own, read-only included."""
    store = bl.BaselineStore(tmp_path)
    old_umask = os.umask(0o022)
    try:
        path = save(store, [record("a")]).path
        assert path.stat().st_mode & 0o777 == 0o644
        path.chmod(0o664)
        other = save(store, [record("a")], fp={**H100, "gpu": "NVIDIA A100-SXM4-40GB"}).path
        assert other.stat().st_mode & 0o777 == 0o664  # the neighbour's mode
        path.chmod(0o444)
        save(store, [record("b")])
        assert path.stat().st_mode & 0o777 == 0o444
    finally:
        os.umask(old_umask)


def test_no_lock_file_is_left_behind(tmp_path: Path) -> None:
    store = bl.BaselineStore(tmp_path)
    save(store, [record("a")])
    assert sorted(p.name for p in tmp_path.iterdir()) == [store.path_for(fields()).name]


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root ignores file permissions")
def test_read_only_folder_is_a_clear_error(tmp_path: Path) -> None:
    store = bl.BaselineStore(tmp_path)
    save(store, [record("a")])
    before = store.path_for(fields()).read_bytes()
    tmp_path.chmod(0o555)
    try:
        with pytest.raises(BaselineError, match=r"not recording: cannot write .*Permission denied.*--lstmperf-"):
            save(store, [record("b")])
    finally:
        tmp_path.chmod(0o755)
    assert store.path_for(fields()).read_bytes() == before


def test_read_only_folder_error_when_the_write_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same error, planted where the platform ignores permissions (root): the write raises EACCES."""
    store = bl.BaselineStore(tmp_path)
    save(store, [record("a")])
    before = store.path_for(fields()).read_bytes()

    def denied(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", str(tmp_path))

    monkeypatch.setattr(bl_file.tempfile, "mkstemp", denied)
    with pytest.raises(BaselineError, match=r"not recording: cannot write .*Permission denied.*baselines=DIR"):
        save(store, [record("b")])
    assert store.path_for(fields()).read_bytes() == before


def test_update_replaces_a_file_of_a_format_it_cannot_read(tmp_path: Path) -> None:
    store = bl.BaselineStore(tmp_path)
    path = store.path_for(fields())
    path.write_text(json.dumps({"benchmarks": [], "lstmperf": {"format": 0}}))
    with pytest.raises(BaselineError, match=r"not recording: .*has the format 0, which this version cannot read"):
        save(store, [record("a")])
    report = save(store, [record("a")], update=True)
    assert report.broken == path.with_name(path.name + ".broken") and "kept as" in report.describe()
    assert store.find(fields()) is not None


def test_renamed_file_of_other_hardware_is_refused(tmp_path: Path) -> None:
    store = bl.BaselineStore(tmp_path)
    other = save(store, [record("a")], fp={**H100, "gpu": "NVIDIA A100-SXM4-40GB"}).path
    other.rename(store.path_for(fields()))
    with pytest.raises(BaselineError, match="is for other hardware: gpu NVIDIA A100-SXM4-40GB"):
        store.find(fields())
    with pytest.raises(BaselineError, match=r"not recording: .* is for other hardware: gpu NVIDIA A100"):
        save(store, [record("b")])


def test_interrupt_while_writing_leaves_previous_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = bl.BaselineStore(tmp_path)
    save(store, [record("a")])
    before = store.path_for(fields()).read_bytes()

    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(bl.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save(store, [record("b")])
    assert store.path_for(fields()).read_bytes() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def _save_in_process(directory: str, names: list[str]) -> None:
    store = bl.BaselineStore(directory)
    for name in names:
        save(store, [record(name)])


def test_concurrent_savers_lose_nothing(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn" if os.name != "posix" else "fork")
    procs = [
        ctx.Process(target=_save_in_process, args=(str(tmp_path), [f"w{w}-{i}" for i in range(15)])) for w in range(3)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    found = bl.BaselineStore(tmp_path).find(fields())
    assert found is not None and len(found.benchmarks) == 45


def test_add_baseline_run_needs_a_recorded_baseline(tmp_path: Path) -> None:
    store = bl.BaselineStore(tmp_path)
    with pytest.raises(BaselineError, match="does not exist; record it first with --lstmperf-save-baseline"):
        save(store, [record("a")], add_run=True)
    assert list(tmp_path.iterdir()) == []


def test_a_recording_run_is_added_named_when_outside_and_refused_when_broken(tmp_path: Path) -> None:
    """--lstmperf-add-baseline-run: a run that agrees with the entry is one more recording run (the samples stay
    the first run's); one outside the entry's limit but within 2x is added and named (clean runs can lie that
    far apart, and the entry's resolution takes it in from now on); one more than 2x slower or faster (a run
    that broke), or of other versions, is refused and named; an entry the baseline does not have is not made."""
    store = bl.BaselineStore(tmp_path)
    save(store, [record("a"), record("b"), record("c"), record("d")])
    report = save(
        store,
        [record("a", 1.02e-3), record("b", 3e-3), record("c", 0.3e-3), record("d", 1.5e-3), record("new")],
        add_run=True,
    )
    names = {n: record(n)["fullname"] for n in ("a", "b", "c", "d", "new")}
    assert report.added_run and report.updated == [names["a"], names["d"]] and report.kept == [names["new"]]
    refused = dict(line.split(": ", 1) for line in report.refused)
    assert sorted(refused) == [names["b"], names["c"]]
    assert refused[names["b"]] == "more than 2.0x off: per-call: 3.000x"  # refused, not also "unchanged"
    assert refused[names["c"]] == "more than 2.0x off: per-call: 0.300x"
    ((outside, why),) = [line.split(": ", 1) for line in report.outliers]
    assert outside == names["d"] and why.startswith("per-call: 1.500x (limit 1.100)")
    assert report.describe().endswith(
        "written: a recording run added to 2 benchmark(s), 1 of them outside the limits of the runs before (their "
        "resolution widens), refused for 2 (a figure more than twice the others', or other versions), 1 not in the "
        "baseline (record them with --lstmperf-save-baseline)"
    )
    entries = store.find(fields()).benchmarks
    assert [len(entries[names[n]].lstmperf.runs) for n in ("a", "b", "c", "d")] == [2, 1, 1, 2]
    assert list(entries[names["a"]].samples) == record("a")["data"] and names["new"] not in entries
    # the run added outside is part of the entry's noise from now on: its resolution widens
    widened = bl_file.reference_of(entries[names["d"]])
    one_run = bl_file.reference_of(entries[names["b"]])
    assert widened.own_spread("per-call") > 0.25 and one_run.own_spread("per-call") is None
    other = save(store, [record("a")], add_run=True, versions={**VERSIONS, "torch": "2.12.0"})
    assert other.refused == [f"{names['a']}: recorded with other versions; record it anew"]
    assert "unchanged" in other.describe()


def test_a_refused_recording_run_names_how_many_of_its_processes_were_refused(tmp_path: Path) -> None:
    """An added run timed in several processes (``--lstmperf-record-processes``), every one of them 3x off the
    entry (a run that broke): refused, the benchmark named once, with how many of its processes that was."""
    store = bl.BaselineStore(tmp_path)
    save(store, [record("a")])
    slow = record("a", 3e-3)
    report = store.save(
        [BenchRecord.from_json(slow)], fields=fields(), fingerprint=H100, versions=VERSIONS, provenance=PROV,
        header=Header.from_json(HEADER), threshold=1.10, update=False, add_run=True,
        siblings={slow["fullname"]: [BenchRecord.from_json(record("a", 3.1e-3))] * 2},
    )  # fmt: skip
    assert report.refused == [f"{slow['fullname']}: more than 2.0x off (3 of 3 processes): per-call: 3.000x"]
    assert report.updated == [] and report.left_out == []
    assert len(store.find(fields()).benchmarks[slow["fullname"]].lstmperf.runs) == 1  # nothing added


def test_check_writable_names_what_stops_a_recording(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before any test runs: a folder that cannot be made, or is not writable (planted through os.access, which
    root would otherwise pass), is an error naming it and the way out."""
    bl.BaselineStore(tmp_path / "made").check_writable(fields())
    assert (tmp_path / "made").is_dir()
    (tmp_path / "file").write_text("")
    with pytest.raises(BaselineError, match=r"the baseline folder .*file/baselines cannot be made: .*DIR\."):
        bl.BaselineStore(tmp_path / "file" / "baselines").check_writable(fields())
    monkeypatch.setattr(bl.os, "access", lambda path, mode: False)
    with pytest.raises(BaselineError, match=r"cannot record: the baseline folder .*made is not writable"):
        bl.BaselineStore(tmp_path / "made").check_writable(fields())


def _format_1(directory: Path, fp: dict = H100, date: str = "2026-10-01T00:00:00+00:00") -> Path:
    """A baseline as format 1 wrote it: keyed (and named) by the device and its software, timings without the
    anchor, no ``lstmperf`` part in its entries."""
    kind = "cuda" if "gpu" in fp else "cpu"
    comparable = {"kind": kind, **{k: fp[k] for k in ("gpu", "capability", "driver", "cuda", "cudnn", "torch")}}
    extra = {"kernel": "cudnn", "precision": "fp32", "host_counters": {"aten_ops": 40, "kernels": 12}}
    bench = bl_file.bench_entry(BenchRecord.from_json({**record("a"), "extra_info": extra})).to_json()
    bench["recorded"] = {"date": date}
    section = {"format": 1, "device_key": device_key(comparable), "comparable": comparable}
    section.update(frameworks={"keras": "3.15.1"}, updated={"date": date})
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{device_key(comparable)}.json"
    path.write_text(json.dumps({"benchmarks": [bench], "lstmperf": section}))
    return path


def test_a_format_1_file_is_read_as_format_2_and_recording_fills_its_timings(tmp_path: Path) -> None:
    old = _format_1(tmp_path)
    store = bl.BaselineStore(tmp_path)
    found = store.find(fields())
    assert found is not None and found.path == old and found.migrated_from == 1 and found.fields == fields()
    entry = found.benchmarks[record("a")["fullname"]]
    part = entry.lstmperf
    assert part.kernel == "cudnn/fp32" and part.versions == {**VERSIONS, "keras": "3.15.1"}
    runs = [run_to_json(r) for r in part.runs]
    assert runs == [{"per_call": None, "device": None, "host_counters": {"aten_ops": 40, "kernels": 12}}]
    (point,) = part.history
    assert point.per_call_s == pytest.approx(1.045e-3) and point.date == "2026-10-01T00:00:00+00:00"
    reference = bl_file.reference_of(entry)
    assert reference.figure("per-call") is None and reference.kernel == "cudnn/fp32"
    # recording fills the entry's timings into this hardware's file; the old file stays, and is named
    report = save(store, [record("a"), record("b")])
    assert report.path == store.path_for(fields()) != old and report.migrated == old
    assert report.updated == [record("a")["fullname"]] and report.created == [record("b")["fullname"]]
    assert "(migrated from the format-1 file" in report.describe() and old.exists()
    again = store.find(fields())
    assert again.path == store.path_for(fields()) and again.migrated_from is None
    filled = again.benchmarks[record("a")["fullname"]].lstmperf
    assert filled.runs[0].per_call is not None and filled.runs[0].per_call.n == 10 and filled.history == (point,)
    # and is not filled twice: a recorded entry is kept
    assert save(store, [record("a", 2e-3)]).kept == [record("a")["fullname"]]


def test_a_format_1_file_of_other_hardware_or_unreadable_is_not_taken(tmp_path: Path) -> None:
    _format_1(tmp_path, fp={**H100, "gpu": "NVIDIA A100-SXM4-40GB"})
    (tmp_path / "cpu-x-torch2.0.json").write_text('{"benchmarks": [], "lstmperf": {"format": 1, "comparable": 3}}')
    store = bl.BaselineStore(tmp_path)
    assert store.find(fields()) is None
    assert "The closest, NVIDIA_A100-SXM4-40GB-cc9.0-drv570.86" in store.missing_message(fields())


def test_a_broken_baseline_is_told_to_restore_from_git_only_where_git_has_it(tmp_path: Path) -> None:
    """The advice to restore from version control is given for a committed file, not for one never committed."""
    import shutil
    import subprocess

    from pytest_lstmperf.speed.baseline_file import load

    broken = tmp_path / "cpu-x-2t.json"
    broken.write_text('{"benchmarks": [', encoding="utf-8")
    with pytest.raises(BaselineError) as untracked:
        load(broken)
    assert "git checkout" not in str(untracked.value) and "Record it again" in str(untracked.value)
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the committed case cannot be made")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run([*git, "add", broken.name], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "baseline"], cwd=tmp_path, check=True)
    with pytest.raises(BaselineError) as tracked:
        load(broken)
    assert f"git checkout -- {broken}" in str(tracked.value)


def test_the_committed_baselines_read_and_write_back_byte_for_byte() -> None:
    """Every committed baseline loads as the current format, and its typed form writes the same text back: a
    kept entry is never rewritten differently."""
    folder = Path(__file__).resolve().parents[1] / "baselines"
    paths = sorted(folder.glob("*.json"))
    assert paths
    for path in paths:
        baseline = bl_file.load(path)
        assert baseline.migrated_from is None and baseline.benchmarks
        assert baseline.document.dumps() == path.read_text(encoding="utf-8"), path.name


def test_a_record_travels_under_one_key_and_reads_back_as_it_was_written() -> None:
    """What a benchmark attaches to its report (a plain dict, as pytest-xdist carries it) reads back as the same
    record, under the key the controller collects."""
    from pytest_lstmperf.speed import records

    raw = {**record("a"), "thresholds": {"ratio": 1.2}, "failed": ""}
    typed = BenchRecord.from_json(raw)
    assert typed.threshold == 1.2 and typed.kernel_text == "cudnn/fp32" and typed.anchor.repeat == 8
    assert BenchRecord.from_json(json.loads(json.dumps(typed.to_json()))) == typed
    assert records.load_records(records.dump_records([typed, typed])) == [typed, typed]


def test_an_update_keeps_an_unchanged_entrys_earlier_sitting_and_replaces_a_changed_one(tmp_path: Path) -> None:
    """``--lstmperf-update-baseline`` at another time: an entry the rule finds unchanged (same versions and kernel,
    every figure within its limits) keeps its earlier recording as a sitting of its own beside the update's, so
    that how far recordings made at different times lie apart is measured; one that changed (2x slower here: an
    intended change) is replaced, its earlier sitting dropped. Each process carries its sitting in the file, and a
    recording run added later is a sitting of its own. At most three sittings are kept."""
    store = bl.BaselineStore(tmp_path)

    def at(date: str, medians: dict[str, float], update: bool = False, add_run: bool = False) -> bl.SaveReport:
        made = {n: [record(n, m * f) for f in (1.0, 1.004, 0.996)] for n, m in medians.items()}
        return store.save(
            [BenchRecord.from_json(r[0]) for r in made.values()],
            fields=fields(),
            fingerprint=H100,
            versions=VERSIONS,
            provenance={**PROV, "date": date},
            header=Header.from_json(HEADER),
            update=update,
            add_run=add_run,
            threshold=1.10,
            siblings={record(n)["fullname"]: [BenchRecord.from_json(r) for r in rs[1:]] for n, rs in made.items()},
        )

    names = {n: record(n)["fullname"] for n in ("a", "b")}
    at("2026-11-22T10:00:00+00:00", {"a": 1e-3, "b": 1e-3})
    report = at("2026-11-23T10:00:00+00:00", {"a": 1.003e-3, "b": 2e-3}, update=True)
    assert report.sittings == [names["a"]] and sorted(report.updated) == sorted(names.values())
    assert "1 of them unchanged by the rule, which keep their earlier recording beside this one" in report.describe()
    entries = store.find(fields()).benchmarks
    sittings = {n: sorted({r.sitting for r in entries[names[n]].lstmperf.runs}) for n in names}
    assert sittings["a"] == ["2026-11-22T10:00:00+00:00", "2026-11-23T10:00:00+00:00"]
    assert sittings["b"] == ["2026-11-23T10:00:00+00:00"] and len(entries[names["a"]].lstmperf.runs) == 6
    assert bl_file.reference_of(entries[names["a"]]).own_variance("per-call")[1] == 4  # within sittings
    at("2026-11-24T10:00:00+00:00", {"a": 1e-3}, add_run=True)
    at("2026-11-25T10:00:00+00:00", {"a": 1e-3, "b": 2e-3}, update=True)
    kept = sorted({r.sitting for r in store.find(fields()).benchmarks[names["a"]].lstmperf.runs})
    assert kept == ["2026-11-23T10:00:00+00:00", "2026-11-24T10:00:00+00:00", "2026-11-25T10:00:00+00:00"]
