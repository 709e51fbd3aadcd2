"""What an lstmperf run adds to pytest-benchmark's JSON, and the ``--benchmark-json`` file it writes under
pytest-xdist, where pytest-benchmark writes none.

* :func:`machine_info_section`: the ``lstmperf`` part of the machine info (the device key and fingerprint),
  which pytest-benchmark compares between a run and the file it compares against;
* :func:`json_section`: the file's ``lstmperf`` part (format, device key, hardware, versions, fingerprint,
  provenance);
* :func:`write_xdist_json`: every pytest-xdist worker's records in pytest-benchmark's layout.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest

from ..speed.baseline_file import atomic_write, bench_entry
from ..speed.provenance import benchmark_header, provenance
from ..speed.records import BenchRecord, run_json, run_section
from ..speed.records import machine_info_section as info_section
from .gate_context import gate_device, hardware_fields, uses_lstmperf


def _device(config: pytest.Config) -> Any:
    """The run's device, or None for another project's benchmarks (no device resolution, no torch import) or a
    device in error."""
    if not uses_lstmperf(config):
        return None
    try:
        return gate_device(config)
    except pytest.UsageError:
        return None


def machine_info_section(config: pytest.Config) -> dict[str, Any] | None:
    """None where :func:`_device` is."""
    device = _device(config)
    if device is None:
        return None

    return info_section(hardware_fields(device), device.fingerprint)


def json_section(config: pytest.Config) -> dict[str, Any] | None:
    """None where :func:`_device` is."""
    device = _device(config)
    if device is None:
        return None

    return run_section(hardware_fields(device), device.versions(), device.fingerprint, provenance(config))


def write_xdist_json(config: pytest.Config, target: Any, records: list[BenchRecord]) -> str:
    """pytest-benchmark writes no ``--benchmark-json`` under pytest-xdist (it disables itself there): write
    every worker's records into it, in pytest-benchmark's layout. ``target`` is a path (pytest-benchmark
    5.3 and later: written atomically) or the binary file pytest-benchmark opened (earlier versions)."""
    date = datetime.datetime.now(datetime.timezone.utc).isoformat()
    records = sorted(records, key=lambda r: r.fullname)
    entries = [bench_entry(r) for r in records]
    payload = run_json(benchmark_header(config), entries, date, json_section(config))
    devices = sorted({r.device for r in records})
    if hasattr(target, "write"):
        target.write(payload.encode())
        target.flush()
        path = Path(target.name)
    else:
        path = Path(target)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, payload)
    return (
        f"--benchmark-json: {len(records)} benchmarks of every pytest-xdist worker written to {path} "
        f"(devices: {', '.join(devices)})"
    )
