"""Equivalence on a user's own model: every execution path of the device against a float64 run of the model.

:func:`verify_model` takes a ``torch.nn.Module`` with its real weights and example inputs, and runs a copy of it
on each PyTorch path of the selected device (the registry's non-packed paths: cuDNN fp32 / default math, generic
CUDA, CPU oneDNN / native, autocast fp16 / bf16), with only that path's switches changed. It checks, as the
suites do on their own layers:

* the kernel of every recurrent layer call (forward, per call) and of the backward pass, against what the path
  claims for that layer (:meth:`ExecutionPath.expected`, judged by :func:`pytest_lstmperf.numerics.checks.check_trace`);
  a layer the path does not claim (a GRU on the oneDNN path: PyTorch has no oneDNN GRU) is listed, not judged;
* every output and every gradient (w.r.t. the parameters and the floating-point inputs) against the float64
  run of a deep copy of the model on the CPU, within the tolerance of the kernel family and precision the
  pass was observed to run (:func:`pytest_lstmperf.numerics.tolerance.tolerance`), and finite.

Known findings (:mod:`pytest_lstmperf.observation.claims`, the suites' one table and lookup) apply as in the
suites: a departure from the path's claim that a finding documents (bf16 autocast running cuDNN in fp16 on the
H100) is reported as that finding (:class:`KnownFindingWarning`, ``PathOutcome.known``), not failed; it changes
only what the path is expected to run, never whether its numbers are checked: NaN/Inf always fail, and every
tensor is held to the bound of what ran (fp16 there).

The tolerance's growth comes from an *envelope* spec of the recurrent layers found in the model: depth = the
sum of their layers (a cell called in a loop counts one layer), width = the largest input and hidden sizes,
length = the longest sequence one layer call saw (a cell's number of calls per forward). Stacked layers
compound their errors like the layers of one ``nn.LSTM``, which is what the suites measured.

Dropout is set to 0 in the copies (each path would draw other random numbers); the user's model is not changed.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..model.spec import Cell, LayerSpec
from .checks import Mismatch, bound_precision, check_trace, format_failure, relative_error
from .tolerance import tolerance

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


# ------------------------------------------------------------------------------------------ model walking
def recurrent_layers(model: Any) -> list[Any]:
    import torch

    kinds = (torch.nn.RNNBase, torch.nn.RNNCellBase)
    return [m for m in model.modules() if isinstance(m, kinds)]


def layer_spec(module: Any, seq_len: int = 1, batch: int = 1) -> LayerSpec:
    """The LayerSpec of one torch recurrent module (a cell is a one-layer, one-step layer)."""
    import torch

    cell: Cell = "gru" if isinstance(module, (torch.nn.GRU, torch.nn.GRUCell)) else "lstm"
    return LayerSpec(
        cell=cell,
        input_size=module.input_size,
        hidden_size=module.hidden_size,
        num_layers=getattr(module, "num_layers", 1),
        bidirectional=bool(getattr(module, "bidirectional", False)),
        proj_size=getattr(module, "proj_size", 0) or 0,
        bias=bool(module.bias),
        batch=batch,
        seq_len=seq_len,
    )


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


def _map_tensors(value: Any, fn: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)):
        mapped = [_map_tensors(v, fn) for v in value]
        return type(value)(mapped) if not hasattr(value, "_fields") else type(value)(*mapped)
    if isinstance(value, dict):
        return {k: _map_tensors(v, fn) for k, v in value.items()}
    return value


def _tensors(value: Any) -> list[Any]:
    found: list[Any] = []

    def keep(t: Any) -> Any:
        found.append(t)
        return t

    _map_tensors(value, keep)
    return found


def _without_dropout(model: Any) -> Any:
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd):
            module.p = 0.0
        if isinstance(module, torch.nn.RNNBase):
            module.dropout = 0.0
    return model.train()


# ------------------------------------------------------------------------------------------ one run
@dataclass
class _Run:
    outputs: list[np.ndarray]
    grads: dict[str, np.ndarray]
    traces: list[Any]
    layer_shapes: dict[str, LayerSpec]
    #: recurrent layer calls that ran but could not be observed: each fails the path (never a silent pass)
    problems: list[str] = field(default_factory=list)
    #: the model has parameters outside its recurrent layers (they run in the path's precision: :func:`_pass_bound`)
    other_layers: bool = False


def _run(model: Any, inputs: tuple, device: str, dtype: Any, path: Any = None) -> _Run:
    """Forward and backward of a copy of ``model`` on ``device`` in ``dtype``, under ``path``'s switches."""
    import torch

    from ..observation.torch_trace import LayerRecorder, torch_layer_trace

    copy_ = _without_dropout(copy.deepcopy(model)).to(device=device, dtype=dtype)
    args = _map_tensors(inputs, lambda t: t.detach().to(device=device, dtype=dtype if t.is_floating_point() else None))
    leaves = [t for t in _tensors(args) if t.is_floating_point()]
    for leaf in leaves:
        leaf.requires_grad_(True)
    shapes = _shape_hooks(copy_)
    recorder = LayerRecorder()
    with _switches(path), torch_layer_trace(recorder), _default_dtype(torch, dtype):
        with _autocast(path, device):
            out = copy_(*args)
        outs = [t for t in _tensors(out) if t.is_floating_point()]
        generator = torch.Generator().manual_seed(SEED)
        seeds = [torch.randn(t.shape, generator=generator, dtype=torch.float64) for t in outs]
        loss = sum((t.to(torch.float64) * s.to(t.device)).sum() for t, s in zip(outs, seeds, strict=True))
        loss.backward()
    for handle in shapes.pop("_handles"):
        handle.remove()
    grads = {name: p.grad for name, p in copy_.named_parameters() if p.grad is not None}
    grads.update({f"input {i}": leaf.grad for i, leaf in enumerate(leaves) if leaf.grad is not None})
    recurrent = {
        id(p)
        for m in copy_.modules()
        if isinstance(m, (torch.nn.RNNBase, torch.nn.RNNCellBase))
        for p in m.parameters()
    }
    return _Run(
        outputs=[t.detach().double().cpu().numpy() for t in outs],
        grads={k: v.detach().double().cpu().numpy() for k, v in grads.items()},
        traces=recorder.traces(),
        layer_shapes=shapes,
        other_layers=any(id(p) not in recurrent for p in copy_.parameters()),
    )


