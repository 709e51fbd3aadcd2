"""A user's Keras model run for :func:`pytest_lstmperf.numerics.verify_model.verify_model`, on the backend Keras
runs (one per process: TensorFlow, torch or JAX): the float64 clone the paths are compared with, the model as
built and, on a GPU, with ``use_cudnn=False``, and the model's sensitivity on its own data.

Outputs and gradients w.r.t. the trainable weights are computed in inference mode (no dropout), each LSTM/GRU
call observed (:func:`pytest_lstmperf.observation.calls.observe`); on JAX the loss and its gradient are one
compiled step per architecture, traced while it is compiled. The float64 clone computes in float64 only inside
:func:`_keras_float64_math` (Keras promotes 64-bit products to 32 bits on the torch and JAX backends).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import paths as registry
from ..model.spec import LayerSpec
from ..observation.calls import observe, unserialized_switches
from ..observation.model_configs import configs_from_model
from .model_judge import SEED, ModelRun, PathOutcome, conclude, envelope_spec
from .sensitivity import Sensitivity, canonical, perturb, relative_changes


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


def _keras_run(model: Any, inputs: Any) -> ModelRun:
    """Outputs and gradients w.r.t. the trainable weights (inference mode: no dropout), observed per layer."""
    import keras

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
    return ModelRun(
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


def _keras_jax_run(model: Any, inputs: Any) -> ModelRun:
    """:func:`_keras_run` on Keras's JAX backend: the model's ``stateless_call`` and the seeded loss under one
    ``jax.jit(jax.value_and_grad(...))``, gradients w.r.t. the trainable weights; each LSTM/GRU call is traced
    while it is traced (forward and backward HLO per layer, :func:`..observation.calls._jax_layer_traces`).
    Every state is an argument, so a model of the same config (a clone with other weights) reuses the step."""
    import jax
    import jax.numpy as jnp
    import keras

    trainable = [v.value for v in model.trainable_variables]
    fixed = [v.value for v in model.non_trainable_variables]
    x64 = bool(getattr(jax.config, "jax_enable_x64", False))
    shapes = jax.tree.map(lambda a: (tuple(np.shape(a)), str(getattr(a, "dtype", type(a)))), [trainable, fixed, inputs])
    config = (model.get_config(), unserialized_switches(model))  # use_cudnn is not in the config
    key = repr((type(model).__module__, type(model).__qualname__, config, shapes, x64))
    if key not in _JAX_STEPS:
        wide = jnp.float64 if x64 else jnp.float32  # float64 where the reference runs, else the path's float32

        def loss(params: list[Any], state: list[Any], data: Any) -> Any:
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
    return ModelRun(
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


def _numpy_on_torch() -> Any:
    """Keras on the torch backend: layers that Keras hands to ``torch._VF.lstm``/``gru`` (on CUDA) compute the
    float64 reference by the plugin's numpy recurrence (:mod:`.torch_reference`), not by torch's kernel; Keras's
    own loop (the CPU, other backends) is Keras's own float64 arithmetic."""
    import keras

    if keras.backend.backend() != "torch":
        return contextlib.nullcontext()
    from .torch_reference import numpy_recurrence

    return numpy_recurrence()


def _ieee_on_torch(device: str) -> Any:
    """Keras on the torch backend: the layers around the recurrent ones compute in IEEE fp32 on CUDA during a
    path's run (:func:`pytest_lstmperf.numerics.verify_torch.ieee_other_layers`: a Conv2D's TF32 gradients erred
    2.6e-2 against an fp32 bound of 5.6e-6 on an H100); other backends run as they are."""
    import keras

    if keras.backend.backend() != "torch":
        return contextlib.nullcontext()
    import torch

    from .verify_torch import ieee_other_layers

    return ieee_other_layers(torch, device)


def _keras_sensitivity(model: Any, inputs: Any, ref: ModelRun, spec: LayerSpec) -> Any:
    """The model's sensitivity, as :func:`pytest_lstmperf.numerics.verify_torch._sensitivity` measures a torch
    model's: float64 clones with perturbed weights, and perturbed inputs where they are floating-point numpy
    arrays (token ids stay as they are)."""

    def moved(rng: np.random.Generator) -> dict[str, np.ndarray]:
        twin = _keras_reference(model)
        twin.set_weights([perturb(w, rng) if w.dtype.kind == "f" else w for w in twin.get_weights()])
        moved_inputs = _map_arrays(inputs, lambda a: perturb(a, rng) if a.dtype.kind == "f" else a)
        return _keras_run(twin, moved_inputs).quantities()

    return Sensitivity(relative_changes(ref.quantities(), moved), canonical(spec))


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
        with _keras_float64_math(), _numpy_on_torch():
            ref = _keras_run(_keras_reference(model), example_inputs)
            sensitivity = _keras_sensitivity(model, example_inputs, ref, spec)
        outcomes = []
        for path in keras_model_paths(device):
            if paths is not None and path.name not in paths:
                continue
            as_built = path.name.endswith(("-cpu", "-cudnn"))
            with _ieee_on_torch(device):  # convolutions and matmuls around the layers in IEEE fp32 on CUDA
                run = _keras_run(model if as_built else _keras_variant(model, use_cudnn=False), example_inputs)
            outcome = PathOutcome(path.name)
            claim = (path.kernel, path.precision)
            conclude(outcome, path, run, ref, claim, spec, keras=True, sensitivity=sensitivity)
            outcomes.append(outcome)
        return outcomes
    finally:
        _JAX_STEPS.clear()
