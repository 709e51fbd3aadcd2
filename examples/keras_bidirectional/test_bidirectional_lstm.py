"""What a maintainer of the bidirectional LSTM classifier guards: its LSTMs run the kernel of the device
(cuDNN on a GPU), no layer is built in a way that leaves cuDNN there (checked on any machine through the
eligibility report, which reads the model's own input shape), and the model agrees with its float64 run."""

import numpy as np
import pytest

keras = pytest.importorskip("keras", reason="the Keras example needs keras 3 (pip install keras)")
from bilstm_model import build_model  # noqa: E402

import pytest_lstmperf  # noqa: E402

MAXLEN, BATCH = 20, 3
#: the kernel each backend runs on the CPU (Keras's own loop); on a GPU both must reach cuDNN
CPU_FAMILY = {"tensorflow": "tf-generic", "torch": "cpu-native", "jax": "jax-generic"}


@pytest.fixture
def model():
    keras.utils.set_random_seed(0)
    return build_model(max_features=200, maxlen=MAXLEN, embed_dim=16, units=8, batch_size=BATCH)


@pytest.fixture
def tokens():
    return np.random.default_rng(1).integers(0, 200, size=(BATCH, MAXLEN)).astype("int32")


def test_lstms_run_the_device_kernel(model, tokens, lstmperf_kernel):
    if keras.backend.backend() not in CPU_FAMILY:
        pytest.skip(f"the kernel check observes Keras on {', '.join(CPU_FAMILY)}, not {keras.backend.backend()}")
    with lstmperf_kernel.expect(cpu=CPU_FAMILY[keras.backend.backend()], cuda="cudnn") as seen:
        model(tokens, training=True)
    assert len(seen.layers) == 4  # two Bidirectional wrappers, two directions each


def test_every_lstm_is_cudnn_eligible(model):
    rows = pytest_lstmperf.report(model, device="cuda")
    assert [(row.verdict.spec.batch, row.verdict.spec.seq_len) for row in rows] == [(BATCH, MAXLEN)] * 4
    fallen = [row.verdict.describe() for row in rows if pytest_lstmperf.falls_back(row)]
    assert not fallen, "\n".join(fallen)


def test_matches_its_float64_run(model, tokens, lstmperf_device):
    if keras.backend.backend() not in CPU_FAMILY:
        pytest.skip(f"verify_model runs Keras on {', '.join(CPU_FAMILY)} (a ValueError says so on the others)")
    outcomes = pytest_lstmperf.verify_model(model, tokens, device=lstmperf_device)
    assert outcomes and all(o.errors for o in outcomes)
