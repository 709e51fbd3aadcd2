"""Device selection and fingerprint.

The ``--device`` setting (``auto``, ``cpu``, ``cuda``, ``cuda:N``) is checked for syntax by :func:`device_setting`
(the setting's parser, :mod:`.options`) and turned into a :class:`DeviceInfo` by :func:`resolve_device`, the one
resolver, which :attr:`.session.LstmPerfSession.device` calls once per run. Asking for a GPU that is not usable is an
error naming what was found: a misconfigured GPU runner must not pass green on the CPU.

A device has one key for its speed baselines, its hardware (:func:`hardware_fields`, :func:`hardware_key`; the
software versions are recorded with each entry), and one for the measurement files whose numbers depend on the
software too (:meth:`DeviceInfo.key`, :func:`device_key`: the tolerance samples; format-1 baselines were named so).
"""

from __future__ import annotations

import os
import platform
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

DEVICE_CHOICES = "auto, cpu, cuda, cuda:N"
_DEVICE_RE = re.compile(r"^(auto|cpu|cuda)(?::(\d+))?$")


class DeviceError(ValueError):
    """The requested device is malformed or not usable here."""


#: what decides the hardware's speed: the key of a speed baseline (software versions are recorded with each entry)
HARDWARE_FIELDS = {"cuda": ("gpu", "capability"), "cpu": ("cpu", "cpu_id", "threads")}
#: software whose version is recorded with every baseline entry: a run on other versions is an upgrade
SOFTWARE_FIELDS = ("driver", "cuda", "cudnn", "torch")
SOFTWARE_DISTRIBUTIONS = ("keras", "tensorflow", "jax", "jaxlib", "onnxruntime", "onnxruntime-gpu")


def hardware_fields(kind: str, fingerprint: Mapping[str, str]) -> dict[str, str]:
    """The fingerprint fields that key a speed baseline: the GPU model and compute capability, or the CPU model
    and the threads torch uses."""
    names = HARDWARE_FIELDS.get(kind)
    if names is None:
        raise ValueError(f"unknown device kind {kind!r} (valid: {', '.join(HARDWARE_FIELDS)})")
    return {"kind": kind, **{name: str(fingerprint.get(name, "?")) for name in names}}


def hardware_key(fields: Mapping[str, str]) -> str:
    """A speed baseline's file name stem: ``NVIDIA_H100_80GB_HBM3-cc9.0``, ``cpu-<model>-2t``."""
    if fields.get("kind") == "cuda":
        parts = [fields.get("gpu", "gpu"), f"cc{fields.get('capability', '')}"]
    else:
        parts = ["cpu", fields.get("cpu", ""), fields.get("cpu_id", ""), f"{fields.get('threads', '')}t"]
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", "-".join(parts)).strip("_.")[:200]


def software_versions(fingerprint: Mapping[str, str]) -> dict[str, str]:
    """The versions of the software that runs the benchmarks: the device's (driver, CUDA, cuDNN, torch)
    and the other frameworks', read from their distributions without importing them."""
    from importlib import metadata

    versions = {k: str(fingerprint[k]) for k in SOFTWARE_FIELDS if fingerprint.get(k) not in (None, "", "?")}
    for dist in SOFTWARE_DISTRIBUTIONS:
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return versions


#: the fingerprint fields that name a device's measurement files (:meth:`DeviceInfo.key`): the hardware and the
#: software whose numbers they hold, the driver left out
KEY_FIELDS = {"cuda": ("gpu", "capability", "cuda", "cudnn", "torch"), "cpu": ("cpu", "threads", "torch")}


def device_key(fields: Mapping[str, str]) -> str:
    """A readable, file-name-safe key of hardware and software: ``NVIDIA_H100_80GB_HBM3-cc9.0-cuda13.0-cudnn91900-
    torch2.11.0`` (:meth:`DeviceInfo.key`; a format-1 baseline's file name also held the driver, ``drv570.86``);
    a field left out of ``fields`` is left out of the key."""
    if fields.get("kind") == "cuda":
        parts = [
            fields.get("gpu", "gpu"),
            f"cc{fields.get('capability', '')}",
            *([f"drv{fields['driver']}"] if "driver" in fields else []),
            f"cuda{fields.get('cuda', '')}",
            f"cudnn{fields.get('cudnn', '')}",
            f"torch{fields.get('torch', '')}",
        ]
    else:
        parts = ["cpu", fields.get("cpu", ""), f"{fields.get('threads', '')}t", f"torch{fields.get('torch', '')}"]
    key = re.sub(r"[^A-Za-z0-9.+-]+", "_", "-".join(parts)).strip("_.")
    return key[:200]


