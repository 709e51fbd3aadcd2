"""Every setting of the plugin, resolved in one place: CLI > environment > ini > default.

Each :class:`Setting` names its option, environment variable and ini key, and a parser that raises
``ValueError`` with the valid choices. :func:`resolve` returns the value with where it came from, so that an
error can say ``PYTEST_LSTMPERF_DEVICE=cuda:3: only 1 CUDA device present``. Parsing errors become
``pytest.UsageError`` (exit code 4), never a traceback.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from .device import device_setting

HYPOTHESIS_PROFILES = ("ci", "gpu", "nightly")


@dataclass(frozen=True)
class Setting:
    name: str  # argparse dest
    option: str  # command-line flag
    env: str
    ini: str
    default: str | None
    parse: Callable[[str], Any]
    help: str
    metavar: str = "VALUE"
    #: a shorter flag added only when no other plugin or conftest of the run owns it (``--device``)
    alias: str | None = None

    @property
    def alias_dest(self) -> str:
        return f"{self.name}_alias"


@dataclass(frozen=True)
class Resolved:
    value: Any
    raw: str | None
    source: str  # "--device", "PYTEST_LSTMPERF_DEVICE", "ini lstmperf_device", "default"

    def where(self) -> str:
        return f"{self.source}={self.raw}" if self.raw is not None else self.source


def parse_choice(choices: tuple[str, ...]) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        value = raw.strip().lower()
        if value not in choices:
            raise ValueError(f"invalid value {raw!r} (valid: {', '.join(choices)})")
        return value

    return parse


def parse_float(low: float | None = None, high: float | None = None) -> Callable[[str], float]:
    def parse(raw: str) -> float:
        try:
            value = float(raw)
        except (TypeError, ValueError):
            raise ValueError(f"invalid number {raw!r}") from None
        if (low is not None and value < low) or (high is not None and value > high):
            raise ValueError(f"{raw!r} out of range [{low}, {high}]")
        return value

    return parse


def parse_int(low: int | None = None) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        try:
            value = int(raw)
        except (TypeError, ValueError):
            raise ValueError(f"invalid integer {raw!r}") from None
        if low is not None and value < low:
            raise ValueError(f"{raw!r} must be >= {low}")
        return value

    return parse


def parse_bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"invalid boolean {raw!r} (valid: true, false, 1, 0, yes, no, on, off)")


def _parse_paths(raw: str) -> str | None:
    """Comma-separated path names, ``default`` (None) or ``all``, as given: the registry of paths, a higher
    layer, reads and checks them (``resolve(config, "lstmperf_paths", then=paths.selection)``, which
    :func:`pytest_lstmperf.session.resolve_paths` does)."""
    value = raw.strip()
    return None if value in ("", "default") else value


SETTINGS: dict[str, Setting] = {}


def add_setting(setting: Setting) -> Setting:
    SETTINGS[setting.name] = setting
    return setting


add_setting(
    Setting(
        "lstmperf_device",
        "--lstmperf-device",
        "PYTEST_LSTMPERF_DEVICE",
        "lstmperf_device",
        "auto",
        device_setting,  # syntax only; the setting becomes a DeviceInfo once, in the session (device.py's resolver)
        "device to run the suites on: auto (GPU if usable, else CPU), cpu, cuda or cuda:N. "
        "A GPU that is asked for and not usable is an error, not a skip. Also spelled --device, unless the "
        "project defines its own --device.",
        "DEVICE",
        alias="--device",
    )
)
add_setting(
    Setting(
        "lstmperf_paths",
        "--lstmperf-paths",
        "PYTEST_LSTMPERF_PATHS",
        "lstmperf_paths",
        "default",
        _parse_paths,
        "comma-separated execution paths to run; default: every path available on the device but the extended "
        "ones (slow to compile), which run when named or with 'all'; `lstmperf paths` lists them",
        "NAMES",
    )
)
add_setting(
    Setting(
        "lstmperf_profile",
        "--lstmperf-profile",
        "PYTEST_LSTMPERF_PROFILE",
        "lstmperf_profile",
        "ci",
        parse_choice(HYPOTHESIS_PROFILES),
        "hypothesis profile for generated shapes: ci (quick, derandomized), gpu (more and larger examples), "
        "nightly (thorough, random)",
        "PROFILE",
    )
)
add_setting(
    Setting(
        "lstmperf_seed",
        "--lstmperf-seed",
        "PYTEST_LSTMPERF_SEED",
        "lstmperf_seed",
        "0",
        parse_int(0),
        "seed of the weights and inputs drawn for each generated shape",
        "N",
    )
)

add_setting(
    Setting(
        "lstmperf_xla_cache",
        "--lstmperf-xla-cache",
        "PYTEST_LSTMPERF_XLA_CACHE",
        "lstmperf_xla_cache",
        "auto",
        lambda raw: raw.strip() or "auto",
        "persistent XLA compilation cache of the Keras-on-JAX worker: auto (~/.cache/pytest-lstmperf/xla, or "
        "under $XDG_CACHE_HOME), off (compile every executable afresh), or a folder. A JAX_COMPILATION_CACHE_DIR "
        "already set in the environment is used as it is",
        "DIR",
    )
)

add_setting(
    Setting(
        "lstmperf_threads",
        "--lstmperf-threads",
        "PYTEST_LSTMPERF_THREADS",
        "lstmperf_threads",
        "1",
        parse_int(1),
        "CPU threads of every framework on --device=cpu runs (torch, oneDNN, TensorFlow, XLA, ONNX Runtime): a "
        "fixed count makes timings comparable across runs and machines (one thread: as torch.utils.benchmark "
        "times); it is part of a CPU baseline's key",
        "N",
    )
)


# ------------------------------------------------------------------------------------- speed gate
#: the speed gate's default threshold, the smallest slowdown worth failing: a figure more than 5% above its
#: baseline's is slower where the benchmark resolves it (a device time resolves 2-5% between runs on an H100; a time
#: per call rarely does). The rule that applies it is :mod:`pytest_lstmperf.speed.policy`.
THRESHOLD = 1.05


def parse_threshold(raw: str) -> float:
    value = parse_float()(raw)
    if not 1.0 < value < 100.0:
        raise ValueError(f"{raw!r} must be a ratio above 1.0 (e.g. 1.10: 10% slower counts)")
    return value


#: the slowdown the gate promises to see on any machine (:data:`pytest_lstmperf.speed.policy.MAX_LIMIT`): the
#: coarsest resolution ``--lstmperf-resolution`` may ask for (asked for it, processes are bought only where a
#: benchmark cannot see it)
PROMISED = 1.5
#: the slowdown a recording and a compare aim to resolve by default (``--lstmperf-resolution``): the recording
#: times a benchmark in further processes (8 in all at most) and the compare too, only where one compare process
#: resolves a coarser slowdown and those processes would bring it there; a benchmark they cannot is named, not
#: failed. A fallback kernel is 5x slower or more; 1.10x is what a regression of one layer's code looks like
RESOLUTION_GOAL = 1.10


def parse_resolution(raw: str) -> float:
    value = parse_float()(raw)
    if not 1.0 < value <= PROMISED:
        raise ValueError(
            f"{raw!r} must be a ratio above 1.0 and at most {PROMISED} (the slowdown the gate sees on any machine; "
            "e.g. 1.10: buy processes until each benchmark resolves a 10% slowdown)"
        )
    return value


def _parse_dir(raw: str) -> str:
    return raw.strip()


#: the speed gate's settings (options added by :mod:`.hooks.bench`)
BENCH_SETTINGS = [
    add_setting(s).name
    for s in (
        Setting(
            "lstmperf_bench_set",
            "--lstmperf-bench-set",
            "PYTEST_LSTMPERF_BENCH_SET",
            "lstmperf_bench_set",
            "gate",
            parse_choice(("gate", "thorough")),
            "benchmark shapes: gate (quick, for merge gating) or thorough (DeepBench shapes, batch, hidden "
            "and sequence-length sweeps)",
            "SET",
        ),
        Setting(
            "lstmperf_save_baseline",
            "--lstmperf-save-baseline",
            "PYTEST_LSTMPERF_SAVE_BASELINE",
            "lstmperf_save_baseline",
            "false",
            parse_bool,
            "record this run's benchmarks missing from this device's baseline (existing entries are kept)",
        ),
        Setting(
            "lstmperf_update_baseline",
            "--lstmperf-update-baseline",
            "PYTEST_LSTMPERF_UPDATE_BASELINE",
            "lstmperf_update_baseline",
            "false",
            parse_bool,
            "record this run's benchmarks into this device's baseline, replacing existing entries",
        ),
        Setting(
            "lstmperf_add_baseline_run",
            "--lstmperf-add-baseline-run",
            "PYTEST_LSTMPERF_ADD_BASELINE_RUN",
            "lstmperf_add_baseline_run",
            "false",
            parse_bool,
            "add this run's figures (its processes') to the recorded baseline as more recording processes, "
            "without replacing any entry; a process outside an entry's limit is added and named, one more than 2x "
            "off the entry's figure is refused for that entry and named",
        ),
        Setting(
            "lstmperf_record_processes",
            "--lstmperf-record-processes",
            "PYTEST_LSTMPERF_RECORD_PROCESSES",
            "lstmperf_record_processes",
            "3",
            parse_int(1),
            "independent processes a recording times every benchmark in (this one and N-1 fresh pytest processes "
            "that run only the benchmarks): how far they lie apart is each benchmark's between-run noise",
            "N",
        ),
        Setting(
            "lstmperf_sweep",
            "--lstmperf-sweep",
            "PYTEST_LSTMPERF_SWEEP",
            "lstmperf_sweep",
            "5",
            parse_float(0.0, 600.0),
            "seconds, at least, over which the benchmarks whose figure is their time per call (every CPU benchmark) "
            "are timed again in slices as the run ends, where the gate compares or records, so that each figure "
            "spreads over the machine's changing state; 0: no sweep, each figure is its test's own rounds",
            "S",
        ),
        Setting(
            "lstmperf_accept_inconclusive",
            "--lstmperf-accept-inconclusive",
            "PYTEST_LSTMPERF_ACCEPT_INCONCLUSIVE",
            "lstmperf_accept_inconclusive",
            "false",
            parse_bool,
            "let --benchmark-compare pass when benchmarks are inconclusive (too few usable samples, not timed) or "
            "nothing was compared (every benchmark skipped or deselected); by default such a run fails",
        ),
        Setting(
            "lstmperf_baselines",
            "--lstmperf-baselines",
            "PYTEST_LSTMPERF_BASELINES",
            "lstmperf_baselines",
            "",
            _parse_dir,
            "folder of the device-keyed baselines (default: baselines/ at the rootdir)",
            "DIR",
        ),
        Setting(
            "lstmperf_threshold",
            "--lstmperf-threshold",
            "PYTEST_LSTMPERF_THRESHOLD",
            "lstmperf_threshold",
            str(THRESHOLD),
            parse_threshold,
            "the speed gate's threshold: a figure more than this ratio above its baseline's is slower, where the "
            "benchmark resolves it (marker lstmperf_threshold overrides per test)",
            "RATIO",
        ),
        Setting(
            "lstmperf_resolution",
            "--lstmperf-resolution",
            "PYTEST_LSTMPERF_RESOLUTION",
            "lstmperf_resolution",
            str(RESOLUTION_GOAL),
            parse_resolution,
            "the slowdown a recording and a compare aim to resolve (default 1.10): a benchmark that resolves a "
            "coarser one is timed in further processes (8 in all at most) where they would bring it there, and "
            "named where they would not; the verdict's rule is the same. 1.5, the slowdown the gate promises to see "
            "anywhere, buys processes only where a benchmark cannot see it, or would miss it more than one run in 20 "
            "(4 in all at most in a compare): the fastest runs",
            "RATIO",
        ),
        Setting(
            "lstmperf_report",
            "--lstmperf-report",
            "PYTEST_LSTMPERF_REPORT",
            "lstmperf_report",
            "",
            _parse_dir,
            "write a markdown and HTML speed report with PNG plots into DIR",
            "DIR",
        ),
    )
]


#: speed gate settings given as flags without a value on the command line
BENCH_FLAGS = (
    "lstmperf_save_baseline",
    "lstmperf_update_baseline",
    "lstmperf_add_baseline_run",
    "lstmperf_accept_inconclusive",
)


def add_options(parser: pytest.Parser, names: list[str] | None = None) -> None:
    group = parser.getgroup("lstmperf", "LSTM/GRU kernel, equivalence and speed checks (pytest-lstmperf)")
    for setting in SETTINGS.values():
        if names is not None and setting.name not in names:
            continue
        env = f" [env {setting.env}, ini {setting.ini}, default {setting.default}]"
        group.addoption(
            setting.option, dest=setting.name, default=None, metavar=setting.metavar, help=setting.help + env
        )
        # read as a string and validate ourselves: addini(type=...) errors are tracebacks
        parser.addini(setting.ini, help=setting.help, default=None)


def option_taken(parser: pytest.Parser, flag: str) -> bool:
    """Whether any plugin or conftest of this run has already declared ``flag``."""
    groups = [*getattr(parser, "_groups", ()), getattr(parser, "_anonymous", None)]
    return any(flag in opt.names() for group in groups if group is not None for opt in group.options)


def add_aliases(parser: pytest.Parser, names: list[str] | None = None) -> list[str]:
    """Add each setting's short alias (``--device``) that nobody else owns; returns the flags added.

    Called after the initial conftests declared their options, so a project whose conftest defines its own
    ``--device`` keeps it (the plugin's setting stays reachable as ``--lstmperf-device``).
    """
    group = parser.getgroup("lstmperf", "LSTM/GRU kernel, equivalence and speed checks (pytest-lstmperf)")
    added = []
    for setting in SETTINGS.values():
        if setting.alias is None or (names is not None and setting.name not in names):
            continue
        if option_taken(parser, setting.alias):
            continue
        group.addoption(
            setting.alias,
            dest=setting.alias_dest,
            default=None,
            metavar=setting.metavar,
            help=f"short for {setting.option}",
        )
        added.append(setting.alias)
    return added


def is_added(config: pytest.Config, name: str) -> bool:
    """Whether the setting's ini key was declared in this run (its module's options were added)."""
    try:
        config.getini(SETTINGS[name].ini)
    except ValueError:
        return False
    return True


def resolve(config: pytest.Config, name: str, then: Callable[[Any], Any] | None = None) -> Resolved:
    """The value of one setting and where it came from; raises pytest.UsageError on a bad value.

    ``then`` takes the parsed value to the setting's final one and raises ``ValueError`` on a bad one, reported
    as a bad value of the setting: a check that needs a higher layer (the registry of paths) than this module."""
    setting = SETTINGS[name]

    def parse(raw: str) -> Any:
        value = setting.parse(raw)
        return value if then is None else then(value)

    candidates: list[tuple[str, str | None]] = [
        (setting.option, config.getoption(setting.name, default=None)),
        *([(setting.alias, config.getoption(setting.alias_dest, default=None))] if setting.alias else []),
        (setting.env, os.environ.get(setting.env)),
        (f"ini {setting.ini}", config.getini(setting.ini) or None),
    ]
    for source, raw in candidates:
        if raw is not None and raw != "":
            try:
                return Resolved(parse(str(raw)), str(raw), source)
            except ValueError as exc:
                raise pytest.UsageError(f"{source}={raw}: {exc}") from None
    if setting.default is None:
        return Resolved(None, None, "default")
    return Resolved(parse(setting.default), None, "default")
