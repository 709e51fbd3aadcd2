"""What one path did on a user's own model, and how it is judged (:func:`.verify_model.verify_model`'s rule): the
types the runners fill (:class:`ModelRun` per pass, :class:`PathOutcome` per path), the envelope spec that sizes
the tolerance, and :func:`conclude`, which judges a path's kernels (by :func:`.checks.judge_trace`) and numbers
(against :func:`.tolerance.bound_of_what_ran`). The torch and Keras runners (:mod:`.verify_torch`,
:mod:`.verify_keras`) import this module; :mod:`.verify_model` imports them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import paths as registry
from ..model.spec import LayerSpec
from ..observation.claims import current_versions
from .checks import Mismatch, format_failure, judge_trace, relative_error
from .tolerance import MAX_REL, Tolerance, ToleranceTooLoose, bound_of_what_ran

SEED = 0


class ModelCheckFailed(AssertionError):
    """A path of the user's model disagreed with what it claims; the message is the suites' failure report."""


class NotComparedWarning(UserWarning):
    """Outputs or gradients of a path were not compared (their bound would reach ``tolerance.MAX_REL``) and the
    caller did not accept them by name: the check is inconclusive for them, never a pass."""


class KnownFindingWarning(UserWarning):
    """A path ran something other than it claims, as a documented known finding says it does; its numbers
    were checked against the bound of what ran and passed."""


@dataclass
class PathOutcome:
    """What one path of the model did: the kernel per recurrent layer call, the errors, the mismatches."""

    path: str
    traces: list[Any] = field(default_factory=list)
    errors: dict[str, float] = field(default_factory=dict)
    mismatches: list[Mismatch] = field(default_factory=list)
    skipped: str | None = None
    report: str = ""
    #: tensors not compared, with why (a bound that would reach ``tolerance.MAX_REL``: bf16 gradients of large
    #: layers); listed in the report; ``verify_model`` raises for them unless accepted by name
    unchecked: list[str] = field(default_factory=list)
    #: the names of the quantities in ``unchecked`` (``"grad lstm.weight_hh_l0"``), in the same order
    unchecked_quantities: list[str] = field(default_factory=list)
    #: those of ``unchecked_quantities`` the caller accepted (``verify_model(accept_unchecked=...)``)
    accepted: list[str] = field(default_factory=list)
    #: the known findings that explained a departure from the claim ("forward LSTM(...): <why>"), not failed
    known: list[str] = field(default_factory=list)
    #: pass -> the bound its tensors were held to ("onednn/fp32 forward 2.9e-06")
    bounds: dict[str, str] = field(default_factory=dict)

    @property
    def not_compared(self) -> list[str]:
        """The quantities not compared that the caller did not accept: each makes the path inconclusive."""
        return [q for q in self.unchecked_quantities if q not in self.accepted]

    @property
    def ok(self) -> bool:
        """Ran, met every check, and compared everything it was not told to leave out."""
        return self.skipped is None and not self.mismatches and not self.not_compared


@dataclass
class ModelRun:
    """One run of the model (the float64 reference, or a path): outputs and gradients as float64 arrays, the
    trace of every recurrent layer call, and each layer's spec as it was called (torch models)."""

    outputs: list[np.ndarray]
    grads: dict[str, np.ndarray]
    traces: list[Any]
    layer_shapes: dict[str, LayerSpec]
    #: recurrent layer calls that ran but could not be observed: each fails the path (never a silent pass)
    problems: list[str] = field(default_factory=list)
    #: the model has parameters outside its recurrent layers (they run in the path's precision: :func:`_pass_bound`)
    other_layers: bool = False
    #: (layer name, spec) of every ``nn.LSTM``/``nn.GRU`` call in call order (torch models): each call's own
    #: shape (packed or dense), judged against the path's claim for that call (:func:`call_claim`)
    call_specs: list[tuple[str, LayerSpec]] = field(default_factory=list)

    def quantities(self) -> dict[str, np.ndarray]:
        """Every output and gradient by name (``"output 0"``, ``"grad lstm.weight_hh_l0"``)."""
        return {f"output {i}": v for i, v in enumerate(self.outputs)} | {f"grad {k}": v for k, v in self.grads.items()}


def envelope_spec(specs: Sequence[LayerSpec]) -> LayerSpec:
    """One spec whose growth bounds the model's: depth summed, widths and length the largest."""
    return LayerSpec(
        cell=specs[0].cell,
        input_size=max(s.input_size for s in specs),
        hidden_size=max(s.hidden_size for s in specs),
        num_layers=sum(s.num_layers * s.directions for s in specs),
        seq_len=max(s.seq_len for s in specs),
        batch=max(s.batch for s in specs),
    )


