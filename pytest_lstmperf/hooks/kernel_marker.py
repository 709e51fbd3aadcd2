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
run's ``--device`` (``--lstmperf-device``). Where one test runs calls of different kernels by design (a packed
encoder runs the CPU's native kernel, its dense decoder oneDNN), a claim can be several families, any of which a
call may run (``cpu=("onednn", "cpu-native")``), or, stricter, a family per call: a mapping from a shell-style
pattern over the call's label (``"Seq2Seq.encoder call 1, packed B4 T<=10: LSTM(...)"``: module path, call
index, input shape, layer) to its families, the first matching pattern deciding (``cpu={"*packed*":
"cpu-native", "*": "onednn"}``); the backward pass, one for all layers, may run any family the claim names. A
device the claim does not name fails the test unless the test skips itself. Inside pytest-benchmark's timed
rounds the observer is paused (the dispatch mode would slow every op); the benchmark's last, untimed call is
observed.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
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
        "device (--device picks); a tuple allows any of several families, a mapping {pattern: family} claims per "
        "call (patterns over 'Model.encoder call 1, packed B4 T<=10: LSTM(...)'); the failure lists the "
        "explainer's reasons",
    )


@dataclass(frozen=True)
class Claim:
    """What a marker claims on the run's device: per call-label pattern (``"*"`` for a plain claim), the
    families a matching call may run; the first matching pattern decides."""

    rules: tuple[tuple[str, tuple[str, ...]], ...]

    @property
    def families(self) -> tuple[str, ...]:
        """Every family the claim names: what the backward pass (one for all layers) may run."""
        return tuple(dict.fromkeys(f for _, families in self.rules for f in families))

    def for_trace(self, trace: Any) -> tuple[str, ...]:
        """The families ``trace`` may run; () where no pattern matches its call."""
        if trace.phase == "backward":
            return self.families
        label = getattr(trace, "label", trace.detail)
        return next((families for pattern, families in self.rules if fnmatchcase(label, pattern)), ())

    def describe(self) -> str:
        if len(self.rules) == 1 and self.rules[0][0] == "*":
            return " or ".join(self.rules[0][1])
        return "; ".join(f"{' or '.join(families)} for calls {pattern!r}" for pattern, families in self.rules)


def _families(value: Any, where: str) -> tuple[str, ...]:
    """A family, or a tuple/list of families, checked against :data:`CLAIMABLE`."""
    families = (value,) if isinstance(value, str) else tuple(value) if isinstance(value, (tuple, list)) else ()
    if not families:
        raise pytest.UsageError(
            f"{where}: lstmperf_kernel: a claim is a kernel family, a tuple of families or a mapping "
            f"{{call pattern: family}}, got {value!r} (valid families: {', '.join(CLAIMABLE)})"
        )
    for family in families:
        if family not in CLAIMABLE:
            raise pytest.UsageError(
                f"{where}: lstmperf_kernel: unknown kernel family {family!r} (valid: {', '.join(CLAIMABLE)})"
            )
    return families


def claim_of(value: Any, where: str = "lstmperf_kernel") -> Claim:
    """The :class:`Claim` a marker argument makes: a family, a tuple of families, or ``{pattern: families}``."""
    if isinstance(value, Claim):
        return value
    if isinstance(value, Mapping):
        if not value or not all(isinstance(k, str) for k in value):
            raise pytest.UsageError(
                f"{where}: lstmperf_kernel: a per-call claim maps call patterns (str, such as '*packed*' or "
                f"'*.encoder *') to families, got {dict(value)!r}"
            )
        return Claim(tuple((pattern, _families(v, where)) for pattern, v in value.items()))
    return Claim((("*", _families(value, where)),))


def _judged(trace: Any, claim: Claim, precision: str | None) -> tuple[bool, str]:
    """Whether ``trace`` met the claim (any of its families for the call), and the reason where not."""
    from ..numerics.checks import check_trace  # imports numpy: kept out of pytest's start-up

    families = claim.for_trace(trace)
    if not families:
        return False, "no pattern of the claim matches this call"
    where = f"{trace.phase} {getattr(trace, 'label', trace.detail)}".strip()
    return any(not check_trace((f, precision or trace.precision), trace, where) for f in families), ""


def _grouped(texts: list[str]) -> list[str]:
    """One line per call of a layer that erred alike (a cell called per step), its call numbers merged."""
    groups: dict[str, list[str]] = {}
    for text in texts:
        number = re.search(r" call (\d+),", text)
        key = re.sub(r" call \d+,", " call {},", text) if number else text
        groups.setdefault(key, []).append(number.group(1) if number else "")
    lines = []
    for key, numbers in groups.items():
        if len(numbers) == 1:
            lines.append("  " + key.replace("{}", numbers[0]))
            continue
        first, last = numbers[0], numbers[-1]
        span = f"calls {first}-{last}" if numbers == [str(n) for n in range(int(first), int(last) + 1)] else ""
        text = key.replace("call {},", f"{span or 'calls ' + ', '.join(numbers)},") if first else key
        lines.append(f"  {len(numbers)}x {text}")
    return lines


