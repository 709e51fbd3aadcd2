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
import json
from pathlib import Path
from typing import Any

import pytest

from ..device import hardware_key
from ..speed.baseline import FORMAT, _atomic_write, bench_entry
from ..speed.provenance import benchmark_header, provenance
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

    return {"device_key": hardware_key(hardware_fields(device)), "fingerprint": dict(device.fingerprint)}


def json_section(config: pytest.Config) -> dict[str, Any] | None:
    """None where :func:`_device` is."""
    device = _device(config)
    if device is None:
        return None

    fields = hardware_fields(device)
    return {
        "format": FORMAT,
        "device_key": hardware_key(fields),
        "hardware": fields,
        "versions": device.versions(),
        "fingerprint": dict(device.fingerprint),
        "provenance": provenance(config),
    }


def write_xdist_json(config: pytest.Config, target: Any, records: list[dict[str, Any]]) -> str:
    """pytest-benchmark writes no ``--benchmark-json`` under pytest-xdist (it disables itself there): write
    every worker's records into it, in pytest-benchmark's layout. ``target`` is a path (pytest-benchmark
    5.3 and later: written atomically) or the binary file pytest-benchmark opened (earlier versions)."""
    header = benchmark_header(config)
    data: dict[str, Any] = {
        "machine_info": header["machine_info"],
        "commit_info": header["commit_info"],
        "benchmarks": [bench_entry(r) for r in sorted(records, key=lambda r: r["fullname"])],
        "datetime": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "version": header["version"],
    }
    section = json_section(config)
    if section is not None:
        data["lstmperf"] = section
    payload = json.dumps(data, indent=1, default=str) + "\n"
    if hasattr(target, "write"):
        target.write(payload.encode())
        target.flush()
        path = Path(target.name)
    else:
        path = Path(target)
        path.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(path, payload)
    devices = sorted({str(r["extra_info"].get("device", "?")) for r in records})
    return (
        f"--benchmark-json: {len(records)} benchmarks of every pytest-xdist worker written to {path} "
        f"(devices: {', '.join(devices)})"
    )
