"""``lstmperf report`` on a Keras model whose LSTM receives a mask (``Embedding(mask_zero=True)``): the row says
what the mask does to eligibility, and, with example inputs, judges the padding of a real batch; an open time
dimension is reported at T=10 and the table says so. One subprocess per backend (Keras picks it on import)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import json, numpy as np, keras
from pytest_lstmperf import report
from pytest_lstmperf.observation.eligibility import render_table


def build(mask_zero):
    inputs = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(50, 8, mask_zero=mask_zero, name="embedding")(inputs)
    return keras.Model(inputs, keras.layers.LSTM(16, name="lstm")(x))


masked, plain = build(True), build(False)
right = np.array([[3, 4, 5, 0, 0], [6, 7, 0, 0, 0]], "int32")
left = right[:, ::-1].copy()
out = {"masked": render_table(report(masked, device="cuda")), "plain": render_table(report(plain, device="cuda"))}
out["right"] = render_table(report(masked, right, device="cuda"))
out["left"] = render_table(report(masked, left, device="cuda"))
print("RESULT " + json.dumps(out))
"""


def _tables(backend: str, tmp_path: Path) -> dict[str, str]:
    env = {**os.environ, "KERAS_BACKEND": backend, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env,
                            cwd=tmp_path, timeout=300)  # fmt: skip
    line = next((x for x in result.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, result.stderr[-3000:]
    return json.loads(line[len("RESULT ") :])


needs = pytest.mark.skipif(
    importlib.util.find_spec("keras") is None or importlib.util.find_spec("tensorflow") is None,
    reason="keras and TensorFlow are needed (pip install tensorflow-cpu keras)",
)


@needs
def test_tensorflow_report_says_a_mask_must_be_right_padded(tmp_path: Path) -> None:
    tables = _tables("tensorflow", tmp_path)
    masked = tables["masked"]
    assert "[mask=right]" in masked and "cudnn/tf32" in masked
    assert "a mask from 'embedding' (Embedding(mask_zero=True)) reaches this layer" in masked
    assert "cuDNN only while every mask is strictly right-padded" in masked
    assert "a left-padded mask or one with holes raises on a GPU" in masked
    assert "open (None): reported at batch 4, length 10" in masked  # the assumed T=10 is said
    plain = tables["plain"]  # no mask: no word of one, and the defaults as before
    assert "[defaults]" in plain and "mask" not in plain.lower()
    # a real batch decides: right-padded stays on cuDNN, left-padded is judged as such
    assert "[mask=right]" in tables["right"] and "right-padded in the call of example_inputs" in tables["right"]
    assert "[mask=left]" in tables["left"] and "left-padded in the call of example_inputs" in tables["left"]
    assert "pad_sequences(padding='post')" in tables["left"]  # the explainer's change for the row
    assert "length 10" not in tables["left"]  # the real call's length, nothing assumed


@pytest.mark.skipif(
    importlib.util.find_spec("keras") is None or importlib.util.find_spec("torch") is None,
    reason="keras and torch are needed",
)
def test_torch_backend_report_says_any_mask_leaves_cudnn(tmp_path: Path) -> None:
    masked = _tables("torch", tmp_path)["masked"]
    assert "cuda-generic" in masked and "drop the mask" in masked
    assert "any mask keeps it off cuDNN on this backend" in masked
