"""The one module that reaches into pytest-benchmark beyond its public hooks, options and fixture attributes.

The rest of the package uses pytest-benchmark's public surface only: the hooks
``pytest_benchmark_generate_machine_info`` (the machine info computed once, in a thread),
``pytest_benchmark_update_machine_info`` and ``pytest_benchmark_update_json`` (the ``lstmperf`` sections),
``pytest_benchmark_generate_commit_info`` and ``pytest_benchmark_update_commit_info`` (a baseline's header);
the ``benchmark`` fixture's ``pedantic``, ``enabled``, ``group``, ``extra_info`` and ``stats``; the
``--benchmark-*`` options, read with ``config.getoption``. What follows has no public route; each function
names what it touches:

* :func:`set_compare` writes ``config.option.benchmark_compare``. pytest-benchmark reads the option once, in its
  ``trylast`` ``pytest_configure`` (``BenchmarkSession.__init__``), and loads the files it names there
  (``handle_loading``); no hook chooses what it compares against
  (``pytest_benchmark_compare_machine_info`` sees each file only after it was loaded). Written before that
  configure runs, the option points pytest-benchmark's comparison table at the
  hardware's baseline; on a pytest-xdist worker it is emptied (the controller compares).
* :func:`reload_compare` sets ``config._benchmarksession.compare`` and calls its ``handle_loading()`` again: a
  ``--benchmark-compare`` that is the gate's only once collection shows lstmperf benchmarks must be reloaded
  after configure, and pytest-benchmark has no hook or option to reload.
* :func:`storage_has_run` looks a name up in ``--benchmark-storage`` as pytest-benchmark's ``FileStorage``
  does (its default ``file://./.benchmarks``, run files ``*NAME*.json``): pytest-benchmark answers only with a
  warning, once it has loaded nothing.
* :func:`runner_wrapped` replaces the ``benchmark`` fixture's ``_make_runner`` for one test: its calibration,
  warm-up and timed rounds run through the runner it makes, its last call does not. Wrapping the public
  ``benchmark(fn)``/``pedantic`` would wrap that last call too, or (wrapping ``fn``) put the wrapper's cost
  inside every timed call.
* :func:`benchmark_replaced` puts another object in ``item.funcargs["benchmark"]`` while the test function
  runs and gives the fixture back after: pytest-benchmark's ``pytest_runtest_makereport`` raises unless the
  value there is its ``BenchmarkFixture``, and a plugin may not define a ``benchmark`` fixture of its own.
* :func:`default_machine_info` calls ``pytest_benchmark.plugin.pytest_benchmark_generate_machine_info`` (the
  default implementation) from a thread: calling the hook would call this plugin's own implementation, which
  waits on that thread. :func:`machine_info_generated_elsewhere` tells, by module name, whether a conftest or
  another plugin implements that hook (then its machine info is used, not the thread's).
* :func:`quiet_xdist_warning` ignores pytest-benchmark's "Benchmarks are automatically disabled because xdist"
  warning, which it issues by its message text at unconfigure, where no option or hook turns it off.
* :func:`load_timer` reads a ``--benchmark-timer`` value with ``pytest_benchmark.utils.load_timer``, so that rounds
  timed without pytest-benchmark (under pytest-xdist) use its clock; the fixture exposes no public timer.
* :func:`statistics` computes a benchmark's ``stats`` with ``pytest_benchmark.stats.Stats``, so that the JSON
  written without pytest-benchmark (a baseline, the merged pytest-xdist JSON) holds its statistics.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

#: pytest-benchmark's default implementations (and so its machine info) live in this module
PLUGIN_MODULE = "pytest_benchmark.plugin"
#: pytest-benchmark's default ``--benchmark-storage``
DEFAULT_STORAGE = "file://./.benchmarks"


# ----------------------------------------------------------------------------------- --benchmark-compare
def set_compare(config: pytest.Config, value: object) -> None:
    """What pytest-benchmark compares against (a file path, or ``[]`` for nothing), before it reads it."""
    config.option.benchmark_compare = value


def reload_compare(config: pytest.Config) -> None:
    """pytest-benchmark loads what ``--benchmark-compare`` now names (after :func:`set_compare`, once
    configured); nothing where pytest-benchmark has no session."""
    bench_session = getattr(config, "_benchmarksession", None)
    if bench_session is not None:
        bench_session.compare = config.option.benchmark_compare
        bench_session.handle_loading()


def storage_has_run(config: pytest.Config, name: str) -> bool:
    """Whether pytest-benchmark's storage (``--benchmark-storage``, a ``file://`` folder) holds a run whose file
    name contains ``name``, as pytest-benchmark's own ``--benchmark-compare=NAME`` looks it up."""
    raw = str(config.getoption("benchmark_storage", None) or DEFAULT_STORAGE)
    if not raw.startswith("file://"):
        return True  # another storage (elasticsearch): pytest-benchmark looks itself
    folder = Path(raw[len("file://") :])
    if not folder.is_absolute():
        folder = Path(config.invocation_params.dir) / folder
    return folder.is_dir() and any(name in p.name for p in folder.rglob("*.json"))


