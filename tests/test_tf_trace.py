"""The TensorFlow kernel detector, proven on a CPU-only machine.

The cuDNN op has no CPU kernel, but tracing a ``tf.function`` only builds its graph: a graph holding
``CudnnRNNV3`` is inspected without running it. Keras's own graphs are checked through the worker in
``tests/test_explain.py``.
"""

from __future__ import annotations

import pytest

from pytest_lstmperf.observation import tf_trace
from pytest_lstmperf.observation.tf_trace import classify_tf_ops


def test_classify_op_sets() -> None:
    assert classify_tf_ops({"CudnnRNNV3", "Transpose"}) == "cudnn"
    assert classify_tf_ops({"CudnnRNNBackpropV3"}) == "cudnn"
    assert classify_tf_ops({"While", "MatMul", "Sigmoid", "Tanh"}) == "tf-generic"
    assert classify_tf_ops({"MatMul", "Relu", "Sigmoid"}) == "tf-generic"
    assert classify_tf_ops({"CudnnRNNV3", "MatMul", "Tanh"}) == "mixed"
    assert classify_tf_ops({"Conv2D", "MatMul"}) == "none"


tf = pytest.importorskip("tensorflow", reason="TensorFlow is not installed (pip install tensorflow-cpu)")


def _cudnn_graph_function(units: int = 4, batch: int = 2, steps: int = 3, features: int = 5):
    x = tf.random.normal((steps, batch, features))
    h = tf.zeros((1, batch, units))
    params = tf.Variable(tf.random.normal((4 * units * (features + units) + 8 * units,)))

    @tf.function
    def cudnn_step():
        with tf.GradientTape() as tape:
            out, *_ = tf.raw_ops.CudnnRNNV3(
                input=x,
                input_h=h,
                input_c=h,
                params=params,
                sequence_lengths=tf.fill([batch], steps),
                rnn_mode="lstm",
                is_training=True,
            )
            loss = tf.reduce_sum(out)
        return tape.gradient(loss, params)

    return cudnn_step


def _generic_graph_function():
    w = tf.Variable(tf.random.normal((4, 4)))
    x = tf.random.normal((3, 2, 4))

    @tf.function
    def loop():
        with tf.GradientTape() as tape:

            def body(t, h):
                return t + 1, tf.sigmoid(tf.matmul(x[t], w) + tf.matmul(h, w)) * tf.tanh(h)

            _, h = tf.while_loop(lambda t, h: t < 3, body, [tf.constant(0), tf.zeros((2, 4))])
            loss = tf.reduce_sum(h)
        return tape.gradient(loss, w)

    return loop


def test_graph_with_the_cudnn_op_reads_cudnn_without_running_it() -> None:
    function = _cudnn_graph_function()
    forward = tf_trace.function_trace(function, phase="forward")
    backward = tf_trace.function_trace(function, phase="backward")
    assert forward.family == "cudnn", forward.describe()
    assert forward.precision == "fp32"
    assert backward.family == "cudnn" and "CudnnRNNBackpropV3" in backward.ops, backward.describe()
    assert tf_trace.function_trace(function, tf32=True).precision == "tf32"


def test_while_loop_of_matmul_reads_tf_generic() -> None:
    function = _generic_graph_function()
    forward = tf_trace.function_trace(function, phase="forward")
    assert forward.family == "tf-generic", forward.describe()
    assert "while loop" in forward.detail
    assert tf_trace.function_trace(function, phase="backward").family == "tf-generic"


def test_planted_fault_detector_blind_to_cudnn(monkeypatch: pytest.MonkeyPatch) -> None:
    """A detector that does not know the cuDNN ops must not call the cuDNN graph cuDNN."""
    monkeypatch.setattr(tf_trace, "CUDNN_OPS", frozenset())
    monkeypatch.setattr(tf_trace, "CUDNN_FORWARD_OPS", frozenset())
    monkeypatch.setattr(tf_trace, "CUDNN_BACKWARD_OPS", frozenset())
    assert tf_trace.function_trace(_cudnn_graph_function()).family != "cudnn"


def test_eager_trace_sees_executed_ops() -> None:
    w = tf.random.normal((4, 4))
    with tf_trace.tf_trace("forward") as out:
        h = tf.zeros((2, 4))
        for _ in range(3):
            h = tf.sigmoid(tf.matmul(h, w)) * tf.tanh(h)
    assert out[0].family == "tf-generic"
    assert out[0].precision == "fp32"
    with tf_trace.tf_trace("forward") as empty:
        tf.constant(1.0) + 1.0
    assert empty[0].family == "none"