# ------------------------------------------------------------------------------------------ entry point
def model_paths(device: str, names: Sequence[str] | None = None) -> list[Any]:
    """The PyTorch paths a user's model runs on ``device`` (``cpu``/``cuda``): the registry's non-packed ones."""
    kind = device.split(":")[0]
    chosen = registry.for_device(kind, names)
    return [p for p in chosen if p.framework == "torch" and not p.options.get("packed")]


def call_claim(path: registry.ExecutionPath, spec: LayerSpec) -> tuple[str, str] | None:
    """What ``path`` claims for one layer call of a user's model, judged per call; ``None`` where the path makes
    no claim for it (a GRU on the oneDNN path: listed, not judged). A packed call (``PackedSequence``) on a
    path of dense tensors runs what PyTorch runs for packed input under that path's switches, as the suites'
    packed paths claim: on the CPU the native kernel (never oneDNN: ``torch-cpu-packed``), except a packed LSTM
    whose sequences all have one length, which PyTorch 2.13 on hands to oneDNN like a dense batch; on CUDA the
    path's own kernel (cuDNN runs packed input, the generic path too)."""
    if spec.length_mode != "packed" or path.options.get("packed"):
        return None if path.supports(spec) is not None else path.expected(spec)
    dense = spec.replace(length_mode="none", lengths=None)
    if path.supports(dense) is not None:
        return None
    if path.device == "cpu" and path.kernel == "onednn":
        packed_path = registry.get("torch-cpu-packed")
        kernel, _ = packed_path.expected(spec.replace(dtype="float32"))
        return kernel, path.precision
    return path.expected(dense)


# ------------------------------------------------------------------------------------------ judging
def conclude(
    outcome: PathOutcome,
    path: Any,
    run: ModelRun,
    ref: ModelRun,
    claimed: tuple[str, str],
    spec: LayerSpec,
    keras: bool = False,
    sensitivity: Any = None,
) -> None:
    """Judge ``run`` (kernels, numbers) and write the outcome's mismatches and report."""
    outcome.traces = run.traces
    mismatches = _check_kernels(path, run, outcome.known, claimed if keras else None)
    mismatches += [Mismatch("kernel", "observation", problem) for problem in dict.fromkeys(run.problems)]
    outcome.mismatches = mismatches + _check_numbers(run, ref, claimed, spec, outcome, sensitivity)
    lines = [f"  observed: {t.describe()}" for t in run.traces]
    lines += [f"  known finding (expected, not failed): {line}" for line in outcome.known]
    lines += [f"  bound: {bound}" for bound in outcome.bounds.values()]
    lines += [f"  not checked: {line}" for line in outcome.unchecked]
    outcome.report = format_failure(path.name, spec, SEED, outcome.mismatches) + "\n" + "\n".join(lines)


def _judge(path: Any, expected: tuple[str, str], trace: Any, where: str, known: list[str]) -> list[Mismatch]:
    """One trace against the claim, by the suites' rule (:func:`pytest_lstmperf.numerics.checks.judge_trace`): a
    difference that known findings of ``path`` document is added to ``known`` (with the versions note), any other
    is a mismatch."""
    found, explained = judge_trace(path, expected, trace, where)
    if not explained:
        return found
    versions = current_versions(getattr(path, "framework", "torch"))
    known += [f"{where}: [{f.check}: observed {f.observed}] {f.describe(versions)}" for f in explained]
    return []


def _check_kernels(path: Any, run: ModelRun, known: list[str], claim: tuple[str, str] | None = None) -> list[Mismatch]:
    """Each forward layer call against the path's claim for that layer; the backward pass against the claim
    shared by every claimed layer (when they differ, the backward pass is listed, not judged). With ``claim``
    (a Keras path: one claim for every layer), every traced layer call and pass against it."""
    found: list[Mismatch] = []
    claims = set()
    none_ran = Mismatch("kernel", "forward", "no recurrent layer ran in the model's forward pass")
    if claim is not None:  # Keras: TensorFlow traces the whole block (phase "test"), torch each layer call
        if not any(t.family != "none" for t in run.traces):
            return [none_ran]
        return [m for t in run.traces for m in _judge(path, claim, t, f"{t.phase} {t.label}", known)]
    forward = [t for t in run.traces if t.phase == "forward"]
    if not forward:
        return [none_ran]
    calls: dict[str, list[LayerSpec]] = {}
    for name, call_spec in run.call_specs:
        calls.setdefault(name, []).append(call_spec)
    for trace in forward:
        queue = calls.get(trace.detail)
        spec = queue.pop(0) if queue else run.layer_shapes.get(trace.detail)
        expected = None if spec is None else call_claim(path, spec)
        if spec is None or expected is None:
            continue
        claims.add(expected)
        where = f"forward {trace.label}" + (f" on {spec.short()}" if spec.length_mode == "packed" else "")
        found += _judge(path, expected, trace, where, known)
    if len(claims) == 1:
        for trace in (t for t in run.traces if t.phase == "backward"):
            found += _judge(path, next(iter(claims)), trace, "backward", known)
    return found