@contextlib.contextmanager
def _default_dtype(torch: Any, dtype: Any) -> Any:
    """``dtype`` as torch's default floating dtype for the run: tensors the model makes itself without a dtype
    (``torch.zeros(1, 1, hidden)`` for a first hidden state) follow the run's dtype, float64 in the reference."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _shape_hooks(model: Any) -> dict[str, Any]:
    """Records each recurrent layer's spec with the batch and length it was called with."""
    import torch

    from ..observation.torch_trace import _layer_name

    specs: dict[str, Any] = {"_handles": []}
    for module in model.modules():
        if not isinstance(module, (torch.nn.RNNBase, torch.nn.RNNCellBase)):
            continue

        def hook(mod: Any, args: tuple, _name: str = _layer_name(module)) -> None:
            data = args[0]
            data = getattr(data, "data", data)
            if isinstance(mod, torch.nn.RNNCellBase):
                seen = specs.get(_name)
                specs[_name] = layer_spec(mod, (seen.seq_len + 1) if seen else 1, int(data.shape[0]))
            elif data.dim() == 3:
                t, b = (data.shape[1], data.shape[0]) if mod.batch_first else (data.shape[0], data.shape[1])
                specs[_name] = layer_spec(mod, int(t), int(b))
            else:
                specs[_name] = layer_spec(mod, int(data.shape[0]), 1)

        specs["_handles"].append(module.register_forward_pre_hook(hook))
    return specs


def _switches(path: Any) -> contextlib.AbstractContextManager:
    import torch

    from ..paths.torch_paths import path_switches

    return path_switches(torch, {} if path is None else path.options)


def _autocast(path: Any, device: str) -> contextlib.AbstractContextManager:
    import torch

    from ..paths.torch_paths import path_autocast

    return path_autocast(torch, {} if path is None else path.options, device.split(":")[0])


# ------------------------------------------------------------------------------------------ checks
def _judge(path: Any, expected: tuple[str, str], trace: Any, where: str, known: list[str]) -> list[Mismatch]:
    """One trace against the claim, by the suites' rule: a difference that a known finding of ``path``
    documents is added to ``known`` (with the versions note), any other is a mismatch."""
    from ..observation.claims import current_versions, explain_trace

    found = check_trace(expected, trace, where)
    explained = explain_trace(path, expected, trace) if found else None
    if not explained:
        return found
    versions = current_versions(getattr(path, "framework", "torch"))
    known += [f"{where}: [{f.check}: observed {f.observed}] {f.describe(versions)}" for f in explained]
    return []