@dataclass(frozen=True)
class DeviceInfo:
    kind: str  # "cpu" or "cuda"
    index: int | None = None
    fingerprint: dict[str, str] = field(default_factory=dict, hash=False, compare=False)

    @property
    def name(self) -> str:
        return self.kind if self.index is None else f"{self.kind}:{self.index}"

    @property
    def torch_device(self) -> str:
        return self.name

    def hardware(self) -> dict[str, str]:
        """The fields that key this device's speed baseline (:func:`hardware_fields`)."""
        return hardware_fields(self.kind, self.fingerprint)

    def versions(self) -> dict[str, str]:
        """The software versions recorded with each baseline entry (:func:`software_versions`)."""
        return software_versions(self.fingerprint)

    def key(self) -> str:
        """:func:`device_key` of this device's :data:`KEY_FIELDS`: names the tolerance-measurement files
        (``docs/data/tolerance-samples-<key>.json``), whose numbers do not depend on the driver."""
        fields = {name: str(self.fingerprint.get(name, "?")) for name in KEY_FIELDS[self.kind]}
        return device_key({"kind": self.kind, **fields})

    def describe(self) -> str:
        fp = self.fingerprint
        if self.kind == "cuda":
            return (
                f"{self.name} ({fp.get('gpu', '?')}, compute capability {fp.get('capability', '?')}, "
                f"driver {fp.get('driver', '?')}, CUDA {fp.get('cuda', '?')}, cuDNN {fp.get('cudnn', '?')}, "
                f"torch {fp.get('torch', '?')})" + (f" [{fp['pinned']}]" if "pinned" in fp else "")
            )
        return (
            f"cpu ({fp.get('cpu', '?')}, {threads_text(fp.get('threads', '?'))}, oneDNN {fp.get('onednn', '?')}, "
            f"torch {fp.get('torch', '?')})"
        )


def threads_text(threads: object) -> str:
    """``1 thread``, ``16 threads``: a fingerprint's thread count in words."""
    return f"{threads} thread{'' if str(threads) == '1' else 's'}"


def device_setting(raw: str) -> str:
    """The ``--device`` setting's parser (:mod:`.options`): syntax only, no framework imported; ``"CUDA:1"`` ->
    ``"cuda:1"``. Raises DeviceError (a ValueError) naming the valid choices."""
    kind, index = parse_device(raw)
    return kind if index is None else f"{kind}:{index}"


def parse_device(value: str) -> tuple[str, int | None]:
    """Syntax only: ``"cuda:1"`` -> ``("cuda", 1)``. Raises DeviceError naming the valid choices."""
    match = _DEVICE_RE.match(value.strip().lower()) if isinstance(value, str) else None
    if not match or (match.group(1) != "cuda" and match.group(2) is not None):
        raise DeviceError(f"invalid device {value!r} (valid: {DEVICE_CHOICES})")
    return match.group(1), int(match.group(2)) if match.group(2) is not None else None


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_id() -> str:
    """The CPU's family, model and stepping (``25.1.1``): a generic model name ("AMD EPYC" on a cloud VM) is
    shared by CPU generations that time differently."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("cpu family", "model", "stepping") and key not in fields:
                    fields[key] = value.strip()
                if not line.strip() and fields:
                    break
    except OSError:
        pass
    return ".".join(fields.get(k, "?") for k in ("cpu family", "model", "stepping")) if fields else platform.machine()


#: the variables that set the threads of the frameworks a CPU run may start in worker processes
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")


def apply_threads(threads: int) -> None:
    """Fix the CPU threads of every framework of a CPU run: torch's intra-op threads now, and the variables
    the Keras workers, TensorFlow, XLA and ONNX Runtime read as they start (:data:`THREAD_VARIABLES`,
    ``XLA_FLAGS``; ONNX Runtime's sessions read ``OMP_NUM_THREADS`` through :func:`cpu_threads`)."""
    import torch

    torch.set_num_threads(threads)
    for name in THREAD_VARIABLES:
        os.environ[name] = str(threads)
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(("--xla_cpu_multi_thread_eigen",
             "intra_op_parallelism_threads"))]  # fmt: skip
    flags += [f"--xla_cpu_multi_thread_eigen={'false' if threads == 1 else 'true'}",
              f"intra_op_parallelism_threads={threads}"]  # fmt: skip
    os.environ["XLA_FLAGS"] = " ".join(flags)


