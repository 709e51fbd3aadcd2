"""The speed gate's verdict for CI (``pytest_lstmperf.ci_summary``): Markdown for ``$GITHUB_STEP_SUMMARY`` and
JUnit properties, as units and through a pytest run of a small plugin that calls them at the end of a session."""

from __future__ import annotations

import dataclasses
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_lstmperf.ci_summary import (
    FAILING_VERDICTS,
    STEP_SUMMARY_ENV,
    StepSummaryError,
    SummaryRow,
    junit_properties,
    markdown,
    write_step_summary,
)

SLOW = SummaryRow("test_lstm[torch-cudnn-fp32-B64]", "regressed", "cudnn/fp32", 1.4521, 1.10, "device time 1.45x")
FALLBACK = SummaryRow("test_gru[torch-cudnn-fp32-B64]", "kernel-changed", "cudnn/fp32 -> cuda-generic/fp32", 6.0,
                      None, "left cuDNN")  # fmt: skip
SAME = SummaryRow("test_lstm[torch-cpu-onednn-B1]", "unchanged", "onednn/fp32", 1.01, 1.10, "")
FASTER = SummaryRow("test_lstm[torch-cpu-onednn-B64]", "improved", "onednn/fp32", 0.8, 1.10, "")
HEADLINE = "SPEED GATE FAILED: 2 benchmark(s) kernel-changed/regressed"


def _table_rows(text: str) -> list[list[str]]:
    """The cells of the Markdown table's body rows (escaped pipes kept inside their cell)."""
    rows = []
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("| benchmark"):
            cells = [c.strip().replace("\\|", "|") for c in line.strip("|").replace("\\|", "\0").split("|")]
            rows.append([c.replace("\0", "|") for c in cells])
    return rows


# ------------------------------------------------------------------------------------------ SummaryRow
def test_summary_row_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        SLOW.verdict = "unchanged"  # type: ignore[misc]
    assert [f.name for f in dataclasses.fields(SummaryRow)] == ["name", "verdict", "kernel", "ratio", "limit", "note"]


def test_failing_verdicts_are_the_ones_that_fail_a_compare() -> None:
    assert {"regressed", "kernel-changed", "host-work-changed", "path-lost"} <= FAILING_VERDICTS
    assert not {"unchanged", "improved", "not-run"} & FAILING_VERDICTS
    assert SLOW.is_failing() and FALLBACK.is_failing() and not SAME.is_failing()


# ------------------------------------------------------------------------------------------ markdown
def test_markdown_lists_the_failing_rows_first_then_counts_the_others() -> None:
    text = markdown([SAME, SLOW, FASTER, FALLBACK, SAME], HEADLINE)
    lines = text.splitlines()
    assert lines[0] == "### lstmperf speed gate"
    assert HEADLINE in lines
    header = next(i for i, line in enumerate(lines) if line.startswith("| benchmark"))
    assert lines[header] == "| benchmark | verdict | kernel | now / baseline | fails at | note |"
    assert lines[header + 1] == "|---|---|---|---:|---:|---|"
    assert _table_rows(text) == [
        ["test_lstm[torch-cudnn-fp32-B64]", "regressed", "cudnn/fp32", "1.452x", "1.100x", "device time 1.45x"],
        ["test_gru[torch-cudnn-fp32-B64]", "kernel-changed", "cudnn/fp32 -> cuda-generic/fp32", "6.000x", "-",
         "left cuDNN"],
    ]  # fmt: skip
    assert lines[-1] == "3 other benchmarks: 2 unchanged, 1 improved."
    assert text.index(HEADLINE) < text.index("| benchmark") < text.index("3 other benchmarks")


def test_markdown_escapes_pipes_and_folds_line_breaks() -> None:
    row = SummaryRow("test_x[a|b]", "regressed", "cudnn|fp32", 2.0, 1.1, "first line\nsecond | line")
    text = markdown([row], "gate | failed")
    body = [line for line in text.splitlines() if line.startswith("| test_x")]
    assert body == ["| test_x[a\\|b] | regressed | cudnn\\|fp32 | 2.000x | 1.100x | first line second \\| line |"]
    # every table line has the header's six cells: no pipe of a value splits a cell
    for line in text.splitlines():
        if line.startswith("|"):
            assert line.replace("\\|", "").count("|") == 7, line
    assert _table_rows(text) == [["test_x[a|b]", "regressed", "cudnn|fp32", "2.000x", "1.100x",
                                  "first line second | line"]]  # fmt: skip


