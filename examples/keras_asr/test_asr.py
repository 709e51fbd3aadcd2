"""What a maintainer of the DeepSpeech2-like speech recogniser guards: its bidirectional GRUs (``reset_after=True``)
run the kernel of the device (cuDNN on a GPU), none of them is built in a way that leaves cuDNN there (checked on
any machine through the eligibility report), and the model, convolutions included, agrees with its float64 run.
On CUDA verify_model computes the layers around the GRUs in IEEE fp32 during each path's run (torch lets
convolutions run TF32 by default; see docs/own-model.md)."""

import numpy as np
import pytest

keras = pytest.importorskip("keras", reason="the Keras example needs keras 3 (pip install keras)")
from asr_model import build_model  # noqa: E402

import pytest_lstmperf  # noqa: E402

FEATURES, CHARS, TIME, BATCH, UNITS, LAYERS = 33, 10, 12, 2, 8, 2
#: the kernel each backend runs on the CPU (Keras's own loop); on a GPU both must reach cuDNN
CPU_FAMILY = {"tensorflow": "tf-generic", "torch": "cpu-native", "jax": "jax-generic"}


@pytest.fixture
def model():
    # the original names its first Dense "dense_1" and leaves the last one to Keras's automatic names, which
    # reach "dense_1" too once a Dense was made before in the process: a fresh session restarts the names
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    return build_model(FEATURES, CHARS, rnn_layers=LAYERS, rnn_units=UNITS, time_steps=TIME, batch_size=BATCH)


@pytest.fixture
def spectrograms():
    return np.random.default_rng(1).standard_normal((BATCH, TIME, FEATURES)).astype("float32")


def test_grus_run_the_device_kernel(model, spectrograms, lstmperf_kernel):
    if keras.backend.backend() not in CPU_FAMILY:
        pytest.skip(f"the kernel check observes Keras on {', '.join(CPU_FAMILY)}, not {keras.backend.backend()}")
    with lstmperf_kernel.expect(cpu=CPU_FAMILY[keras.backend.backend()], cuda="cudnn") as seen:
        model(spectrograms, training=True)
    assert len(seen.layers) == 2 * LAYERS  # two directions per Bidirectional


def test_every_gru_is_cudnn_eligible(model):
    rows = pytest_lstmperf.report(model, device="cuda")
    # the first convolution halves the time axis (stride 2)
    assert [(row.verdict.spec.batch, row.verdict.spec.seq_len) for row in rows] == [(BATCH, TIME // 2)] * 2 * LAYERS
    fallen = [row.verdict.describe() for row in rows if pytest_lstmperf.falls_back(row)]
    assert not fallen, "\n".join(fallen)


def test_matches_its_float64_run(model, spectrograms, lstmperf_device):
    if keras.backend.backend() not in CPU_FAMILY:
        pytest.skip(f"verify_model runs Keras on {', '.join(CPU_FAMILY)} (a ValueError says so on the others)")
    outcomes = pytest_lstmperf.verify_model(model, spectrograms, device=lstmperf_device)
    assert outcomes and all(o.ok and o.errors for o in outcomes)
    assert all(any(k.startswith("grad weight 0 (11, 41, 1, 32)") for k in o.errors) for o in outcomes)  # conv_1
