"""``@pytest.mark.lstmperf_kernel("cudnn")`` and the ``lstmperf_kernel`` fixture: fail a user's test whose LSTM/GRU
layers do not run the kernel they must, with the explainer's reasons.

While the marked test (or a ``with lstmperf_kernel.expect("cudnn"):`` block) runs, the observer records:

* per call of a recurrent layer (``nn.LSTM``/``nn.GRU``/``nn.RNN``, their cells, a Keras ``LSTM``/``GRU`` on the
  torch backend), the ATen ops it dispatched, hence its kernel family and precision; ops of the backward pass
  are judged together (autograd does not say which layer a backward op belongs to); Keras on TensorFlow is
  judged per pass from the TensorFlow op trace; a Keras ``LSTM``/``GRU`` on JAX per call, from the HLO that XLA
  compiles the layer's call to (:func:`pytest_lstmperf.observation.calls._jax_layer_traces`);
* every Keras ``LSTM``/``GRU`` whose ``inner_loop`` runs, and every ``torch.nn.LSTM``/``GRU`` called, so that a
  failure explains each of them.

Frameworks imported while the block runs are observed from their import on. Each observed call must satisfy
the claim by the suites' own rule (:func:`pytest_lstmperf.numerics.checks.check_trace`); a test in which no recurrent
layer ran fails too (the marker would otherwise pass vacuously: an MLP's matmuls and sigmoid/tanh are not an
LSTM). The claim can name one kernel family, or one per device (``cpu="onednn", cuda="cudnn"``), chosen by the
run's ``--device`` (``--lstmperf-device``). Inside pytest-benchmark's timed rounds the observer is paused (the
dispatch mode would slow every op); the benchmark's last, untimed call is observed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from ..observation.calls import CELL_FRAMEWORK, Observation, device_of, observe
from ..observation.eligibility import cell_verdict
from ..observation.explain import ExplainError, explain
from ..observation.families import CLAIMABLE
from ..observation.layer_trace import paused
from ..session import device_kind, run_device
from ..speed.benchmark_adapter import runner_wrapped

MARKER = "lstmperf_kernel"
DEVICES = ("cpu", "cuda")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(kernel=None, *, precision=None, cpu=None, cuda=None): fail unless every LSTM/GRU call in the "
        f"test runs this kernel family ({', '.join(CLAIMABLE)}) [and precision]; cpu=/cuda= name the family per "
        "device (--device picks); the failure lists the explainer's reasons",
    )


def verdict_problem(seen: Observation, kernel: str, precision: str | None = None) -> str | None:
    """The failure message, or ``None`` when every recurrent layer call ran ``kernel`` (and ``precision``),
    judged by the suites' rule (:func:`pytest_lstmperf.numerics.checks.check_trace`)."""
    from ..numerics.checks import check_trace  # imports numpy: kept out of pytest's start-up

    ran = seen.all_traces()
    if seen.problems:  # a layer that ran but could not be described is never passed in silence
        return "lstmperf_kernel: " + "; ".join(dict.fromkeys(seen.problems))
    wrong = []
    for trace in ran:
        where = f"{trace.phase} {trace.detail}".strip()
        if check_trace((kernel, precision or trace.precision), trace, where):
            wrong.append(trace)
    if ran and not wrong:
        return None
    want = kernel + (f"/{precision}" if precision else "")
    if not ran:
        head = "no LSTM/GRU layer ran in this test (nothing to check: is the model recurrent, and did it run?)"
    else:
        head = f"{len(wrong)} of {len(ran)} recurrent layer calls did not:"
    lines = [f"lstmperf_kernel: expected {want}; {head}"]
    counts: dict[str, int] = {}
    for trace in wrong:
        counts[trace.describe()] = counts.get(trace.describe(), 0) + 1
    lines += [f"  {n}x {text}" if n > 1 else f"  {text}" for text, n in counts.items()]
    lines += _explanations(seen)
    if kernel in ("cudnn", "cuda-generic") and any(
        framework in ("torch", "torch-cell") and where != "cuda" for framework, _, where in seen.layers
    ):
        lines.append(
            f"note: {kernel} needs a GPU: input on the CPU: cuDNN needs a CUDA tensor; move the module and its "
            "input to a CUDA device (.to('cuda')), or claim the CPU's kernel with cpu=... (onednn for an nn.LSTM)"
        )
    return "\n".join(lines)


