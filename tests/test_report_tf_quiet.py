"""``lstmperf report`` of a Keras model on TensorFlow prints no TensorFlow start-up log lines (written by C++ to
file descriptor 2 before absl logging starts), and an error from TensorFlow's import still reaches the user."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: TensorFlow's C++ log lines (``I0000 00:00:1795629476.983217   17837 cudart_stub.cc:31] ...``) and the notices
#: printed with them
TF_LOG_LINE = re.compile(r"^[IWEF]\d{4} |cudart_stub|cuInit|absl::InitializeLog|cpu_feature_guard")

KERAS_MODEL = """
import keras

def model():
    inputs = keras.Input((30, 8), batch_size=1)
    return keras.Model(inputs, keras.layers.LSTM(16)(inputs))
"""

#: a stand-in for TensorFlow: logs as TensorFlow does, straight to file descriptor 2, on import and on listing GPUs
FAKE_TENSORFLOW = """
import os

os.environ.get("TF_CPP_MIN_LOG_LEVEL") == "3" or os.write(1, b"TF_CPP_MIN_LOG_LEVEL not 3 during the import\\n")
os.write(2, b"I0000 00:00:1795629476.983217   17837 cudart_stub.cc:31] Could not find cuda drivers\\n")
RAISE


class config:
    @staticmethod
    def list_physical_devices(kind):
        os.write(2, b"E0000 00:00:1795629495.568689   17837 cuda_platform.cc:52] failed call to cuInit\\n")
        return []
"""

USER_MODULE = """
import os
import sys

import tensorflow

print("user module stderr", file=sys.stderr)
print("TF_CPP_MIN_LOG_LEVEL after the import:", os.environ.get("TF_CPP_MIN_LOG_LEVEL"), file=sys.stderr)
CONFIGS = [{"framework": "torch", "cell": "lstm", "input_size": 8, "hidden_size": 16}]
"""


def _report(cwd: Path, source: str, keras_backend: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(cwd), str(ROOT)])}
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # as a user has it: unset
    if keras_backend:
        env["KERAS_BACKEND"] = keras_backend
    command = [sys.executable, "-m", "pytest_lstmperf.cli", "report", source]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, timeout=300)


def _tf_lines(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in (result.stdout + result.stderr).splitlines() if TF_LOG_LINE.search(line)]


@pytest.mark.skipif(
    importlib.util.find_spec("keras") is None or importlib.util.find_spec("tensorflow") is None,
    reason="keras and tensorflow are not both installed",
)
def test_report_of_a_keras_model_on_tensorflow_prints_no_tensorflow_log_lines(tmp_path: Path) -> None:
    (tmp_path / "tf_model.py").write_text(KERAS_MODEL)
    result = _report(tmp_path, "tf_model:model", keras_backend="tensorflow")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "| # | config | predicted |" in result.stdout
    assert "keras-tensorflow lstm-I8-H16-L1-B1-T30" in result.stdout
    assert not _tf_lines(result), "TensorFlow's log lines reached the terminal:\n" + "\n".join(_tf_lines(result))


def _fake_tensorflow(tmp_path: Path, raise_line: str = "") -> None:
    (tmp_path / "tensorflow").mkdir()
    (tmp_path / "tensorflow" / "__init__.py").write_text(FAKE_TENSORFLOW.replace("RAISE", raise_line))
    (tmp_path / "user_model.py").write_text(USER_MODULE)


def test_tensorflow_import_is_muted_and_the_rest_of_stderr_is_not(tmp_path: Path) -> None:
    """Only TensorFlow's import and its GPU listing are muted: the user's module writes to stderr as before,
    and TF_CPP_MIN_LOG_LEVEL is 3 during the import and unset again after it."""
    _fake_tensorflow(tmp_path)
    result = _report(tmp_path, "user_model:CONFIGS")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "| # | config | predicted |" in result.stdout
    assert not _tf_lines(result), result.stderr
    assert "not 3 during the import" not in result.stdout  # written to stdout, which stays open
    assert "user module stderr" in result.stderr
    assert "TF_CPP_MIN_LOG_LEVEL after the import: None" in result.stderr


@pytest.mark.parametrize(
    ("raise_line", "shown"),
    [
        ("raise ImportError('libcudart.so.12: cannot open shared object file')", "libcudart.so.12"),
        ("raise RuntimeError('TensorFlow cannot start here')", "RuntimeError: TensorFlow cannot start here"),
    ],
)
def test_an_error_from_the_tensorflow_import_is_shown(tmp_path: Path, raise_line: str, shown: str) -> None:
    _fake_tensorflow(tmp_path, raise_line)
    result = _report(tmp_path, "user_model:CONFIGS")
    assert result.returncode != 0
    assert shown in result.stderr, result.stderr
    assert not _tf_lines(result), result.stderr
