"""pytest-benchmark's ``--benchmark-histogram`` keeps working beside the speed gate: its plotting packages (pygal,
pygaljs) come with the extras that install the plugin's optional parts (``histogram``, and ``all``)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from forked_pytest import runpytest_forked
from test_bench_plugin import BASE_ARGS, SPIN_MODULE, SUITE

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]


def _extra(name: str) -> list[str]:
    """The requirements of one extra in pyproject.toml (a one- or more-line TOML list of strings)."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    found = re.search(rf"^{name} = (\[.*?\])$", text, flags=re.M | re.S)
    assert found is not None, f"no extra {name!r} in pyproject.toml"
    return list(ast.literal_eval(found.group(1)))


@pytest.mark.parametrize("extra", ["histogram", "all"])
def test_the_histogram_extra_brings_pytest_benchmarks_plotting_packages(extra: str) -> None:
    names = {re.split(r"[\s<>=!~;]", requirement, maxsplit=1)[0].lower() for requirement in _extra(extra)}
    assert "pytest-benchmark[histogram]" in names, f"extra {extra!r}: {sorted(names)}"


def test_histogram_beside_the_speed_section_exits_0(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pygal", reason="pygal: pip install 'pytest-lstmperf[histogram]' (in the 'all' extra)")
    pytester.makepyfile(spinpath=SPIN_MODULE)
    pytester.makeconftest("import spinpath  # noqa: F401 - registers the spin path\n")
    pytester.makepyfile(test_benchmarks=SUITE.read_text())
    for name in ("PYTEST_ADDOPTS", "PYTEST_LSTMPERF_PLANT", "PYTEST_LSTMPERF_DEVICE", "PYTEST_LSTMPERF_PATHS",
                 "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PYTEST_LSTMPERF_PLANT_CLOCK", "thread")
    result = runpytest_forked(pytester, *BASE_ARGS, "--benchmark-histogram=hist/bench", timeout=600)
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == 0, output
    assert "Traceback" not in output
    result.stdout.fnmatch_lines(["*lstmperf speed*", "forward*spin-onednn*onednn/fp32*"])
    svgs = sorted((pytester.path / "hist").glob("bench*.svg"))
    assert svgs and all(p.read_text().lstrip().startswith(("<?xml", "<svg")) for p in svgs), svgs
