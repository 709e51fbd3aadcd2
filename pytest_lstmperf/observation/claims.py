"""What satisfies a claim, and the known findings: documented upstream behaviours that make a path run
something other than it claims.

The one rule for whether an observed kernel and precision satisfy a claim (:func:`differences`, with the
precision rule :func:`satisfies`; :func:`same_kernel` and every claim check are built on it), the one table of
known findings, and the one lookup of the findings that explain a trace (:func:`explain_trace`; the suites and
``verify_model`` judge a trace with it through :func:`pytest_lstmperf.numerics.checks.judge_trace`, the
benchmarks through :func:`known_kernel_finding`). A known finding changes only what a path is *expected* to
run (its kernel family or precision); it never switches off the path's numbers: the equivalence suite checks
every path for NaN/Inf and against the bound of the precision it actually ran in, whatever is documented here
(see :mod:`pytest_lstmperf.numerics.equivalence`).

Each finding carries the versions it was seen with. On those versions it *applies*; on others it is
*re-confirmed* (the mismatch is still a finding, reported as "re-confirmed on torch X (first seen on Y)"),
never assumed. A finding that is no longer observed is reported too ("not observed ...; remove it").

Paths defined outside this package (tests, users) may still document findings in
``ExecutionPath.options["known_findings"]`` as ``{(check, observed): why}``; those carry no versions and
apply on every version.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Protocol


class Claimant(Protocol):
    """What a claim check reads of a path (an :class:`~pytest_lstmperf.paths.ExecutionPath`): its name, the
    kernel family and precision it claims, and its framework (for the versions a finding is keyed by); its
    ``options``, where it has them, may document findings of its own."""

    @property
    def name(self) -> str: ...
    @property
    def kernel(self) -> str: ...
    @property
    def precision(self) -> str: ...
    @property
    def framework(self) -> str: ...


@dataclass
class Finding:
    """A path that disagreed with what it claims: reported in the summary, and failing its test."""

    path: str
    check: str  # "kernel", "precision", "tolerance", "nan", "pairwise", "oom"
    spec: str
    message: str


@dataclass(frozen=True)
class KnownFinding:
    """``path`` observed ``observed`` where it claims otherwise, for ``check``:

    - ``"kernel"``: ``observed`` is the kernel family that runs (``"cpu-native"``);
    - ``"precision"``: ``observed`` is the precision that runs (``"fp16"``);
    - ``"raises"``: the path raises an error whose ``"Type: message"`` the regular expression ``observed``
      matches; nothing ran to check;
    - ``"order"``: ``observed`` is ``"time-reversed"``: the output sequence comes back in the other time order.
      Its numbers are still checked, all of them: the outputs reversed in time, and the gradients against a
      reference whose output gradient is reversed the same way (what the path's own loss sees), must pass
      the bound of what ran; anything else is a failure.
    """

    path: str
    check: str
    observed: str
    why: str
    seen_with: dict[str, str] = field(default_factory=dict, hash=False)

    def version_note(self, versions: dict[str, str]) -> str:
        """'' on the versions it was seen with; else "re-confirmed on torch 2.13 (first seen on torch 2.11)"."""
        differing = [k for k, v in self.seen_with.items() if versions.get(k) and not _same(versions[k], v)]
        if not differing:
            return ""
        now = ", ".join(f"{k} {versions[k]}" for k in differing)
        then = ", ".join(f"{k} {self.seen_with[k]}" for k in differing)
        return f"re-confirmed on {now} (first seen on {then})"

    def describe(self, versions: dict[str, str]) -> str:
        note = self.version_note(versions)
        return f"{self.why} [{note}]" if note else self.why


def _same(current: str, seen: str) -> bool:
    """``"2.11.0+cu130"`` matches ``"2.11"``: a seen version matches the current one it prefixes."""
    current = current.split("+")[0]
    return current == seen or current.startswith(seen + ".")


_AUTOCAST_BF16 = (
    "torch.autocast(dtype=torch.bfloat16) runs the cuDNN RNN in float16, not bfloat16: PyTorch's autocast "
    "wrapper of aten::_cudnn_rnn casts to half whatever the autocast dtype (kernels elemWiseRNNcell<__half,...>); "
    "its numbers are checked against the fp16 bound"
)

_JAX_BACKWARDS = (
    "Keras 3.15.1 on JAX: an LSTM with go_backwards=True that goes to cuDNN (jax.experimental.rnn.lstm) returns "
    "its output sequence in input order, where Keras returns the processed (reversed) order on every other path: "
    "keras/src/backend/jax/rnn.py cudnn_lstm() flips the inputs, then flips the outputs back; the final states "
    "are right. Numbers checked with the outputs reversed in time"
)
_JAX_FP16 = (
    "Keras 3.15.1 on JAX 0.11.2: an LSTM under the mixed_float16 policy is sent to cuDNN "
    "(jax.experimental.rnn.lstm) in float16, which the cudnn_rnn lowering rejects: ValueError 'Unknown output "
    "type float16' at compile time; the layer cannot run at all (no fallback)"
)
_JAX_FP16_BIDI = (
    "Keras 3.15.1 on JAX: under mixed_float16 a Bidirectional LSTM goes to Keras's fused bidirectional cuDNN call, "
    "which runs in float32, not float16 (observed: float32 element types entering the recurrent op; "
    "keras/src/backend/jax/rnn.py bidirectional_lstm() packs the float32 variables into the weight buffer without "
    "casting them to the compute dtype); its numbers are checked against the bound of what ran"
)
_JAX = {"keras": "3.15.1", "jax": "0.11.2"}
_INDUCTOR_TRAINING = (
    "torch.compile(mode='reduce-overhead') with allow_rnn=True: the compiled training step fails in the backward "
    "pass on CUDA (RuntimeError 'The size of tensor a (T) must match the size of tensor b (B)', or 'accessing "
    "tensor output of CUDAGraphs that has been overwritten'), while the compiled forward agrees with eager; "
    "compiled RNN backward is upstream work in progress (pytorch/pytorch#158007, #185163)"
)

#: the documented findings of the built-in paths
KNOWN_FINDINGS: tuple[KnownFinding, ...] = (
    KnownFinding("torch-cuda-autocast-bf16", "precision", "fp16", _AUTOCAST_BF16, {"torch": "2.11", "cudnn": "91900"}),
    KnownFinding("keras-jax-cudnn-backwards", "order", "time-reversed", _JAX_BACKWARDS, _JAX),
    KnownFinding("keras-jax-cudnn-mixed-fp16", "raises", "Unknown output type float16", _JAX_FP16, _JAX),
    KnownFinding("keras-jax-cudnn-mixed-fp16", "precision", "tf32", _JAX_FP16_BIDI, _JAX),
    KnownFinding(
        "torch-compile-inductor-graphs",
        "raises",
        r"size of tensor a \(\d+\) must match the size of tensor b|accessing tensor output of CUDAGraphs that has been "
        "overwritten",
        _INDUCTOR_TRAINING,
        {"torch": "2.11"},
    ),
)


def _from_options(path: Any) -> list[KnownFinding]:
    raw = getattr(path, "options", {}).get("known_findings")
    if not isinstance(raw, dict):
        return []
    return [KnownFinding(path.name, check, observed, str(why)) for (check, observed), why in raw.items()]


def findings_for(path: Any) -> list[KnownFinding]:
    """Every known finding of ``path``: the table's, then those of its own options."""
    return [f for f in KNOWN_FINDINGS if f.path == path.name] + _from_options(path)


def lookup(path: Any, check: str, observed: str) -> KnownFinding | None:
    """The known finding that explains ``path`` observing ``observed`` for ``check``, else None."""
    return next((f for f in findings_for(path) if f.check == check and f.observed == observed), None)


@lru_cache(maxsize=4)
def current_versions(framework: str = "torch") -> dict[str, str]:
    """The versions a finding is keyed by, of the framework a path runs (imported lazily)."""
    versions: dict[str, str] = {}
    try:
        import torch

        versions["torch"] = torch.__version__
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        if cudnn:
            versions["cudnn"] = str(cudnn)
    except ImportError:
        pass
    if framework.startswith("keras"):
        versions.update(_distribution_versions("keras", *(("jax", "jaxlib") if framework == "keras-jax" else ())))
    return versions


def _distribution_versions(*names: str) -> dict[str, str]:
    """Installed versions without importing the packages (the Keras paths run in worker processes)."""
    import contextlib
    import importlib.metadata

    found = {}
    for name in names:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[name] = importlib.metadata.version(name)
    return found


def known_error(path: Any, error: BaseException) -> KnownFinding | None:
    """The ``"raises"`` finding whose expression the error's ``"Type: message"`` matches, else None."""
    import re

    text = f"{type(error).__name__}: {error}"
    return next((f for f in findings_for(path) if f.check == "raises" and re.search(f.observed, text)), None)


def explain_trace(
    path: Any, expected: tuple[str, str], trace: Any, same_precision: Callable[[str, str], bool] | None = None
) -> list[KnownFinding] | None:
    """The known findings that explain every difference between ``expected`` (family, precision) and the
    observed ``trace``: [] when there is none, None when one is not explained. ``same_precision(a, b)`` says
    whether observed precision ``b`` meets claimed ``a`` (default :func:`satisfies`)."""
    observed = (trace.family, trace.precision)
    found = [lookup(path, check, seen) for check, seen in differences(expected, observed, same_precision)]
    explained = [f for f in found if f is not None]
    return explained if len(explained) == len(found) else None


#: a claimed precision is met by these observed ones: "tf32" means TF32 math is *allowed*; where the library
#: picks full fp32 kernels for a shape (small layers, persistent kernels) the pass is more precise, not less
SATISFIES = {"tf32": ("tf32", "fp32")}


def satisfies(claimed: str, observed: str) -> bool:
    """Whether an observed precision meets the claimed one (the rule every claim check uses)."""
    return observed in SATISFIES.get(claimed, (claimed,))


def either_satisfies(a: str, b: str) -> bool:
    """Two observed precisions agree: either satisfies the other (fp32 and tf32 count as one: TF32 is inferred
    from GEMM kernel names, which an RNN kernel may or may not show)."""
    return satisfies(a, b) or satisfies(b, a)


def differences(
    claim: tuple[str, str], observed: tuple[str, str], same_precision: Callable[[str, str], bool] | None = None
) -> list[tuple[str, str]]:
    """Where an observation (family, precision) departs from a claim (family, precision): ``("kernel", observed
    family)`` where the family differs, ``("precision", observed precision)`` where ``same_precision(claimed,
    observed)`` (default :func:`satisfies`) says the precision does not meet the claim; [] where the observation
    meets the claim. The one claim check: the suites' kernel and precision checks
    (:func:`pytest_lstmperf.numerics.checks.check_trace`), the known findings (:func:`explain_trace`) and the
    benchmarks' (:func:`same_kernel`) all decide by it."""
    same_precision = same_precision or satisfies
    (family, precision), (seen_family, seen_precision) = claim, observed
    found = [("kernel", seen_family)] if seen_family != family else []
    return found + ([("precision", seen_precision)] if not same_precision(precision, seen_precision) else [])


def same_kernel(then: str, now: str) -> bool:
    """Two ``family/precision`` observations agree: same family, and either precision satisfies the other
    (:func:`either_satisfies`)."""
    family_then, _, precision_then = then.partition("/")
    family_now, _, precision_now = now.partition("/")
    return not differences((family_then, precision_then), (family_now, precision_now), either_satisfies)


def kernel_mismatch(path: Claimant, trace: Any) -> str:
    """The benchmarks' kernel check: a message when the observed kernel family or precision is not what the
    path claims, else ''. It is :func:`same_kernel`, not :func:`satisfies`: fp32 and tf32 count as one precision
    in both directions (TF32 is inferred from GEMM kernel names, which a cuDNN RNN kernel does not always show);
    the equivalence suite's tolerances tell them apart.
    """
    expected = f"{path.kernel}/{path.precision}"
    observed = f"{trace.family}/{trace.precision}"
    if same_kernel(expected, observed):
        return ""
    kernels = ", ".join(k[:90] for k in trace.kernels[:6]) or "-"
    ops = ", ".join(trace.ops[:10]) or "-"
    return (
        f"{path.name}: expected kernel {expected}, observed {observed} (ops seen: {ops}; GPU kernels seen: {kernels})"
    )


def known_kernel_finding(path: Claimant, trace: Any) -> str | None:
    """The documented upstream behaviour that explains a kernel mismatch, else None: every differing part
    must be explained by a known finding (the one table the equivalence suites read too); on versions other
    than it was seen with, the text says it was re-confirmed."""
    found = explain_trace(path, (path.kernel, path.precision), trace, either_satisfies)
    if not found:
        return None
    versions = current_versions(path.framework)
    return "; ".join(f.describe(versions) for f in found)