def _check_kernels(path: Any, run: _Run, known: list[str], claim: tuple[str, str] | None = None) -> list[Mismatch]:
    """Each forward layer call against the path's claim for that layer; the backward pass against the claim
    shared by every claimed layer (when they differ, the backward pass is listed, not judged). With ``claim``
    (a Keras path: one claim for every layer), every traced layer call and pass against it."""
    found: list[Mismatch] = []
    claims = set()
    none_ran = Mismatch("kernel", "forward", "no recurrent layer ran in the model's forward pass")
    if claim is not None:  # Keras: TensorFlow traces the whole block (phase "test"), torch each layer call
        if not any(t.family != "none" for t in run.traces):
            return [none_ran]
        return [m for t in run.traces for m in _judge(path, claim, t, f"{t.phase} {t.detail}", known)]
    forward = [t for t in run.traces if t.phase == "forward"]
    if not forward:
        return [none_ran]
    for trace in forward:
        spec = run.layer_shapes.get(trace.detail)
        if spec is None or path.supports(spec) is not None:
            continue
        claims.add(path.expected(spec))
        found += _judge(path, path.expected(spec), trace, f"forward {trace.detail}", known)
    if len(claims) == 1:
        for trace in (t for t in run.traces if t.phase == "backward"):
            found += _judge(path, next(iter(claims)), trace, "backward", known)
    return found


def _pass_bound(run: _Run, pass_: str, claimed: tuple[str, str], spec: LayerSpec, other_layers: bool = False) -> Any:
    """The bound of ``pass_`` by the suites' rule: that of the kernel family and precision its traces observed
    (:func:`pytest_lstmperf.checks.bound_precision`: fp16 where bf16 was claimed is held to fp16; fp32 kernels
    where TF32 is allowed keep the TF32 bound); the claim's where nothing was traced. Where the layers ran
    different kernels, the loosest of their bounds (the model errs no less than its least precise layer). A model
    with ``other_layers`` (parameters outside its recurrent layers) runs them in the path's precision (autocast
    casts a ``Linear`` to bf16 whatever cuDNN ran), so the claim's bound joins: on the H100 the translation
    model's attention gradients, computed in bf16, failed the fp16 bound of its cuDNN GRUs (3.5e-2 against
    1.9e-2)."""
    ran = {(t.family, bound_precision(claimed[1], t.precision)) for t in run.traces if t.phase == pass_}
    if other_layers:
        ran.add(claimed)
    bounds = [tolerance(precision, pass_, spec, family) for family, precision in sorted(ran or {claimed})]
    return max(bounds, key=lambda b: b.rel)


def _sensitivity(model: Any, inputs: tuple, ref: _Run, spec: LayerSpec, device: str = "cpu") -> Any:
    """This model's sensitivity on its own data against the canonical data's (:mod:`.sensitivity`)."""
    import torch

    from .sensitivity import Sensitivity, canonical, perturb, relative_changes

    named = _named

    def moved(rng: np.random.Generator) -> dict[str, np.ndarray]:
        twin = copy.deepcopy(model).to("cpu", torch.float64)
        with torch.no_grad():
            for param in twin.parameters():
                param.copy_(torch.from_numpy(perturb(param.numpy(), rng)))

        def jitter(t: Any) -> Any:
            return torch.from_numpy(perturb(t.detach().cpu().double().numpy(), rng)) if t.is_floating_point() else t

        return named(_run(twin, _map_tensors(inputs, jitter), device, torch.float64))

    return Sensitivity(relative_changes(named(ref), moved), canonical(spec))


def _check_numbers(
    run: _Run, ref: _Run, claimed: tuple[str, str], spec: LayerSpec, outcome: PathOutcome, sensitivity: Any = None
) -> list[Mismatch]:
    """Every output and gradient: finite, and within the bound of what its pass ran (:func:`_pass_bound`),
    widened by the model's ``sensitivity`` where it exceeds the canonical data's; fills ``outcome.errors``,
    ``outcome.bounds`` and ``outcome.unchecked``."""
    from .tolerance import MAX_REL, ToleranceTooLoose

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


