"""Installed but unused: a project's own --device, no torch import, no INTERNALERROR on an empty selection;
and the public API imports nothing heavy."""

from __future__ import annotations

import subprocess
import sys

import pytest

OWN_DEVICE_CONFTEST = """
def pytest_addoption(parser):
    parser.addoption("--device", default="none", help="the project's own device option")
"""

OWN_DEVICE_TEST = """
import sys

def test_own_device(pytestconfig):
    assert pytestconfig.getoption("device") == "tpu"
    assert "torch" not in sys.modules and "tensorflow" not in sys.modules
"""


def test_project_with_its_own_device_option(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(OWN_DEVICE_CONFTEST)
    pytester.makepyfile(test_own=OWN_DEVICE_TEST)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--device=tpu")
    result.assert_outcomes(passed=1)
    # the plugin's device setting stays reachable under its own name
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--device=tpu", "--lstmperf-device=cuda:x")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--lstmperf-device=cuda:x: invalid device*"])


def test_device_alias_where_nobody_owns_it(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_dev="def test_device(lstmperf_device):\n    assert lstmperf_device == 'cpu'\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--device=cpu")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*[[]--device=cpu[]]*"])
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--device=bogus")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--device=bogus*valid*"])


def test_empty_path_selection_is_a_skip_that_says_why(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_sel="""
import pytest

@pytest.mark.lstmperf_paths("keras-tf-cpu", "keras-torch-cpu")
def test_keras_only(lstmperf_path):
    pass

def test_any(lstmperf_path):
    pass
"""
    )
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--device=cpu", "--lstmperf-paths=torch-cpu-native", "-rs", "--co", "-q"
    )
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["*test_keras_only[[]no-path-selected[]]*", "*test_any[[]torch-cpu-native[]]*"])
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--device=cpu", "--lstmperf-paths=torch-cpu-native", "-rs", "-k", "keras_only"
    )
    result.stdout.fnmatch_lines(["*none of this test's 2 paths (keras-tf-cpu, keras-torch-cpu) is in the selection*"])


def test_a_benchmark_set_with_no_shape_for_the_selected_paths_is_a_skip_that_says_why(
    pytester: pytest.Pytester,
) -> None:
    """The CPU gate set times the packed path forward only: its training benchmark is one skip naming the path
    and the set that has more shapes, not pytest's "got empty parameter set"."""
    pytester.makepyfile(
        test_bench="""
from pytest_lstmperf.hooks.bench import bench_params

def pytest_generate_tests(metafunc):
    metafunc.parametrize("bench_case", bench_params(metafunc.config, "train"))

def test_training(bench_case):
    pass
"""
    )
    result = pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", "--device=cpu", "--lstmperf-paths=torch-cpu-packed", "-rs"
    )
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.stdout.fnmatch_lines(
        ["*none of the gate set's train shapes runs on torch-cpu-packed; --lstmperf-bench-set=thorough has more*"]
    )
    assert "empty parameter set" not in result.stdout.str()


def test_public_api_imports_no_framework() -> None:
    code = (
        "import sys, pytest_lstmperf as p; "
        "assert not {'torch', 'tensorflow', 'keras', 'jax'} & set(sys.modules); "
        "assert isinstance(p.__version__, str) and p.__version__; "
        "assert set(p.__all__) <= set(dir(p)); "
        "missing = [n for n in p.__all__ if getattr(p, n, None) is None]; assert not missing, missing; "
        "print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().endswith("ok"), out.stderr
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        import pytest_lstmperf

        pytest_lstmperf.nope  # noqa: B018