def cpu_threads() -> int | None:
    """The CPU threads a run fixed (:func:`apply_threads`), None where it fixed none."""
    raw = os.environ.get("OMP_NUM_THREADS", "")
    return int(raw) if raw.isdigit() and int(raw) > 0 else None


def _driver_version() -> str:
    try:
        import torch

        # torch reports the driver's CUDA version only through NVML / the runtime; try NVML first
        try:
            import pynvml  # type: ignore[import-not-found,unused-ignore]

            pynvml.nvmlInit()
            return str(pynvml.nvmlSystemGetDriverVersion())
        except Exception:
            pass
        try:
            with open("/proc/driver/nvidia/version", encoding="utf-8") as handle:
                match = re.search(r"Kernel Module\s+([\d.]+)", handle.read())
                if match:
                    return match.group(1)
        except OSError:
            pass
        return str(torch._C._cuda_getDriverVersion()) if hasattr(torch._C, "_cuda_getDriverVersion") else "?"
    except Exception:
        return "?"


def fingerprint(kind: str, index: int | None) -> dict[str, str]:
    import torch

    fp = {"torch": torch.__version__.split("+")[0], "python": platform.python_version()}
    if kind == "cuda":
        props = torch.cuda.get_device_properties(index or 0)
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None  # type: ignore[no-untyped-call]
        fp.update(
            gpu=props.name,
            capability=f"{props.major}.{props.minor}",
            sms=str(props.multi_processor_count),
            memory_gib=f"{props.total_memory / 2**30:.0f}",
            cuda=str(torch.version.cuda),
            cudnn=str(cudnn) if cudnn else "none",
            driver=_driver_version(),
        )
    else:
        onednn = torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
        fp.update(
            cpu=_cpu_name(), cpu_id=_cpu_id(), threads=str(torch.get_num_threads()), onednn="yes" if onednn else "no"
        )
    return fp


def resolve_device(value: str, source: str = "--device", threads: int | None = None) -> DeviceInfo:
    """Resolve a device setting; ``source`` names where it came from for the error message. On the CPU, with
    ``threads``, every framework's CPU threads are fixed first (:func:`apply_threads`)."""
    try:
        kind, index = parse_device(value)
    except DeviceError as exc:
        raise DeviceError(f"{source}: {exc}") from None
    if kind == "cpu":
        if threads is not None:
            apply_threads(threads)
        return DeviceInfo("cpu", None, fingerprint("cpu", None))
    try:
        import torch
    except ImportError:
        if kind == "auto":
            raise DeviceError(f"{source}={value}: torch is not installed (pip install torch)") from None
        raise DeviceError(f"{source}={value}: torch is not installed, so no CUDA device is usable") from None
    usable = torch.cuda.is_available()
    count = torch.cuda.device_count() if usable else 0
    if kind == "auto":
        if usable and count:
            return resolve_device("cuda", source)
        return resolve_device("cpu", source, threads)
    if not usable or count == 0:
        built = torch.version.cuda
        why = (
            f"torch {torch.__version__} is a CPU-only build"
            if not built
            else f"torch {torch.__version__} (CUDA {built}) finds no usable GPU"
            f" (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')})"
        )
        raise DeviceError(f"{source}={value}: no usable CUDA device: {why}. Run on a GPU runner or pass --device=cpu.")
    pinned = index is None and xdist_worker() is not None
    index = (xdist_worker() or 0) % count if index is None else index
    if index >= count:
        raise DeviceError(
            f"{source}={value}: only {count} CUDA device{'s' if count != 1 else ''} present (valid: "
            + ", ".join(f"cuda:{i}" for i in range(count))
            + ")"
        )
    info = DeviceInfo("cuda", index, fingerprint("cuda", index))
    if pinned:
        info.fingerprint["pinned"] = f"pytest-xdist worker gw{xdist_worker()} pinned to cuda:{index} of {count}"
    return info


def xdist_worker() -> int | None:
    """This process's pytest-xdist worker number (``gw3`` -> 3), None outside xdist workers."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else None


def shared_gpu(device: DeviceInfo) -> str | None:
    """Why timing on ``device`` would be unfair under pytest-xdist (two workers on one GPU), else None."""
    if device.kind != "cuda" or xdist_worker() is None:
        return None
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if workers <= 1:
        return None
    import torch

    count = torch.cuda.device_count()
    if "pinned" not in device.fingerprint:
        return f"all {workers} pytest-xdist workers run on {device.name} (--device names one GPU)"
    if workers > count:
        return f"{workers} pytest-xdist workers share {count} GPU{'s' if count != 1 else ''}"
    return None