# ------------------------------------------------------------------------------------------ entry point
def model_paths(device: str, names: Sequence[str] | None = None) -> list[Any]:
    """The PyTorch paths a user's model runs on ``device`` (``cpu``/``cuda``): the registry's non-packed ones."""
    from .. import paths as registry

    kind = device.split(":")[0]
    chosen = registry.for_device(kind, names)
    return [p for p in chosen if p.framework == "torch" and not p.options.get("packed")]


def verify_model(
    model: Any,
    example_inputs: Any,
    *,
    device: str = "cpu",
    paths: Sequence[str] | None = None,
    raise_on_failure: bool = True,
    accept_unchecked: Sequence[str] = (),
) -> list[PathOutcome]:
    """Run ``model`` (a ``torch.nn.Module``, its real weights) on every applicable path of ``device`` and
    compare outputs and gradients with a float64 run of it on the same device; raise :class:`ModelCheckFailed`
    with the suites' report when a path disagrees, or when a gradient could not be compared (its bound would
    reach ``tolerance.MAX_REL``) and is not named in ``accept_unchecked`` (``"grad lstm.weight_hh_l0"`` for
    every path, ``"torch-cpu-autocast-bf16: grad lstm.weight_hh_l0"`` for one; shell-style patterns such as
    ``"*-autocast-bf16: grad *"`` accept every quantity they match, and must match one). ``raise_on_failure=False``
    returns the outcomes only, and warns (:class:`NotComparedWarning`) of what was not compared.

    ``example_inputs``: one tensor or a tuple of positional arguments (nested tuples, e.g. ``(h0, c0)``, are
    fine; integer tensors such as token ids are left as they are)."""
    if isinstance(accept_unchecked, str):
        accept_unchecked = (accept_unchecked,)
    if hasattr(model, "_flatten_layers"):  # a Keras model (on the torch backend also an nn.Module)
        outcomes = verify_keras_model(model, example_inputs, device=device, paths=paths)
        return _finish(outcomes, raise_on_failure, accept_unchecked)
    import torch

    from ..device import resolve_device

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"verify_model takes a torch.nn.Module or a Keras model, got {type(model).__name__}")
    if not recurrent_layers(model):
        raise ValueError(f"{type(model).__name__} has no recurrent layer (nn.LSTM, nn.GRU, nn.RNN or a cell)")
    inputs = example_inputs if isinstance(example_inputs, tuple) else (example_inputs,)
    info = resolve_device(device, "device")
    selected = model_paths(info.kind, paths)
    if not selected:
        raise ValueError(f"no PyTorch path for {info.name} in {paths!r} (see `lstmperf paths`)")
    # the reference runs where the paths run: a model that makes tensors on its device (a first hidden state on
    # the tutorial's global ``device``) runs there, and float64 on a GPU is as exact as on the CPU for every
    # bound used (the tightest, fp32 forward, is about 1e-7; float64 errs about 1e-16 per operation)
    where = info.torch_device
    try:
        ref = _run(model, inputs, where, torch.float64)
    except Exception as exc:
        raise ValueError(f"the float64 reference run of {type(model).__name__} on {where} {_raised(exc)}") from exc
    if not ref.layer_shapes:
        raise ValueError(f"no recurrent layer of {type(model).__name__} ran on the example inputs")
    spec = envelope_spec(list(ref.layer_shapes.values()))
    sensitivity = _sensitivity(model, inputs, ref, spec, where)
    outcomes = [_verify_path(model, inputs, info, path, ref, spec, sensitivity) for path in selected]
    return _finish(outcomes, raise_on_failure, accept_unchecked)


def _accept(outcomes: list[PathOutcome], accept_unchecked: Sequence[str]) -> None:
    """Mark the accepted quantities of each outcome; a name that matches no quantity of the model is a
    ``ValueError`` naming the valid ones (a typo must not leave something unchecked in silence)."""
    from fnmatch import fnmatchcase

    from .. import paths as registry

    known = {q for o in outcomes for q in (*o.errors, *o.unchecked_quantities)}
    # a path may be named that this device does not run (one test accepting the bf16 paths of CPU and GPU)
    paths = set(registry.all_paths()) | {o.path for o in outcomes}
    for name in accept_unchecked:
        path, sep, quantity = str(name).partition(": ")
        if not sep:
            path, quantity = "*", str(name)
        if not any(fnmatchcase(q, quantity) for q in known) or not any(fnmatchcase(p, path) for p in paths):
            valid = ", ".join(sorted(known)) or "none"
            raise ValueError(
                f"accept_unchecked: {name!r} names no quantity of this model (valid: a quantity, or "
                f"'<path>: <quantity>' with a registered path (`lstmperf paths`); shell-style patterns such as "
                f"'*-autocast-bf16: grad *' match several; quantities: {valid})"
            )
        for o in outcomes:
            if fnmatchcase(o.path, path):
                o.accepted += [q for q in o.unchecked_quantities if fnmatchcase(q, quantity) and q not in o.accepted]


