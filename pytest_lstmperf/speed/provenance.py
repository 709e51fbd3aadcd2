"""Provenance of recorded benchmarks: the commit, machine and command a baseline came from, and the command
that records one."""

from __future__ import annotations

import datetime
import platform
import shlex
import subprocess
import sys

import pytest

from .records import Header


def provenance(config: pytest.Config) -> dict[str, str | bool | None]:
    """Where a recorded run came from: commit (and whether the tree was dirty), date, machine, command."""
    commit: str = "unknown"
    dirty: bool | None = None
    try:
        root = str(config.rootpath)
        commit = (
            subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
            ).stdout.strip()
            or "unknown"
        )
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        )
        dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        pass
    return {
        "commit": commit,
        "dirty": dirty,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": platform.node(),
        "python": platform.python_version(),
        "command": shlex.join(["pytest", *map(str, config.invocation_params.args)]),
    }


def record_command(config: pytest.Config, flag: str = "--lstmperf-save-baseline") -> str:
    """This run's command line, without comparing, with ``flag``: the command that records a baseline."""
    args = [a for a in config.invocation_params.args if not str(a).startswith("--benchmark-compare")]
    args = [a for a in args if a not in ("--lstmperf-save-baseline", "--lstmperf-update-baseline")]
    return shlex.join([*pytest_command(), *map(str, args), flag])


def pytest_command() -> list[str]:
    """The interpreter that ran this pytest, with ``-m pytest``: a bare ``pytest`` outside the virtual environment
    is another pytest, without this plugin."""
    return [sys.executable or "python3", "-m", "pytest"]


def rerun_command(config: pytest.Config) -> str:
    """This run's command line as it was given, with the interpreter that ran it."""
    return shlex.join([*pytest_command(), *map(str, config.invocation_params.args)])


def benchmark_header(config: pytest.Config) -> Header:
    """pytest-benchmark's machine and commit info (with this plugin's additions) and its version."""
    import pytest_benchmark

    machine_info = config.hook.pytest_benchmark_generate_machine_info(config=config)
    config.hook.pytest_benchmark_update_machine_info(config=config, machine_info=machine_info)
    commit_info = config.hook.pytest_benchmark_generate_commit_info(config=config)
    config.hook.pytest_benchmark_update_commit_info(config=config, commit_info=commit_info)
    return Header(machine_info, commit_info, str(pytest_benchmark.__version__))
