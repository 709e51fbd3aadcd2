"""verify_model widens a bound only as far as the model's own conditioning asks, and still catches faults."""

import pytest

torch = pytest.importorskip("torch")

from pytest_lstmperf.numerics import verify_model as vm  # noqa: E402
from pytest_lstmperf.numerics.sensitivity import Sensitivity  # noqa: E402


class Offset(torch.nn.Module):
    """An LSTM whose output is read after two large, separate parameters are added and subtracted: the float64
    result is the LSTM's, but the output now sits on cancellation (a badly conditioned way to compute it)."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = torch.nn.LSTM(8, 16, batch_first=True)
        self.up = torch.nn.Parameter(torch.full((16,), 1e3))
        self.down = torch.nn.Parameter(torch.full((16,), 1e3))

    def forward(self, x):
        y, _ = self.rnn(x)
        return (y + self.up) - self.down


def _sensitivity(model, x):
    ref = vm._run(model, (x,), "cpu", torch.float64)
    spec = vm.envelope_spec(list(ref.layer_shapes.values()))
    return vm._sensitivity(model, (x,), ref, spec)


def test_a_well_conditioned_model_keeps_the_canonical_bounds():
    torch.manual_seed(0)
    s = _sensitivity(torch.nn.LSTM(8, 16, batch_first=True), torch.randn(3, 10, 8))
    assert s.canonical["forward"] > 0 and s.canonical["backward"] > 0
    assert all(s.factor(q, "backward" if q.startswith("grad") else "forward") < 1.5 for q in s.model), s


def test_cancellation_widens_the_bound_and_says_so():
    torch.manual_seed(0)
    s = _sensitivity(Offset(), torch.randn(3, 10, 8))
    assert s.factor("output 0", "forward") > 10
    assert "bound widened" in s.explain("output 0", "forward")


def test_widened_bound_still_fails_a_planted_fault():
    """States ignored (a wrong result, not rounding) fails the model's fp32 check whatever its conditioning."""
    torch.manual_seed(0)
    model = torch.nn.LSTM(8, 16, batch_first=True)
    x, h0 = torch.randn(3, 10, 8), (0.5 * torch.randn(1, 3, 16), 0.5 * torch.randn(1, 3, 16))
    ref = vm._run(model, (x, h0), "cpu", torch.float64)
    wrong = vm._run(model, (x, (torch.zeros(1, 3, 16), torch.zeros(1, 3, 16))), "cpu", torch.float32)
    spec = vm.envelope_spec(list(ref.layer_shapes.values()))
    wide = Sensitivity({q: 1e6 for q in ("output 0",)}, {"forward": 1.0, "backward": 1.0})
    found = vm._check_numbers(wrong, ref, ("onednn", "fp32"), spec, vm.PathOutcome("cpu"), _sensitivity(model, x))
    assert any(m.check == "tolerance" and m.quantity == "output 0" for m in found)
    # a bound widened past MAX_REL is refused: inconclusive, never a pass
    found = vm._check_numbers(wrong, ref, ("onednn", "fp32"), spec, vm.PathOutcome("cpu"), wide)
    assert any(m.check == "inconclusive" and m.quantity == "output 0" for m in found)
