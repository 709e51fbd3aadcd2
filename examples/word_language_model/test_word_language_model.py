"""What a maintainer of the word-language model guards: its LSTM runs the fast kernel of the device (oneDNN on
the CPU, cuDNN on a GPU), every execution path agrees with a float64 run of the model, no layer is built in
a way that leaves cuDNN on a GPU, and the forward pass is no slower than the device's recorded baseline.
Run with ``pytest examples --device=cpu`` (or ``--device=cuda``); record the speed baseline once with
``--lstmperf-save-baseline`` and gate later runs with ``--benchmark-compare``."""

import pytest
import torch
from wlm_model import RNNModel

import pytest_lstmperf

NTOKEN, BPTT, BATCH = 100, 12, 4


@pytest.fixture
def model(lstmperf_device):
    torch.manual_seed(0)
    return RNNModel("LSTM", NTOKEN, ninp=16, nhid=32, nlayers=2, dropout=0.2).to(lstmperf_device)


@pytest.fixture
def batch(lstmperf_device):
    generator = torch.Generator().manual_seed(1)
    data = torch.randint(0, NTOKEN, (BPTT + 1, BATCH), generator=generator).to(lstmperf_device)
    return data[:-1], data[1:].reshape(-1)


@pytest.mark.lstmperf_kernel(cpu="onednn", cuda="cudnn")
def test_training_step_runs_the_fast_kernel(model, batch):
    tokens, targets = batch
    output, _ = model(tokens, model.init_hidden(BATCH))
    torch.nn.functional.nll_loss(output, targets).backward()


def test_every_path_matches_float64(model, batch, lstmperf_device):
    tokens, _ = batch
    # the bf16 autocast paths' gradient bounds would reach 0.1 relative error: not comparable, accepted by name
    # (without this the call raises: nothing goes uncompared in silence)
    outcomes = pytest_lstmperf.verify_model(
        model,
        (tokens, model.init_hidden(BATCH)),
        device=lstmperf_device,
        accept_unchecked=["*-autocast-bf16: grad *"],
    )
    checked = [o for o in outcomes if o.skipped is None]
    assert checked, [o.skipped for o in outcomes]
    assert all(o.errors for o in checked)


def test_layers_are_cudnn_eligible(model, batch):
    tokens, _ = batch
    rows = pytest_lstmperf.report(model, (tokens, model.init_hidden(BATCH)), device="cuda")
    assert [row.verdict.spec.seq_len for row in rows] == [BPTT]
    fallen = [row.verdict.describe() for row in rows if pytest_lstmperf.falls_back(row)]
    assert not fallen, "\n".join(fallen)


@pytest.mark.lstmperf("forward")
def test_forward_speed(benchmark, model, batch):
    tokens, _ = batch
    model.eval()

    def forward():
        with torch.no_grad():
            return model(tokens, model.init_hidden(BATCH))

    output, _ = benchmark(forward)
    assert output.shape == (BPTT * BATCH, NTOKEN)
