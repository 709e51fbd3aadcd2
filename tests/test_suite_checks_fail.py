"""Every check the kernel and equivalence suites make fails when its fault is planted.

The suites are run on the CPU in a subprocess with ``pytest_lstmperf.testing.faults`` loaded; each fault is
applied behind the suite's back (at configure time) and the run must fail, naming the path and the check.
A clean run of the same selection passes, so a failure is the fault's doing.
"""

from __future__ import annotations

import numpy as np
import pytest
from forked_pytest import runpytest_forked
from pytester_runs import suites_args

pytest.importorskip("torch", reason="the suites run PyTorch paths (pip install 'pytest-lstmperf[torch]')")


def run_suites(pytester: pytest.Pytester, paths: str, plant: str | None = None) -> pytest.RunResult:
    args = suites_args(paths)
    if plant:
        args += ["-p", "pytest_lstmperf.testing.faults", f"--lstmperf-plant={plant}"]
    return runpytest_forked(pytester, *args)


def test_clean_run_passes(clean_suites_run: pytest.RunResult) -> None:
    """The same selection without a fault (the session's clean run of the suites on every CPU torch path)."""
    result = clean_suites_run
    assert result.ret == 0, result.stdout.str()
    assert "FINDINGS" not in result.stdout.str()


def test_onednn_disabled_behind_the_suites_back_fails_the_kernel_check(pytester) -> None:
    result = run_suites(pytester, "torch-cpu-onednn", plant="onednn-off")
    assert result.ret == 1
    out = result.stdout.str()
    assert "path torch-cpu-onednn on " in out
    assert "expected kernel family 'onednn', observed 'cpu-native'" in out
    assert "lstmperf FINDINGS:" in out
    result.stdout.fnmatch_lines(["*test_kernel_claim[[]torch-cpu-onednn-lstm[]]*"])


def test_perturbed_output_fails_the_tolerance_check(pytester) -> None:
    result = run_suites(pytester, "torch-cpu-native", plant="perturb:1e-3")
    assert result.ret == 1
    out = result.stdout.str()
    assert "path torch-cpu-native on " in out
    # held to the bound of the kernel family the trace observed
    assert "[tolerance] output: relative error 1.000e-03 against the float64 reference exceeds the " in out
    assert "exceeds the cpu-native/fp32 forward tolerance" in out
    result.stdout.fnmatch_lines(["*test_matches_reference[[]torch-cpu-native[]]*"])
    # the kernel claim does not look at numbers and still passes
    assert not any("test_kernel_claim" in line and "FAILED" in line for line in out.splitlines())


def test_autocast_not_applied_fails_the_precision_check(pytester) -> None:
    # the native-kernel bf16 path runs on every CPU (the oneDNN one needs bf16 hardware)
    result = run_suites(pytester, "torch-cpu-native-autocast-bf16", plant="wrong-precision")
    assert result.ret == 1
    out = result.stdout.str()
    assert "path torch-cpu-native-autocast-bf16 on " in out
    assert "expected precision 'bf16', observed 'fp32'" in out


def test_nan_output_fails_the_finite_check(pytester) -> None:
    result = run_suites(pytester, "torch-cpu-native", plant="perturb:nan")
    assert result.ret == 1
    assert "[nan] output: " in result.stdout.str()
    assert "values are NaN or Inf" in result.stdout.str()


def test_pairwise_check_fails_when_one_side_is_perturbed(lstmperf_case_result) -> None:
    from pytest_lstmperf.numerics.checks import check_against

    spec, result = lstmperf_case_result
    other = type(result)(**{**result.__dict__, "output": result.output * (1 + 1e-4)})
    found, _ = check_against(result, other, spec, "fp32", pairwise_with="torch-cpu-native")
    assert [m.check for m in found] == ["pairwise"]
    assert "against path torch-cpu-native" in found[0].message


@pytest.fixture
def lstmperf_case_result():
    from pytest_lstmperf import paths
    from pytest_lstmperf.device import resolve_device
    from pytest_lstmperf.model.case import make_case
    from pytest_lstmperf.model.spec import LayerSpec

    spec = LayerSpec(initial_state=True)
    result = paths.get("torch-cpu-native").prepare(make_case(spec), resolve_device("cpu")).run()
    return spec, result


def test_unit_checks_each_fail_on_their_fault(lstmperf_case_result) -> None:
    from pytest_lstmperf.model.case import make_case
    from pytest_lstmperf.model.reference import run_reference
    from pytest_lstmperf.numerics.checks import check_against, check_finite, check_trace

    spec, result = lstmperf_case_result
    reference = run_reference(make_case(spec))
    assert check_against(result, reference, spec, "fp32")[0] == []
    assert check_trace(("cpu-native", "fp32"), result.forward_trace, "forward") == []
    # kernel and precision
    assert [m.check for m in check_trace(("onednn", "fp32"), result.forward_trace, "forward")] == ["kernel"]
    assert [m.check for m in check_trace(("cpu-native", "bf16"), result.backward_trace, "backward")] == ["precision"]
    assert [m.check for m in check_trace(("cpu-native", "fp32"), None, "backward")] == ["kernel"]
    # one gradient perturbed just above the fp32 tolerance, one missing
    grads = dict(result.grads)
    grads["weight_hh_l0"] = grads["weight_hh_l0"] * (1 + 1e-4)
    del grads["bias_ih_l0"]
    broken = type(result)(**{**result.__dict__, "grads": grads})
    found, errors = check_against(broken, reference, spec, "fp32")
    assert sorted((m.check, m.quantity) for m in found) == [
        ("missing", "grad bias_ih_l0"),
        ("tolerance", "grad weight_hh_l0"),
    ]
    assert errors["grad weight_hh_l0"] == pytest.approx(1e-4, rel=0.05)
    # NaN anywhere
    output = result.output.copy()
    output[0, 0, 0] = np.nan
    assert [m.check for m in check_finite(type(result)(**{**result.__dict__, "output": output}), spec)] == ["nan"]


def test_out_of_memory_is_reported_with_the_shape() -> None:
    from pytest_lstmperf.device import resolve_device
    from pytest_lstmperf.model.spec import LayerSpec
    from pytest_lstmperf.numerics.equivalence import PathCheckFailed, verify_path
    from pytest_lstmperf.session import LstmPerfSession

    class OutOfMemoryError(RuntimeError):
        pass

    class Exhausting:
        name = "fake-oom"

        def prepare(self, case, device):
            raise OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    session = LstmPerfSession.__new__(LstmPerfSession)
    session.settings = {"lstmperf_seed": type("R", (), {"value": 0})()}
    session.device = resolve_device("cpu")
    spec = LayerSpec(hidden_size=64, batch=8)
    with pytest.raises(PathCheckFailed) as info:
        verify_path(Exhausting(), spec, session)
    assert info.value.finding.check == "oom"
    assert "fake-oom ran out of device memory on lstm-I8-H64-L1-B8-T5" in str(info.value.finding.message)
