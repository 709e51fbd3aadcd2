"""Beside a memory-streaming neighbour, does an anchor timed in TensorFlow follow Keras on TensorFlow's calls, where
the plugin's torch anchor does not? Fresh processes, one thread, in turn ``quiet`` and beside the neighbour of
scripts/memory_neighbour_probe.py (``stream``). Each process builds Keras on TensorFlow's calls as the plugin's worker
builds them (LSTM forward at batch 16 and 1, GRU forward at batch 16, LSTM training step at batch 16; I32, H64, 20
steps) and times each paired, in turn, with three anchors: the plugin's (torch, ten 16x64 steps through backward),
``tf-backward`` (the same ten steps as eager TensorFlow ops under a GradientTape) and ``tf-forward`` (the ten steps
alone).

    python scripts/tf_anchor_probe.py 4      # 4 processes per mode; writes $OUT/tf_anchor_probe.json
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from memory_neighbour_probe import paired_each, rounds, summarise
from precision_anchor_probe import report

MODES = ("quiet", "stream")
ANCHORS = ("torch", "tf-backward", "tf-forward")
CALLS = ("lstm-forward-B16", "lstm-forward-B1", "gru-forward-B16", "lstm-train-B16")


class TfAnchor:
    """The plugin's anchor's ten 16x64 steps as eager TensorFlow ops, through backward or not."""

    def __init__(self, backward: bool) -> None:
        import numpy as np
        import tensorflow as tf

        rng = np.random.default_rng(0)
        self.tf = tf
        self.backward = backward
        self.x = tf.constant(rng.standard_normal((16, 64)).astype("float32") / 8)
        self.w = tf.Variable(rng.standard_normal((64, 64)).astype("float32") / 8)
        self.u = tf.Variable(rng.standard_normal((64, 64)).astype("float32") / 8)
        self.once()

    def _steps(self) -> Any:
        tf = self.tf
        h = self.x
        for _ in range(10):
            h = tf.tanh(tf.matmul(self.x, self.w) + tf.matmul(h, self.u))
        return h

    def once(self) -> None:
        tf = self.tf
        if not self.backward:
            self._steps().numpy()
            return
        with tf.GradientTape() as tape:
            total = tf.reduce_sum(self._steps())
        grads = tape.gradient(total, [self.w, self.u])
        grads[0].numpy()

    def time(self, repeat: int) -> float:
        start = time.perf_counter()
        for _ in range(repeat):
            self.once()
        return (time.perf_counter() - start) / repeat


def child() -> None:
    from pytest_lstmperf.device import apply_threads

    apply_threads(1)
    os.environ["KERAS_BACKEND"] = "tensorflow"
    from pytest_lstmperf.anchor import Anchor
    from pytest_lstmperf.model.case import make_case
    from pytest_lstmperf.model.keras_options import KerasOptions
    from pytest_lstmperf.model.spec import LayerSpec
    from pytest_lstmperf.paths.keras.runners import LocalKerasRun

    small = LayerSpec(cell="lstm", input_size=32, hidden_size=64, num_layers=1, batch=16, seq_len=20,
                      batch_first=True, training=True)  # fmt: skip
    opts = KerasOptions(backend="tensorflow")

    def keras_call(spec: LayerSpec, kind: str) -> Callable[[], None]:
        return LocalKerasRun(opts, make_case(spec), "cpu")._timed(kind)

    calls = {
        "lstm-forward-B16": keras_call(small, "forward"),
        "lstm-forward-B1": keras_call(small.replace(batch=1), "forward"),
        "gru-forward-B16": keras_call(small.replace(cell="gru"), "forward"),
        "lstm-train-B16": keras_call(small, "train_step"),
    }
    anchors = {"torch": Anchor("cpu"), "tf-backward": TfAnchor(True), "tf-forward": TfAnchor(False)}
    print(json.dumps(paired_each(calls, anchors, 10)))


def main(n: int) -> None:
    rows = rounds(__file__, n, MODES)
    report("tf_anchor_probe", rows, summarise(rows, [f"{c}/{a}" for c in CALLS for a in ANCHORS], MODES))


if __name__ == "__main__":
    if sys.argv[1:2] == ["child"]:
        child()
    else:
        main(int(sys.argv[1]))