def verdict_problem(seen: Observation, kernel: str | Claim | Any, precision: str | None = None) -> str | None:
    """The failure message, or ``None`` when every recurrent layer call ran what ``kernel`` claims for it (a
    family, a tuple of families or ``{call pattern: families}``: :func:`claim_of`) and ``precision``, judged
    by the suites' rule (:func:`pytest_lstmperf.numerics.checks.check_trace`)."""
    claim = claim_of(kernel)
    ran = seen.all_traces()
    if seen.problems:  # a layer that ran but could not be described is never passed in silence
        return "lstmperf_kernel: " + "; ".join(dict.fromkeys(seen.problems))
    wrong = []
    for trace in ran:
        ok, why = _judged(trace, claim, precision)
        if not ok:
            wrong.append(trace.describe() + (f" ({why})" if why else ""))
    if ran and not wrong:
        return None
    want = claim.describe() + (f"/{precision}" if precision else "")
    if not ran:
        head = "no LSTM/GRU layer ran in this test (nothing to check: is the model recurrent, and did it run?)"
    else:
        head = f"{len(wrong)} of {len(ran)} recurrent layer calls did not:"
    lines = [f"lstmperf_kernel: expected {want}; {head}"]
    lines += _grouped(wrong)
    lines += _explanations(seen)
    if set(claim.families) & {"cudnn", "cuda-generic"} and any(
        framework in ("torch", "torch-cell") and where != "cuda" for framework, _, where in seen.layers
    ):
        lines.append(
            f"note: {claim.describe()} needs a GPU: input on the CPU: cuDNN needs a CUDA tensor; move the module and "
            "its input to a CUDA device (.to('cuda')), or claim the CPU's kernel with cpu=... (onednn for an nn.LSTM)"
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


class NoClaimForDevice(Exception):
    """The marker names families for other devices only (``cuda=`` on a CPU run): a test that skips itself
    is skipped; one that runs fails with this message."""


def _expected(
    args: tuple[Any, ...], kwargs: Mapping[str, Any], where: str, device: str = "cpu"
) -> tuple[Claim, str | None]:
    """The claim for ``device`` (the positional one, or ``cpu=``/``cuda=``: a family, a tuple of families or a
    mapping ``{call pattern: families}``, :func:`claim_of`) and the precision."""
    unknown = set(kwargs) - {"precision", *DEVICES}
    if unknown:
        raise pytest.UsageError(
            f"{where}: unknown lstmperf_kernel arguments {sorted(unknown)} (valid: precision, cpu, cuda)"
        )
    per_device = {d: kwargs[d] for d in DEVICES if kwargs.get(d) is not None}
    if len(args) > 1 or (args and per_device) or not (args or per_device):
        raise pytest.UsageError(
            f"{where}: lstmperf_kernel takes one claim (a kernel family, a tuple of them, or {{call pattern: "
            f"family}}), or one per device as cpu=/cuda= (valid families: {', '.join(CLAIMABLE)}), got {args!r} "
            f"{per_device or ''}".rstrip()
        )
    claims = {d: claim_of(value, where) for d, value in ({"*": args[0]} if args else per_device).items()}
    if args:
        return claims["*"], kwargs.get("precision")
    if device not in claims:
        raise NoClaimForDevice(
            f"{where}: lstmperf_kernel names no kernel for device {device} (given: {', '.join(per_device)}); "
            f"add {device}=... or run with --device={'/'.join(per_device)}, or skip the test on {device}"
        )
    return claims[device], kwargs.get("precision")


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
    no_claim = bad_marker = ""
    try:
        kernel, precision = _expected(marker.args, marker.kwargs, item.nodeid, selected_device(item.config))
    except NoClaimForDevice as exc:
        no_claim = str(exc)
    except pytest.UsageError as exc:
        bad_marker = str(exc)
    if bad_marker:
        pytest.fail(bad_marker, pytrace=False)
    if no_claim:  # nothing to check on this device: a test that skips itself (pytest.skip) is skipped
        yield
        pytest.fail(no_claim, pytrace=False)
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
    def expect(self, kernel: Any = None, precision: str | None = None, **per_device: Any) -> Iterator[Observation]:
        args = (kernel,) if kernel is not None else ()
        kwargs = {"precision": precision, **per_device}
        try:
            claim, precision = _expected(args, kwargs, "expect()", selected_device(self.config))
        except NoClaimForDevice as exc:
            raise pytest.UsageError(str(exc)) from exc
        with observe() as seen:
            yield seen
        problem = verdict_problem(seen, claim, precision)
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