def _pass_bound(
    run: ModelRun, pass_: str, claimed: tuple[str, str], spec: LayerSpec, other_layers: bool = False
) -> Tolerance:
    """The bound of ``pass_`` by the suites' rule, :func:`pytest_lstmperf.numerics.tolerance.bound_of_what_ran`
    over the kernel family and precision of every trace of the pass: fp16 where bf16 was claimed is held to
    fp16; fp32 kernels where TF32 is allowed keep the TF32 bound; the claim's where nothing was traced; where the
    layers ran different kernels, the loosest of their bounds (the model errs no less than its least precise
    layer). On top of it, a model with ``other_layers`` (parameters outside its recurrent layers) runs them in
    the path's precision (autocast casts a ``Linear`` to bf16 whatever cuDNN ran), so the claim's (family,
    precision) joins what ran: on the H100 the translation model's attention gradients, computed in bf16, failed
    the fp16 bound of its cuDNN GRUs (3.5e-2 against 1.9e-2)."""
    ran = [(t.family, t.precision) for t in run.traces if t.phase == pass_]
    return bound_of_what_ran(claimed, [*ran, claimed] if other_layers else ran, pass_, spec)


def _check_numbers(
    run: ModelRun,
    ref: ModelRun,
    claimed: tuple[str, str],
    spec: LayerSpec,
    outcome: PathOutcome,
    sensitivity: Any = None,
) -> list[Mismatch]:
    """Every output and gradient: finite, and within the bound of what its pass ran (:func:`_pass_bound`),
    widened by the model's ``sensitivity`` where it exceeds the canonical data's; fills ``outcome.errors``,
    ``outcome.bounds`` and ``outcome.unchecked``."""
    found: list[Mismatch] = []
    pairs: list[tuple[str, str, np.ndarray | None, np.ndarray]] = [
        ("forward", f"output {i}", v, r) for i, (v, r) in enumerate(zip(run.outputs, ref.outputs, strict=True))
    ]
    pairs += [("backward", f"grad {k}", run.grads.get(k), r) for k, r in ref.grads.items()]
    for pass_, quantity, value, reference in pairs:
        if value is None:
            found.append(Mismatch("missing", quantity, f"{quantity}: the path computed none"))
            continue
        if not np.isfinite(value).all():
            bad = int((~np.isfinite(value)).sum())
            found.append(Mismatch("nan", quantity, f"{quantity}: {bad} of {value.size} values are NaN or Inf"))
            continue
        err = relative_error(value, reference)
        outcome.errors[quantity] = err
        try:
            tol = _pass_bound(run, pass_, claimed, spec, run.other_layers)
        except ToleranceTooLoose as exc:
            if pass_ == "forward":  # an output that cannot be checked is a failure, never a pass
                found.append(Mismatch("inconclusive", quantity, f"{quantity}: not checkable: {exc}"))
            else:
                _not_compared(outcome, quantity, f"{quantity}: not compared (relative error {err:.3e}): {exc}")
            continue
        bound, why = tol.rel, tol.explain()
        if sensitivity is not None and sensitivity.factor(quantity, pass_) > 1.0:
            bound *= sensitivity.factor(quantity, pass_)
            why += "; " + sensitivity.explain(quantity, pass_)
            if bound >= MAX_REL:
                over = f", above the unwidened bound {tol.rel:.3g}" if err > tol.rel else ""
                text = (
                    f"{quantity}: not compared (relative error {err:.3e}{over}): the widened bound {bound:.3g} "
                    f"reaches {MAX_REL} ({why})"
                )
                if pass_ == "forward":
                    found.append(Mismatch("inconclusive", quantity, text))
                else:
                    _not_compared(outcome, quantity, text)
                continue
            # the report says which bound was widened, by how much and why, pass or fail
            outcome.bounds[quantity] = f"{quantity} {bound:.3g} ({sensitivity.explain(quantity, pass_)})"
        outcome.bounds.setdefault(pass_, f"{tol.family}/{tol.precision} {pass_} {tol.rel:.3g}")
        if err > bound:
            found.append(
                Mismatch(
                    "tolerance",
                    quantity,
                    f"{quantity}: relative error {err:.3e} against the float64 run exceeds the "
                    f"{tol.family}/{tol.precision} {pass_} tolerance {bound:.3e} ({err / bound:.1f}x; tolerance {why})",
                )
            )
    return found


def _not_compared(outcome: PathOutcome, quantity: str, text: str) -> None:
    outcome.unchecked.append(text)
    outcome.unchecked_quantities.append(quantity)
