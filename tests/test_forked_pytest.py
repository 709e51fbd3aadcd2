"""The fork server of the project's own tests (``forked_pytest``): a forked inner run is a fresh pytest process
with the run's environment, folder, import path, streams and exit status, and a run past its timeout is killed."""

from __future__ import annotations

import os
import sys

import pytest
from forked_pytest import ENABLED, runpytest_forked, server

PROBE = """
import gc, os, sys

def test_environment_folder_and_path():
    assert os.environ["LSTMPERF_FORK_PROBE"] == "set after the server started"
    assert sys.path[0] == os.getcwd()
    assert "pytest_lstmperf.plugin" in sys.modules  # the plugin is loaded by the run itself
    # the server's imports are frozen out of the collector, while what the run makes is still collected
    assert gc.get_freeze_count() > 0
    cycle = []
    cycle.append(cycle)
    del cycle
    assert gc.collect() >= 1
    print("PROBE-PID", os.getpid())
    print("PROBE-ERR", file=sys.stderr)

def test_planted_failure():
    assert 1 == 2, "planted"
"""


@pytest.mark.skipif(not ENABLED or sys.platform == "win32", reason="no os.fork here: runs are subprocesses")
def test_a_forked_run_is_a_fresh_pytest_process(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    assert server() is not None, "the fork server did not start (another thread at fork time?)"
    monkeypatch.setenv("LSTMPERF_FORK_PROBE", "set after the server started")
    pytester.makepyfile(test_probe=PROBE)
    result = runpytest_forked(pytester, "-p", "no:cacheprovider", "-s", "-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*planted*"])
    (pid,) = [line.split("PROBE-PID ")[1].split()[0] for line in result.outlines if "PROBE-PID " in line]
    assert int(pid) != os.getpid()
    assert "PROBE-ERR" in result.errlines
    pytester.makepyfile(test_probe="import time\n\ndef test_hangs():\n    time.sleep(60)\n")
    with pytest.raises(pytest.fail.Exception, match="timed out after 3 s"):
        runpytest_forked(pytester, "-p", "no:cacheprovider", timeout=3)
    # the server survives a killed run
    pytester.makepyfile(test_probe="def test_ok():\n    pass\n")
    runpytest_forked(pytester, "-p", "no:cacheprovider").assert_outcomes(passed=1)
