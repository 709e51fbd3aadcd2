"""Keras on TensorFlow: calls compiled into ``tf.function``; kernels read from their graphs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ...observation.tf_trace import function_trace
from .. import PathResult
from .runners import BackendRunner, to_f64

if TYPE_CHECKING:
    from .runners import LocalKerasRun


class TensorFlowRunner(BackendRunner):
    """Calls compiled into ``tf.function`` (as ``model.fit`` does); kernels read from their graphs."""

    def __init__(self, owner: LocalKerasRun) -> None:
        import tensorflow as tf

        self.tf = tf
        self.owner = owner
        spec = owner.spec
        dtype = spec.dtype
        self.tf32 = owner.device == "cuda" and dtype == "float32" and _tf32_enabled(tf)
        with owner._device_scope():
            self.x = tf.constant(owner.x_np.astype(dtype))
            self.mask = None if owner.mask_np is None else tf.constant(owner.mask_np)
            states = owner.states_np()
            self.states = None if states is None else [tf.constant(s.astype(dtype)) for s in states]
            self.seeds = [tf.constant(s.astype(dtype)) for s in owner.seeds_np()]
        stack, training = owner.stack, owner.options.call_training

        def call() -> Any:
            states = None if self.states is None else [[s[i] for i in range(s.shape[0])] for s in self.states]
            return stack.call(self.x, self.mask, states, training)

        def fwd() -> Any:
            out, hs, cs = call()
            return out, hs, cs

        def train() -> Any:
            with tf.GradientTape() as tape:
                tape.watch(self.x)
                if self.states is not None:
                    tape.watch(self.states)
                out, hs, cs = call()
                loss = tf.reduce_sum(out * self._seed_out(out)) + tf.reduce_sum(tf.stack(hs) * self.seeds[1])
                if cs:
                    loss += tf.reduce_sum(tf.stack(cs) * self.seeds[2])
            sources = [self.x, *(self.states or []), *stack.variables()]
            return out, hs, cs, tape.gradient(loss, sources)

        self.fwd = tf.function(fwd)
        self.train = tf.function(train)

    def _seed_out(self, out: Any) -> Any:
        return self.seeds[0]

    def _scope(self) -> Any:
        return self.owner._device_scope()

    def run(self) -> PathResult:
        owner, spec = self.owner, self.owner.spec
        with self._scope():
            fwd_trace = function_trace(self.fwd, phase="forward", tf32=self.tf32)
            if spec.training:
                bwd_trace = function_trace(self.train, phase="backward", tf32=self.tf32)
                out, hs, cs, grads = self.train()
            else:
                bwd_trace = None
                out, hs, cs = self.fwd()
                grads = None
        canonical: dict[str, np.ndarray] = {}
        if grads is not None:
            n_states = len(self.states or [])
            gx = to_f64(grads[0])
            gstates = [to_f64(g) for g in grads[1 : 1 + n_states]]
            gvars = [to_f64(g) for g in grads[1 + n_states :]]
            canonical = owner.canonical_grads(gx, gstates, gvars)
        return owner.path_result(out, hs, cs, canonical, fwd_trace, bwd_trace)

    def forward(self) -> None:
        with self._scope():
            self.last = self.fwd()

    def train_step(self) -> None:
        with self._scope():
            self.last = self.train()

    def trace_forward(self) -> Any:
        with self._scope():
            return function_trace(self.fwd, phase="forward", tf32=self.tf32)

    def synchronize(self) -> None:
        sync = getattr(getattr(self.tf.test, "experimental", None), "sync_devices", None)
        if self.owner.device == "cuda" and sync is not None:
            sync()
        elif getattr(self, "last", None) is not None:
            self.tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, self.last)


def _tf32_enabled(tf: Any) -> bool:
    try:
        return bool(tf.config.experimental.tensor_float_32_execution_enabled())
    except AttributeError:  # pragma: no cover - very old TensorFlow
        return False