def _explanations(seen: Observation) -> list[str]:
    lines: list[str] = []
    for framework, spec, options_or_device in seen.layers:
        try:
            if framework == CELL_FRAMEWORK:  # a cell call: no cuDNN or oneDNN kernel on any device
                verdict = cell_verdict(spec, device_of("torch", options_or_device))
            elif framework == "torch":
                verdict = explain(spec, "torch", device_of(framework, options_or_device))
            else:
                verdict = explain(spec, framework, device_of(framework, None), options_or_device)
            line = "explainer: " + verdict.describe()
        except (ExplainError, ValueError) as exc:
            line = f"explainer: cannot judge {spec.short()}: {exc}"
        if line not in lines:  # a layer called once per step is explained once
            lines.append(line)
    return lines + [f"note: {p}" for p in seen.problems]


def selected_device(config: pytest.Config | None) -> str:
    """``cpu`` or ``cuda``: the run's ``--device`` (``auto``: a GPU when torch sees one), by the session's rule
    (:func:`pytest_lstmperf.session.device_kind`)."""
    return device_kind(config)


def _expected(args: tuple, kwargs: Mapping[str, Any], where: str, device: str = "cpu") -> tuple[str, str | None]:
    """The claimed family for ``device`` (the positional one, or ``cpu=``/``cuda=``) and precision."""
    unknown = set(kwargs) - {"precision", *DEVICES}
    if unknown:
        raise pytest.UsageError(
            f"{where}: unknown lstmperf_kernel arguments {sorted(unknown)} (valid: precision, cpu, cuda)"
        )
    per_device = {d: kwargs[d] for d in DEVICES if kwargs.get(d) is not None}
    if len(args) > 1 or (args and per_device) or not (args or per_device):
        raise pytest.UsageError(
            f"{where}: lstmperf_kernel takes one kernel family, or one per device as cpu=/cuda= "
            f"(valid families: {', '.join(CLAIMABLE)}), got {args!r} {per_device or ''}".rstrip()
        )
    for family in (*args, *per_device.values()):
        if family not in CLAIMABLE:
            raise pytest.UsageError(
                f"{where}: lstmperf_kernel: unknown kernel family {family!r} (valid: {', '.join(CLAIMABLE)})"
            )
    if args:
        return args[0], kwargs.get("precision")
    if device not in per_device:
        raise pytest.UsageError(
            f"{where}: lstmperf_kernel names no kernel for device {device} (given: {', '.join(per_device)}); "
            f"add {device}=... or run with --device={'/'.join(per_device)}"
        )
    return per_device[device], kwargs.get("precision")


@contextlib.contextmanager
def _benchmark_unobserved(item: pytest.Item, seen: Observation) -> Iterator[None]:
    """Pause the observer in pytest-benchmark's timed (and calibration, warm-up) rounds."""

    def unobserved(runner: Any) -> Any:
        def run(loops_range: Any, *rest: Any, **kw: Any) -> Any:
            if seen.recorder is None:
                return runner(loops_range, *rest, **kw)
            with paused(seen.recorder):
                return runner(loops_range, *rest, **kw)

        return run

    with runner_wrapped(item, unobserved):
        yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    marker = item.get_closest_marker(MARKER)
    if marker is None:
        return (yield)
    try:
        kernel, precision = _expected(marker.args, marker.kwargs, item.nodeid, selected_device(item.config))
    except pytest.UsageError as exc:
        bad_marker = str(exc)
    else:
        bad_marker = ""
    if bad_marker:
        pytest.fail(bad_marker, pytrace=False)
    with observe() as seen, _benchmark_unobserved(item, seen):
        result = yield
    problem = verdict_problem(seen, kernel, precision)
    if problem:
        pytest.fail(problem, pytrace=False)
    return result


class KernelExpectation:
    """The ``lstmperf_kernel`` fixture: ``with lstmperf_kernel.expect("cudnn"): model(x)``, or
    ``expect(cpu="onednn", cuda="cudnn")`` to claim per device (the run's ``--device`` picks)."""

    def __init__(self, config: pytest.Config | None = None) -> None:
        self.config = config

    @contextlib.contextmanager
    def expect(
        self, kernel: str | None = None, precision: str | None = None, **per_device: str
    ) -> Iterator[Observation]:
        args = (kernel,) if kernel is not None else ()
        kwargs = {"precision": precision, **per_device}
        kernel, precision = _expected(args, kwargs, "expect()", selected_device(self.config))
        with observe() as seen:
            yield seen
        problem = verdict_problem(seen, kernel, precision)
        if problem:
            pytest.fail(problem, pytrace=False)


@pytest.fixture
def lstmperf_kernel(pytestconfig: pytest.Config) -> KernelExpectation:
    """Check the kernel of the LSTM/GRU calls inside ``with lstmperf_kernel.expect(family):``."""
    return KernelExpectation(pytestconfig)


@pytest.fixture
def lstmperf_device(pytestconfig: pytest.Config) -> str:
    """The torch device string the run selected with ``--device`` (``cpu``, ``cuda``, ``cuda:1``); a GPU
    that was asked for and is not usable is a usage error."""
    return run_device(pytestconfig).torch_device