def _finish(
    outcomes: list[PathOutcome], raise_on_failure: bool, accept_unchecked: Sequence[str] = ()
) -> list[PathOutcome]:
    """Warn of each known finding of a path that passed; raise the failed paths' reports, and the paths that
    left quantities not compared that the caller did not accept (``raise_on_failure=False``: warn of them)."""
    import warnings

    _accept(outcomes, accept_unchecked)
    for o in outcomes:
        if o.known and not o.mismatches:
            bounds = "; ".join(o.bounds.values()) or "-"
            text = f"known finding on {o.path}: {' | '.join(o.known)}; numbers checked against the bound of what ran"
            warnings.warn(KnownFindingWarning(f"{text} ({bounds}) and passed"), stacklevel=3)
    failed = [o for o in outcomes if o.mismatches]
    open_ = [o for o in outcomes if o.not_compared and not o.mismatches]
    blocks = [o.report for o in failed]
    for o in open_:
        lines = [line for line, q in zip(o.unchecked, o.unchecked_quantities, strict=True) if q not in o.accepted]
        blocks.append(
            f"path {o.path}: {len(lines)} quantity(ies) not compared (inconclusive, never a pass); accept them by "
            f"name with verify_model(..., accept_unchecked=[...]) or leave this path out with paths=[...]:\n"
            + "\n".join(f"  not compared: {line}" for line in lines)
        )
    if blocks and raise_on_failure:
        raise ModelCheckFailed("\n".join(blocks))
    for o in open_:
        warnings.warn(
            NotComparedWarning(f"{o.path}: not compared (inconclusive): {', '.join(o.not_compared)}"), stacklevel=3
        )
    return outcomes