# ----------------------------------------------------------------------------------- the fixture
@contextlib.contextmanager
def runner_wrapped(item: pytest.Item, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Iterator[None]:
    """While the block runs, every runner that ``item``'s ``benchmark`` fixture makes for its calibration,
    warm-up and timed rounds is ``wrap(runner)``; nothing where the test has no such fixture."""
    bench: Any = getattr(item, "funcargs", {}).get("benchmark")  # pytest-benchmark's fixture, or None
    make_runner = getattr(bench, "_make_runner", None)
    if make_runner is None:
        yield
        return

    def wrapped_runner(*args: Any, **kwargs: Any) -> Any:
        return wrap(make_runner(*args, **kwargs))

    bench._make_runner = wrapped_runner
    try:
        yield
    finally:
        del bench._make_runner


@contextlib.contextmanager
def benchmark_replaced(item: pytest.Function, replacement: Any) -> Iterator[Any]:
    """The test function gets ``replacement`` as its ``benchmark`` argument; pytest-benchmark gets its own
    fixture back (yielded) for its report."""
    funcargs = item.funcargs
    plain = funcargs["benchmark"]
    funcargs["benchmark"] = replacement
    try:
        yield plain
    finally:
        funcargs["benchmark"] = plain


# ----------------------------------------------------------------------------------- machine info
def default_machine_info() -> dict[str, Any]:
    """pytest-benchmark's own machine info (its CPU probe runs py-cpuinfo), without calling the hook."""
    from pytest_benchmark.plugin import pytest_benchmark_generate_machine_info as generate

    info: dict[str, Any] = generate()  # pytest-benchmark is untyped
    return info


def machine_info_generated_elsewhere(config: pytest.Config, own_module: str) -> bool:
    """Whether ``pytest_benchmark_generate_machine_info`` has an implementation other than pytest-benchmark's
    and ``own_module``'s (a conftest's or another plugin's)."""
    hook = config.pluginmanager.hook.pytest_benchmark_generate_machine_info
    return any(getattr(impl.plugin, "__name__", "") not in (own_module, PLUGIN_MODULE) for impl in hook.get_hookimpls())


# ----------------------------------------------------------------------------------- warnings, statistics
def quiet_xdist_warning() -> None:
    """pytest-benchmark's warning that it disabled itself under pytest-xdist is not shown."""
    import warnings

    warnings.filterwarnings("ignore", message="Benchmarks are automatically disabled because xdist")


def statistics(data: Sequence[float]) -> dict[str, Any]:
    """pytest-benchmark's statistics of ``data`` (seconds per call, one per round), as its JSON holds them."""
    from pytest_benchmark.stats import Stats

    stats = Stats()
    for value in data:
        stats.update(value)
    out: dict[str, Any] = stats.as_dict()  # pytest-benchmark is untyped
    return out


def load_timer(raw: str) -> Any:
    """The clock a ``--benchmark-timer`` value names, as pytest-benchmark loads it."""
    from pytest_benchmark.utils import load_timer as load

    return load(raw).target