def test_markdown_without_failures_has_no_table() -> None:
    text = markdown([SAME, FASTER, SAME], "speed gate passed: 3 benchmark(s) compared, none slower")
    assert "| benchmark" not in text
    assert text.splitlines()[-1] == "3 benchmarks: 2 unchanged, 1 improved."
    assert markdown([SAME], "passed").splitlines()[-1] == "1 benchmark: 1 unchanged."


def test_markdown_of_nothing_says_so() -> None:
    text = markdown([], "speed gate: compared nothing")
    assert "No benchmark was compared." in text
    assert "| benchmark" not in text


def test_markdown_missing_values_show_a_dash() -> None:
    row = SummaryRow("test_y", "path-lost", "", None, None, "")
    assert _table_rows(markdown([row], "h")) == [["test_y", "path-lost", "-", "-", "-", "-"]]
    nan = SummaryRow("test_z", "inconclusive", "onednn/fp32", float("nan"), 1.1, "too few samples")
    assert _table_rows(markdown([nan], "h"))[0][3] == "-"


def test_markdown_custom_failing_set() -> None:
    inconclusive = SummaryRow("test_i", "inconclusive", "onednn/fp32", 1.2, 1.1, "noisy")
    assert _table_rows(markdown([inconclusive], "h"))[0][1] == "inconclusive"
    accepted = markdown([inconclusive], "h", failing={"regressed"})
    assert "| benchmark" not in accepted and "1 benchmark: 1 inconclusive." in accepted


# ------------------------------------------------------------------------------------------ step summary
def test_write_step_summary_without_the_variable_writes_nothing(tmp_path: Path) -> None:
    assert write_step_summary([SLOW], HEADLINE, environ={}) is None
    assert write_step_summary([SLOW], HEADLINE, environ={STEP_SUMMARY_ENV: ""}) is None
    assert list(tmp_path.iterdir()) == []


def test_write_step_summary_appends_to_the_file(tmp_path: Path) -> None:
    target = tmp_path / "summary.md"
    target.write_text("## an earlier step\ntext", encoding="utf-8")
    env = {STEP_SUMMARY_ENV: str(target)}
    assert write_step_summary([SLOW, SAME], HEADLINE, environ=env) == target
    assert write_step_summary([SAME], "speed gate passed", environ=env) == target
    text = target.read_text(encoding="utf-8")
    first, second = markdown([SLOW, SAME], HEADLINE), markdown([SAME], "speed gate passed")
    assert text == "## an earlier step\ntext\n" + first + "\n" + second
    assert text.count("### lstmperf speed gate") == 2


def test_write_step_summary_creates_a_missing_file(tmp_path: Path) -> None:
    target = tmp_path / "new.md"
    assert write_step_summary([SLOW], HEADLINE, environ={STEP_SUMMARY_ENV: str(target)}) == target
    assert target.read_text(encoding="utf-8") == markdown([SLOW], HEADLINE)


def test_write_step_summary_uses_os_environ_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "env.md"
    monkeypatch.setenv(STEP_SUMMARY_ENV, str(target))
    assert write_step_summary([FALLBACK], HEADLINE) == target
    assert "kernel-changed" in target.read_text(encoding="utf-8")
    monkeypatch.delenv(STEP_SUMMARY_ENV)
    assert write_step_summary([FALLBACK], HEADLINE) is None


@pytest.mark.parametrize("where", ["missing folder", "a folder", "under a file"])
def test_write_step_summary_unwritable_raises_its_own_error(tmp_path: Path, where: str) -> None:
    if where == "missing folder":
        target = tmp_path / "no" / "such" / "summary.md"
    elif where == "a folder":
        target = tmp_path
    else:  # a path below a plain file: fails for root too, where a read-only file would not
        (tmp_path / "plain").write_text("", encoding="utf-8")
        target = tmp_path / "plain" / "summary.md"
    with pytest.raises(StepSummaryError) as caught:
        write_step_summary([SLOW], HEADLINE, environ={STEP_SUMMARY_ENV: str(target)})
    assert caught.value.path == str(target)
    assert str(target) in str(caught.value) and STEP_SUMMARY_ENV in str(caught.value)
    assert caught.value.reason and caught.value.reason in str(caught.value)
    assert isinstance(caught.value.__cause__, OSError)
    assert not isinstance(caught.value, OSError)  # a caller catching OSError for other reasons does not hide it