def _conclude(
    outcome: PathOutcome,
    path: Any,
    run: _Run,
    ref: _Run,
    claimed: tuple,
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


def _verify_path(
    model: Any, inputs: tuple, info: Any, path: Any, ref: _Run, spec: LayerSpec, sensitivity: Any = None
) -> PathOutcome:
    import torch

    outcome = PathOutcome(path.name)
    reason = path.available(info)
    if reason:
        outcome.skipped = reason
        return outcome
    try:
        run = _run(model, inputs, info.torch_device, torch.float32, path)
    except Exception as exc:  # the model cannot run this path: a failure of the path, with what happened
        text = f"the model, run on {info.torch_device} in float32 under this path's switches, {_raised(exc)}"
        outcome.mismatches = [Mismatch("error", "run", text)]
        outcome.report = format_failure(path.name, spec, SEED, outcome.mismatches)
        return outcome
    claimed = [s for s in ref.layer_shapes.values() if path.supports(s) is None]
    claim = path.expected(claimed[0]) if claimed else (path.kernel, path.precision)
    _conclude(outcome, path, run, ref, claim, spec, sensitivity=sensitivity)
    return outcome


def _raised(exc: Exception) -> str:
    """``raised <type>: <first line>``, with what to change where the cause is a dtype fixed inside the model."""
    text = f"raised {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:300]}"
    if "same device" in str(exc) or "Expected all tensors to be on the same device" in str(exc):
        text += (
            ". verify_model moves a copy of the model and its inputs to each run's device; a tensor the forward "
            "makes on a fixed device (torch.zeros(..., device=device) with a module-level device) stays there: "
            "make it on the input's device (device=input.device) or the parameters' "
            "(next(self.parameters()).device)"
        )
    elif "dtype" in str(exc) or "scalar type" in str(exc):
        text += (
            ". verify_model casts the model's parameters and floating-point inputs to each path's dtype (float64 "
            "for the reference, float32 for the paths; tensors the model makes with no dtype follow it); a model "
            "that fixes a dtype in its forward (torch.zeros(..., dtype=torch.double), x.float()) runs in that "
            "dtype only: make them like the input (dtype=input.dtype, device=input.device)"
        )
    return text


# ------------------------------------------------------------------------------------------ Keras models
def _as_float64(config: Any) -> Any:
    """A Keras model config with every float32 dtype (policy) turned float64; integer inputs stay."""
    if isinstance(config, dict):
        if config.get("class_name") == "DTypePolicy" and config.get("config", {}).get("name") == "float32":
            return {**config, "config": {**config["config"], "name": "float64"}}
        return {k: ("float64" if k == "dtype" and v == "float32" else _as_float64(v)) for k, v in config.items()}
    if isinstance(config, list):
        return [_as_float64(v) for v in config]
    return config


def _keras_variant(model: Any, float64: bool = False, use_cudnn: Any = None) -> Any:
    """A clone of ``model`` with its weights, in float64 and/or with ``use_cudnn`` set on every LSTM/GRU."""
    config = model.get_config()
    if float64:
        config = _as_float64(config)
    if use_cudnn is not None:
        config = _set_use_cudnn(config, use_cudnn)
    clone = type(model).from_config(config)
    weights = model.get_weights()
    clone.set_weights([w.astype("float64") if float64 and w.dtype.kind == "f" else w for w in weights])
    return clone


def _keras_reference(model: Any) -> Any:
    """The float64 clone of ``model`` the paths are compared with. On the JAX backend its LSTM/GRU layers get
    ``use_cudnn=False``: Keras on JAX sends an eligible layer to cuDNN whatever its dtype, and JAX cannot
    differentiate cuDNN's float64 RNN (H100, jax 0.11: lowering ``cudnn_rnn_bwd_ffi`` fails, "operand part has
    type 'tensor<1664xf32>' and output part has type 'tensor<1664xf64>'"); the loop computes in float64 exactly
    the same function. The torch backend differentiates cuDNN in float64 and keeps the model's own choice."""
    import keras

    return _keras_variant(model, float64=True, use_cudnn=False if keras.backend.backend() == "jax" else None)


def _set_use_cudnn(config: Any, value: Any) -> Any:
    if isinstance(config, dict):
        out = {k: _set_use_cudnn(v, value) for k, v in config.items()}
        if config.get("class_name") in ("LSTM", "GRU") and isinstance(out.get("config"), dict):
            out["config"] = {**out["config"], "use_cudnn": value}
        return out
    if isinstance(config, list):
        return [_set_use_cudnn(v, value) for v in config]
    return config


def _keras_run(model: Any, inputs: Any) -> _Run:
    """Outputs and gradients w.r.t. the trainable weights (inference mode: no dropout), observed per layer."""
    import keras

    from ..observation.calls import observe

    if keras.backend.backend() == "jax":
        return _keras_jax_run(model, inputs)
    with observe() as seen:
        if keras.backend.backend() == "tensorflow":
            import tensorflow as tf

            with tf.GradientTape() as tape:
                outs = _keras_outputs(model(inputs, training=False))
                loss = _seeded_loss(outs, lambda t: tf.cast(t, tf.float64), lambda a: tf.constant(a))
            grads = tape.gradient(loss, model.trainable_variables)
        elif keras.backend.backend() == "torch":
            import torch

            outs = _keras_outputs(model(inputs, training=False))
            loss = _seeded_loss(
                outs, lambda t: t.to(torch.float64), lambda a: torch.as_tensor(a, device=outs[0].device)
            )
            values = [v.value for v in model.trainable_variables]
            grads = torch.autograd.grad(loss, values, allow_unused=True)
        else:
            raise ValueError(
                f"Keras backend {keras.backend.backend()!r}: verify_model runs {', '.join(KERAS_BACKENDS)}"
            )
    # by position: a clone's layers have other names, the same order
    names = [f"weight {i} {tuple(v.shape)}" for i, v in enumerate(model.trainable_variables)]
    return _Run(
        outputs=[np.asarray(keras.ops.convert_to_numpy(o), dtype=np.float64) for o in outs],
        grads={n: np.asarray(keras.ops.convert_to_numpy(g), dtype=np.float64) for n, g in zip(names, grads, strict=True)
               if g is not None},
        traces=seen.all_traces(),
        layer_shapes={},
    )  # fmt: skip


#: compiled loss-and-gradient steps of the Keras-on-JAX clones of the model one ``verify_keras_model`` call
#: checks (cleared before and after it), by config (with the ``use_cudnn`` switches it leaves out), argument
#: shapes and dtypes, and whether 64-bit mode is on,
#: with the traces and problems seen while each was traced: the float64 reference and its perturbed twins
#: (one architecture, other weights) share one XLA compilation
_JAX_STEPS: dict[str, tuple[Any, list[Any], list[str]]] = {}


def _keras_jax_run(model: Any, inputs: Any) -> _Run:
    """:func:`_keras_run` on Keras's JAX backend: the model's ``stateless_call`` and the seeded loss under one
    ``jax.jit(jax.value_and_grad(...))``, gradients w.r.t. the trainable weights; each LSTM/GRU call is traced
    while it is traced (forward and backward HLO per layer, :func:`..observation.calls._jax_layer_traces`).
    Every state is an argument, so a model of the same config (a clone with other weights) reuses the step."""
    import jax
    import jax.numpy as jnp
    import keras

    from ..observation.calls import observe, unserialized_switches

    trainable = [v.value for v in model.trainable_variables]
    fixed = [v.value for v in model.non_trainable_variables]
    x64 = bool(getattr(jax.config, "jax_enable_x64", False))
    shapes = jax.tree.map(lambda a: (tuple(np.shape(a)), str(getattr(a, "dtype", type(a)))), [trainable, fixed, inputs])
    config = (model.get_config(), unserialized_switches(model))  # use_cudnn is not in the config
    key = repr((type(model).__module__, type(model).__qualname__, config, shapes, x64))
    if key not in _JAX_STEPS:
        wide = jnp.float64 if x64 else jnp.float32  # float64 where the reference runs, else the path's float32

        def loss(params: list, state: list, data: Any) -> Any:
            out, _ = model.stateless_call(params, state, data, training=False)
            outs = _keras_outputs(out)
            return _seeded_loss(outs, lambda t: t.astype(wide), lambda a: jnp.asarray(a, dtype=wide)), outs

        step = jax.jit(jax.value_and_grad(loss, has_aux=True))
        with observe(jax_backward=True) as seen:
            compiled = step.lower(trainable, fixed, inputs).compile()
        _JAX_STEPS[key] = (compiled, seen.all_traces(), list(seen.problems))
    compiled, traces, problems = _JAX_STEPS[key]
    (_, outs), grads = compiled(trainable, fixed, inputs)
    names = [f"weight {i} {tuple(v.shape)}" for i, v in enumerate(model.trainable_variables)]
    return _Run(
        outputs=[np.asarray(keras.ops.convert_to_numpy(o), dtype=np.float64) for o in outs],
        grads={n: np.asarray(g, dtype=np.float64) for n, g in zip(names, grads, strict=True)},
        traces=list(traces),
        layer_shapes={},
        problems=list(problems),
    )


@contextlib.contextmanager
def _keras_float64_math() -> Any:
    """Float64 operands computed in float64 while the float64 reference runs.

    Keras 3 on the torch (and JAX) backend promotes 64-bit operands to 32-bit results
    (``keras/src/backend/common/dtypes.py``: ``BIT64_TO_BIT32_DTYPE``, "aligned with JAX's default"), so
    ``ops.matmul`` of two float64 tensors is float32 there: a "float64" clone of a model would compute its
    matrix products, the LSTM's included, in float32, and a float32 path would agree with it by construction.
    The table's float64 entry is lifted for the block, and a float64 product is checked to stay float64; where
    it does not, no float64 reference can be run and the check refuses (an error, never a pass)."""
    import keras
    from keras.src.backend.common import dtypes

    table = getattr(dtypes, "BIT64_TO_BIT32_DTYPE", {})
    saved = table.get("float64") if isinstance(table, dict) else None
    if saved is not None:
        table["float64"] = "float64"
    x64: Any = contextlib.nullcontext()
    if keras.backend.backend() == "jax":  # JAX makes float64 arrays float32 unless 64-bit mode is on
        import jax

        x64 = jax.enable_x64(True)
    try:
        with x64:
            one = keras.ops.convert_to_tensor(np.ones((1, 1)), dtype="float64")
            got = keras.backend.standardize_dtype(keras.ops.matmul(one, one).dtype)
            if got != "float64":
                raise RuntimeError(
                    f"verify_model: Keras {keras.__version__} on the {keras.backend.backend()} backend computes a "
                    f"float64 matrix product as {got}: no float64 reference can be run for this model"
                )
            yield
    finally:
        if saved is not None:
            table["float64"] = saved


def _named(run: _Run) -> dict[str, np.ndarray]:
    return {f"output {i}": v for i, v in enumerate(run.outputs)} | {f"grad {k}": v for k, v in run.grads.items()}


def _keras_sensitivity(model: Any, inputs: Any, ref: _Run, spec: LayerSpec) -> Any:
    """:func:`_sensitivity` for a Keras model: float64 clones with perturbed weights, and perturbed inputs where
    they are floating-point numpy arrays (token ids stay as they are)."""
    from .sensitivity import Sensitivity, canonical, perturb, relative_changes

    def moved(rng: np.random.Generator) -> dict[str, np.ndarray]:
        twin = _keras_reference(model)
        twin.set_weights([perturb(w, rng) if w.dtype.kind == "f" else w for w in twin.get_weights()])
        return _named(_keras_run(twin, _map_arrays(inputs, lambda a: perturb(a, rng) if a.dtype.kind == "f" else a)))

    return Sensitivity(relative_changes(_named(ref), moved), canonical(spec))


def _map_arrays(value: Any, fn: Any) -> Any:
    if isinstance(value, np.ndarray):
        return fn(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_map_arrays(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: _map_arrays(v, fn) for k, v in value.items()}
    return value


def _keras_outputs(out: Any) -> list[Any]:
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _seeded_loss(outs: list[Any], to64: Any, const: Any) -> Any:
    rng = np.random.default_rng(SEED)
    import keras

    return sum(keras.ops.sum(to64(o) * const(rng.standard_normal(tuple(o.shape)))) for o in outs)


#: the Keras backends verify_model runs a Keras model on (gradients and per-layer kernel observation)
KERAS_BACKENDS = ("tensorflow", "torch", "jax")


def keras_model_paths(device: str) -> list[Any]:
    """The model as built (the backend's default kernel choice) and, on a GPU, with ``use_cudnn=False``."""
    import keras

    from .. import paths as registry

    backend = {"tensorflow": "tf", "jax": "jax"}.get(keras.backend.backend(), "torch")
    kind = device.split(":")[0]
    names = [f"keras-{backend}-cpu"] if kind == "cpu" else [f"keras-{backend}-cudnn", f"keras-{backend}-cuda-generic"]
    return [registry.get(n) for n in names]


def verify_keras_model(
    model: Any, example_inputs: Any, *, device: str = "cpu", paths: Sequence[str] | None = None
) -> list[PathOutcome]:
    """:func:`verify_model` for a Keras model on the backend Keras runs (one per process): the model as built
    (and, on a GPU, with cuDNN off) against a float64 clone of it with the same weights."""
    import keras

    from ..observation.eligibility import configs_from_model

    if keras.backend.backend() not in KERAS_BACKENDS:
        raise ValueError(
            f"verify_model: Keras on the {keras.backend.backend()!r} backend is not supported (supported: "
            f"{', '.join(KERAS_BACKENDS)}; set KERAS_BACKEND before Keras is imported)"
        )
    configs = configs_from_model(model)
    if not configs:
        raise ValueError(f"{model.name}: no built LSTM/GRU layer found")
    spec = envelope_spec([c[1] for c in configs])
    _JAX_STEPS.clear()  # steps are shared between the clones of this one model only
    try:
        with _keras_float64_math():
            ref = _keras_run(_keras_reference(model), example_inputs)
            sensitivity = _keras_sensitivity(model, example_inputs, ref, spec)
        outcomes = []
        for path in keras_model_paths(device):
            if paths is not None and path.name not in paths:
                continue
            as_built = path.name.endswith(("-cpu", "-cudnn"))
            run = _keras_run(model if as_built else _keras_variant(model, use_cudnn=False), example_inputs)
            outcome = PathOutcome(path.name)
            claim = (path.kernel, path.precision)
            _conclude(outcome, path, run, ref, claim, spec, keras=True, sensitivity=sensitivity)
            outcomes.append(outcome)
        return outcomes
    finally:
        _JAX_STEPS.clear()
