"""The state of one test run: resolved settings, the device, the selected paths and the findings.

One :class:`LstmPerfSession` per pytest config, kept in ``config.stash``; the plugin's hooks and fixtures
only read and record through it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pytest

from . import options

if TYPE_CHECKING:
    from .device import DeviceInfo
    from .paths import ExecutionPath


@dataclass
class Finding:
    """A path that disagreed with what it claims: reported in the summary, and failing its test."""

    path: str
    check: str  # "kernel", "precision", "tolerance", "nan", "pairwise", "oom"
    spec: str
    message: str


@dataclass
class LstmPerfSession:
    config: pytest.Config
    settings: dict[str, options.Resolved]
    device: DeviceInfo
    selected: list[ExecutionPath]
    unavailable: dict[str, str]
    findings: list[Finding] = field(default_factory=list)
    observed: dict[str, set[str]] = field(default_factory=dict)  # path -> {"fwd cudnn/fp32", ...}
    started: float = field(default_factory=time.perf_counter)

    @property
    def profile(self) -> str:
        return self.settings["lstmperf_profile"].value

    @property
    def seed(self) -> int:
        return self.settings["lstmperf_seed"].value

    @property
    def available_paths(self) -> list[ExecutionPath]:
        return [p for p in self.selected if p.name not in self.unavailable]

    def record_observation(self, path: str, text: str) -> None:
        self.observed.setdefault(path, set()).add(text)

    def add_finding(self, finding: Finding) -> None:
        self.findings.append(finding)

    @classmethod
    def from_config(cls, config: pytest.Config) -> LstmPerfSession:
        from . import paths as registry
        from .device import DeviceError, resolve_device

        settings = {name: options.resolve(config, name) for name in options.SETTINGS}
        dev = settings["lstmperf_device"]
        try:
            device = resolve_device(dev.value, dev.source)
        except DeviceError as exc:
            raise pytest.UsageError(str(exc)) from None
        names = settings["lstmperf_paths"].value
        selected = registry.for_device(device.kind, names)
        if names is not None and not selected:
            raise pytest.UsageError(
                f"{settings['lstmperf_paths'].where()}: none of these paths runs on {device.name} (paths for "
                f"{device.kind}: {', '.join(p.name for p in registry.for_device(device.kind))})"
            )
        unavailable = {}
        for path in selected:
            reason = path.available(device)
            if reason:
                unavailable[path.name] = reason
        return cls(config, settings, device, selected, unavailable)


SESSION_KEY = pytest.StashKey[LstmPerfSession]()


def get_session(config: pytest.Config) -> LstmPerfSession:
    try:
        return config.stash[SESSION_KEY]
    except KeyError:
        raise RuntimeError("pytest-lstmperf is not active in this run (was it disabled with -p no:lstmperf?)") from None