# ------------------------------------------------------------------------------------------ junit
def test_junit_properties() -> None:
    pairs = junit_properties([SAME, SLOW, FASTER, FALLBACK], HEADLINE)
    assert pairs[:3] == [("lstmperf.gate", HEADLINE), ("lstmperf.gate.failed", "2"), ("lstmperf.gate.compared", "4")]
    as_dict = dict(pairs)
    assert len(as_dict) == len(pairs)  # names are unique
    assert as_dict["lstmperf.gate.unchanged"] == "1"
    assert as_dict["lstmperf.gate.improved"] == "1"
    assert as_dict["lstmperf.gate.regressed"] == "1"
    assert as_dict["lstmperf.gate.kernel-changed"] == "1"
    assert as_dict[f"lstmperf.gate.failed.{SLOW.name}"] == (
        "regressed: kernel cudnn/fp32, 1.452x (fails at 1.100x); device time 1.45x"
    )
    assert as_dict[f"lstmperf.gate.failed.{FALLBACK.name}"] == (
        "kernel-changed: kernel cudnn/fp32 -> cuda-generic/fp32, 6.000x; left cuDNN"
    )
    failed = [name for name, _ in pairs if name.startswith("lstmperf.gate.failed.")]
    assert failed == [f"lstmperf.gate.failed.{SLOW.name}", f"lstmperf.gate.failed.{FALLBACK.name}"]


def test_junit_properties_all_passed() -> None:
    pairs = junit_properties([SAME, SAME], "speed gate passed")
    assert pairs == [
        ("lstmperf.gate", "speed gate passed"),
        ("lstmperf.gate.failed", "0"),
        ("lstmperf.gate.compared", "2"),
        ("lstmperf.gate.unchanged", "2"),
    ]


# ------------------------------------------------------------------------------------------ in a pytest run
PLUGIN = """
import pytest

from pytest_lstmperf.ci_summary import (
    StepSummaryError, SummaryRow, add_junit_properties, junit_properties, write_step_summary,
)

ROWS = [
    SummaryRow("test_lstm[torch-cudnn-fp32]", "regressed", "cudnn/fp32", 1.5, 1.1, "device time"),
    SummaryRow("test_gru[torch-cudnn-fp32]", "unchanged", "cudnn/fp32", 1.0, 1.1, ""),
]
HEADLINE = "SPEED GATE FAILED: 1 benchmark(s) regressed"


@pytest.hookimpl(tryfirst=True)  # before the junitxml plugin writes its file
def pytest_sessionfinish(session):
    attached = add_junit_properties(session.config, junit_properties(ROWS, HEADLINE))
    try:
        where = write_step_summary(ROWS, HEADLINE)
    except StepSummaryError as exc:
        where = f"not written: {exc}"
    session.config._ci_where = (where, attached)


def pytest_terminal_summary(terminalreporter, config):
    where, attached = config._ci_where
    terminalreporter.write_line(f"ci-summary: {where}; junit: {attached}")
"""


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makepyfile(ci_plugin=PLUGIN, test_one="def test_one():\n    assert True\n")
    return pytester.runpytest_subprocess("-p", "ci_plugin", "-p", "no:lstmperf", "-p", "no:cacheprovider", *args)


def test_plugin_writes_step_summary_and_junit(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    summary = pytester.path / "step-summary.md"
    monkeypatch.setenv(STEP_SUMMARY_ENV, str(summary))
    result = _run(pytester, "--junitxml=report.xml")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"ci-summary: {summary}; junit: True"])
    text = summary.read_text(encoding="utf-8")
    assert "SPEED GATE FAILED: 1 benchmark(s) regressed" in text
    assert "| test_lstm[torch-cudnn-fp32] | regressed | cudnn/fp32 | 1.500x | 1.100x | device time |" in text
    assert "1 other benchmark: 1 unchanged." in text
    suite = ET.parse(pytester.path / "report.xml").getroot().find("testsuite")
    assert suite is not None
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["lstmperf.gate"] == "SPEED GATE FAILED: 1 benchmark(s) regressed"
    assert props["lstmperf.gate.failed"] == "1"
    assert props["lstmperf.gate.failed.test_lstm[torch-cudnn-fp32]"] == (
        "regressed: kernel cudnn/fp32, 1.500x (fails at 1.100x); device time"
    )


def test_plugin_outside_github_actions(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(STEP_SUMMARY_ENV, raising=False)
    result = _run(pytester)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["ci-summary: None; junit: False"])
    assert not list(pytester.path.glob("*.md"))


def test_plugin_unwritable_summary_is_reported_not_raised(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = pytester.path / "missing" / "summary.md"
    monkeypatch.setenv(STEP_SUMMARY_ENV, str(target))
    result = _run(pytester)
    assert result.ret == 0
    result.stdout.fnmatch_lines([f"ci-summary: not written: could not write the job summary to *{target}: *"])
