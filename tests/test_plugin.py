"""The plugin's options, their errors and precedence, the header, skips, --help and xdist (pytester)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
from forked_pytest import runpytest_forked
from pytester_runs import clear_inner_env

REPO = Path(__file__).resolve().parents[1]
SUITES = REPO / "suites"
USAGE_ERROR = 4

pytest.importorskip("torch", reason="the plugin's runs need torch (pip install 'pytest-lstmperf[torch]')")


def run(pytester: pytest.Pytester, *args: str, env: dict[str, str] | None = None) -> pytest.RunResult:
    if env:
        for key, value in env.items():
            pytester._monkeypatch.setenv(key, value)
    return runpytest_forked(pytester, "-p", "no:cacheprovider", *args)


@pytest.fixture
def suite_copy(pytester: pytest.Pytester) -> pytest.Pytester:
    """A project holding a tiny test that uses the plugin's path fixture."""
    pytester.makepyfile(
        test_tiny="""
        from pytest_lstmperf.model.spec import LayerSpec
        from pytest_lstmperf.numerics.equivalence import verify_path

        def test_one(lstmperf_path, lstmperf, request):
            verify_path(lstmperf_path, LayerSpec(), lstmperf, request.node)
        """
    )
    return pytester


def test_help_imports_no_framework() -> None:
    code = textwrap.dedent(
        """
        import sys, pytest
        rc = pytest.main(["--help", "-p", "no:cacheprovider"])
        heavy = sorted(m for m in ("torch", "tensorflow", "keras", "jax") if m in sys.modules)
        print("HEAVY:", heavy)
        sys.exit(rc)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "--device=DEVICE" in proc.stdout
    assert "--lstmperf-paths=NAMES" in proc.stdout
    assert "--lstmperf-profile=PROFILE" in proc.stdout
    assert "HEAVY: []" in proc.stdout


@pytest.mark.parametrize(
    ("args", "env", "ini", "message"),
    [
        (["--device=tpu"], {}, "", "--device=tpu: invalid device 'tpu' (valid: auto, cpu, cuda, cuda:N)"),
        (["--device=cpu:1"], {}, "", "invalid device 'cpu:1'"),
        ([], {"PYTEST_LSTMPERF_DEVICE": "gpu"}, "", "PYTEST_LSTMPERF_DEVICE=gpu: invalid device 'gpu'"),
        ([], {}, "lstmperf_device = cuda:x", "ini lstmperf_device=cuda:x: invalid device"),
        (["--lstmperf-paths=torch-cpu-nope"], {}, "", "unknown path 'torch-cpu-nope' (valid: default, all, "),
        (["--lstmperf-profile=weekly"], {}, "", "invalid value 'weekly' (valid: ci, gpu, nightly)"),
        ([], {}, "lstmperf_profile = bogus", "ini lstmperf_profile=bogus: invalid value 'bogus'"),
        (["--lstmperf-seed=-3"], {}, "", "--lstmperf-seed=-3: '-3' must be >= 0"),
    ],
)
def test_bad_settings_are_usage_errors(pytester, args, env, ini, message) -> None:
    if ini:
        pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile(test_x="def test_x(): pass")
    result = run(pytester, *args, env=env)
    assert result.ret == USAGE_ERROR, result.stdout.str() + result.stderr.str()
    assert message in result.stderr.str()
    assert "Traceback" not in result.stderr.str() + result.stdout.str()
    assert "INTERNALERROR" not in result.stderr.str() + result.stdout.str()


def test_cuda_without_gpu_is_a_usage_error_not_a_skip(pytester) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU; the CPU-only behaviour is what is under test")
    pytester.makepyfile(test_x="def test_x(): pass")
    for value in ("cuda", "cuda:7"):
        result = run(pytester, f"--device={value}")
        assert result.ret == USAGE_ERROR
        err = result.stderr.str()
        assert f"--device={value}: no usable CUDA device" in err
        assert "--device=cpu" in err  # says what to do
    result = run(pytester, env={"PYTEST_LSTMPERF_DEVICE": "cuda"})
    assert result.ret == USAGE_ERROR
    assert "PYTEST_LSTMPERF_DEVICE=cuda: no usable CUDA device" in result.stderr.str()


def test_cuda_index_beyond_the_gpus_present_names_them(monkeypatch) -> None:
    import torch

    from pytest_lstmperf.device import DeviceError, resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(DeviceError, match=r"--device=cuda:7: only 1 CUDA device present \(valid: cuda:0\)"):
        resolve_device("cuda:7")


@pytest.mark.parametrize(
    ("args", "env", "ini", "source"),
    [
        (["--device=cpu"], {"PYTEST_LSTMPERF_DEVICE": "cuda:9"}, "lstmperf_device = cuda:9", "[--device=cpu]"),
        ([], {"PYTEST_LSTMPERF_DEVICE": "cpu"}, "lstmperf_device = cuda:9", "[PYTEST_LSTMPERF_DEVICE=cpu]"),
        ([], {}, "lstmperf_device = cpu", "[ini lstmperf_device=cpu]"),
        ([], {}, "", "[default]"),
    ],
)
def test_precedence_cli_env_ini_default(suite_copy, args, env, ini, source) -> None:
    import torch

    if torch.cuda.is_available() and source == "[default]":
        pytest.skip("auto picks the GPU here")
    if ini:
        suite_copy.makeini(f"[pytest]\n{ini}\n")
    result = run(suite_copy, "--lstmperf-paths=torch-cpu-native", *args, env=env)
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    escaped = "".join({"[": "[[]", "]": "[]]"}.get(ch, ch) for ch in source)
    result.stdout.fnmatch_lines([f"lstmperf: device cpu (*) {escaped}"])


def test_header_names_device_fingerprint_and_paths(suite_copy) -> None:
    result = run(suite_copy, "--device=cpu", "--lstmperf-paths=torch-cpu-native,torch-cpu-onednn")
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        [
            "lstmperf: device cpu (*, 1 thread, oneDNN *, torch *) [[]--device=cpu[]]",
            "lstmperf: paths torch-cpu-native, torch-cpu-onednn; hypothesis profile ci *",
        ]
    )
    result.assert_outcomes(passed=2)


def test_paths_for_another_device_only_is_a_usage_error(suite_copy) -> None:
    result = run(suite_copy, "--device=cpu", "--lstmperf-paths=torch-cudnn-fp32")
    assert result.ret == USAGE_ERROR
    assert "none of these paths runs on cpu" in result.stderr.str()


def test_unavailable_path_is_skipped_with_its_reason(suite_copy) -> None:
    suite_copy.makeconftest(
        """
        from pytest_lstmperf import paths

        def never(path, device):
            return "needs a widget this machine lacks (install one)"

        paths.all_paths()
        base = paths.get("torch-cpu-native")
        paths.register_path(paths.ExecutionPath(
            name="fake-cpu-widget", framework="torch", device="cpu", kernel="cpu-native", precision="fp32",
            description="a path that is never available", prepare_ref=base.prepare_ref,
            available_ref="conftest:never", supports_ref=base.supports_ref))
        """
    )
    result = run(suite_copy, "--device=cpu", "-rs", "--lstmperf-paths=torch-cpu-native,fake-cpu-widget")
    result.stdout.fnmatch_lines(
        [
            "lstmperf: path fake-cpu-widget unavailable: needs a widget this machine lacks (install one)",
            "*SKIPPED*fake-cpu-widget: needs a widget this machine lacks (install one)",
        ]
    )
    assert result.ret == 0


def test_a_path_awaiting_its_worker_is_asked_on_first_use_and_runs_last_in_its_file(suite_copy) -> None:
    """A GPU Keras path's worker starts with the session and is not waited for (6 s of imports on the H100):
    its availability is asked when its first test runs, once, and its tests run after the others of their
    file. Planted here on the CPU: a path marked as awaiting a worker that cannot start."""
    suite_copy.makeconftest(
        """
        import types
        from pytest_lstmperf import paths
        from pytest_lstmperf.paths.keras import paths as keras_paths

        RAN = []

        def pytest_runtest_logreport(report):
            if report.when == "call":
                RAN.append(report.nodeid)

        def no_worker(path, device):
            with open("asked.txt", "a") as fh:
                fh.write(f"asked after {len(RAN)} test(s)\\n")
            return "its worker cannot start: planted"

        paths.all_paths()
        base = paths.get("torch-cpu-native")
        paths.register_path(paths.ExecutionPath(
            name="awaiting-cpu-worker", framework="keras", device="cpu", kernel="cpu-native", precision="fp32",
            description="a path whose worker is starting", prepare_ref=base.prepare_ref,
            available_ref="conftest:no_worker", supports_ref=base.supports_ref,
            options={"keras": types.SimpleNamespace(backend="planted")}))
        keras_paths.prestart_workers = lambda selected: [p for p in selected if p.name == "awaiting-cpu-worker"]
        """
    )
    suite_copy.makepyfile(
        test_other="""
        def test_plain():
            pass
        """
    )
    result = run(suite_copy, "--device=cpu", "-v", "-rs", "--lstmperf-paths=awaiting-cpu-worker,torch-cpu-native")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "lstmperf: Keras workers (planted) starting beside the first tests: their paths' tests run last*",
            "test_other.py::test_plain PASSED*",
            "test_tiny.py::test_one[[]torch-cpu-native[]] PASSED*",
            "test_tiny.py::test_one[[]awaiting-cpu-worker[]] SKIPPED*",
            "*awaiting-cpu-worker*0/  0/  1*(skipped: awaiting-cpu-worker: its worker cannot start: planted)",
            "*SKIPPED*awaiting-cpu-worker: its worker cannot start: planted",
        ]
    )
    # asked once, when its test came (after the two others), not while the session started
    assert (suite_copy.path / "asked.txt").read_text().splitlines() == ["asked after 2 test(s)"]


def test_the_gate_asks_every_path_still_awaiting_its_worker(monkeypatch) -> None:
    """A path that no test used is asked at the end, so the gate knows an unavailable path from a missing one."""
    from pytest_lstmperf import paths as registry
    from pytest_lstmperf.device import resolve_device
    from pytest_lstmperf.session import LstmPerfSession

    asked = []
    path = registry.get("torch-cpu-native")
    monkeypatch.setattr(type(path), "available", lambda self, device: asked.append(self.name) or "no worker")
    session = LstmPerfSession(None, {}, resolve_device("cpu"), [path], {}, awaiting_worker={path.name})  # type: ignore[arg-type]
    assert not asked  # not at the start
    assert session.resolve_unavailable() == {"torch-cpu-native": "no worker"}
    assert session.resolve_unavailable() == {"torch-cpu-native": "no worker"} and asked == ["torch-cpu-native"]
    assert session.unavailable_reason(path) == "no worker" and asked == ["torch-cpu-native"]


def test_a_torch_compile_path_is_asked_at_its_first_test_and_skips_there_with_its_reason(pytester, monkeypatch) -> None:
    """torch.compile's availability check imports Dynamo (seconds): a run that never uses the path does not
    import it; one that does asks at the path's first test, which skips with the reason where it cannot run."""
    pytest.importorskip("torch")
    pytester.makepyfile(
        test_dynamo="""
        import sys

        def test_not_imported(lstmperf):
            assert "torch._dynamo" not in sys.modules
        """
    )
    pytester.makepyfile(test_kernels=(Path(__file__).parents[1] / "suites" / "test_kernels.py").read_text())
    clear_inner_env(monkeypatch)
    monkeypatch.setenv("CXX", "no-such-compiler++")
    # real subprocesses: a forked run starts with what its server imported
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--device=cpu", "--lstmperf-paths=torch-compile-cpu", "-rs", "test_dynamo.py"
    )
    assert result.ret == 0, result.stdout.str()
    assert "unavailable" not in result.stdout.str()  # not asked: nothing to say
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--device=cpu", "--lstmperf-paths=torch-compile-cpu", "-rs", "test_kernels.py"
    )
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["*SKIPPED*torch-compile-cpu: no C++ compiler on PATH*"])
    assert "passed" not in result.stdout.str().splitlines()[-1]


def test_unused_plugin_resolves_no_device(pytester) -> None:
    """Installed but unused: a project whose tests don't use the plugin gets no header and no torch import."""
    pytester.makepyfile(
        test_plain="""
        import sys
        def test_plain():
            assert "torch" not in sys.modules
        """
    )
    # a real subprocess: a forked run starts with torch imported (tests/forked_pytest.py)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == 0
    assert "lstmperf:" not in result.stdout.str()


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_suites_run_serial_and_under_xdist(pytester, request, xdist) -> None:
    if xdist:
        pytest.importorskip("xdist")
        result = run(
            pytester,
            str(SUITES / "test_kernels.py"),
            str(SUITES / "test_equivalence.py"),
            "--device=cpu",
            "--lstmperf-paths=torch-cpu-native,torch-cpu-onednn",
            *xdist,
        )
    else:  # serial: the session's clean run of the same suites (on these two paths and the CPU autocast ones)
        result = request.getfixturevalue("clean_suites_run")
    assert result.ret == 0, result.stdout.str()
    out = result.stdout.str()
    assert "failed" not in out.splitlines()[-1]
    result.stdout.fnmatch_lines(
        [
            "lstmperf: per path (passed/failed/skipped; kernels observed)",
            "*torch-cpu-native * 3/  0/  0  bwd cpu-native/fp32; fwd cpu-native/fp32",
            "*torch-cpu-onednn~torch-cpu-native *",
        ]
    )


def test_extended_paths_leave_the_default_selection_and_run_when_asked(monkeypatch) -> None:
    """Paths slow to compile per shape (inductor's RNN graphs, the XLA loops of Keras on JAX on a GPU) are out
    of the default selection, which says so in the header; 'all' or naming one selects it."""
    import dataclasses

    from pytest_lstmperf import options
    from pytest_lstmperf import paths as registry
    from pytest_lstmperf.device import resolve_device
    from pytest_lstmperf.session import LstmPerfSession

    extended = {name for name, path in registry.all_paths().items() if path.extended}
    assert {"torch-compile-inductor-graphs", "keras-jax-cuda-generic"} <= extended
    assert not extended & set(registry.default_names())
    assert options._parse_paths("default") is None and options._parse_paths("") is None
    assert registry.selection(options._parse_paths("default")) is None
    assert set(registry.selection("all")) == set(registry.all_paths())
    assert registry.selection("keras-jax-cuda-generic") == ("keras-jax-cuda-generic",)
    assert not extended & {p.name for p in registry.for_device("cuda")}

    slow = dataclasses.replace(registry.get("torch-cpu-native"), name="slow-cpu-path", extended="compiles slowly")
    monkeypatch.setitem(registry.REGISTRY, "slow-cpu-path", slow)
    settings = {
        "lstmperf_device": types.SimpleNamespace(where=lambda: "default"),
        "lstmperf_paths": types.SimpleNamespace(value=None),
        "lstmperf_profile": types.SimpleNamespace(value="ci"),
        "lstmperf_seed": types.SimpleNamespace(value=0),
    }
    session = LstmPerfSession(None, settings, resolve_device("cpu"), [], {})  # type: ignore[arg-type]
    (line,) = [text for text in session.header_lines() if "extended" in text]
    assert "slow-cpu-path (compiles slowly)" in line and "--lstmperf-paths=all" in line


def test_the_header_says_when_every_process_compiles_torch_anew(tmp_path, monkeypatch) -> None:
    """A Python that may not write bytecode, beside a torch installed without any, compiles torch's modules in every
    process of the run: the header says so and what to set. Silent where bytecode is written or found."""
    import importlib.util
    import py_compile

    from pytest_lstmperf import session as session_module
    from pytest_lstmperf.device import resolve_device

    torch_dir = tmp_path / "torch"
    probe = torch_dir / session_module.TORCH_PROBE_MODULE
    probe.parent.mkdir(parents=True)
    probe.write_text("x = 1\n")
    line = session_module.recompiled_torch_line(dont_write=True, torch_dir=str(torch_dir))
    assert line is not None and "PYTHONDONTWRITEBYTECODE" in line and "PYTHONPYCACHEPREFIX" in line
    assert session_module.recompiled_torch_line(dont_write=False, torch_dir=str(torch_dir)) is None
    assert session_module.recompiled_torch_line(dont_write=True, torch_dir=str(tmp_path / "elsewhere")) is None
    py_compile.compile(str(probe), cfile=importlib.util.cache_from_source(str(probe)), doraise=True)
    assert session_module.recompiled_torch_line(dont_write=True, torch_dir=str(torch_dir)) is None

    settings = {
        "lstmperf_device": types.SimpleNamespace(where=lambda: "default"),
        "lstmperf_paths": types.SimpleNamespace(value=None),
        "lstmperf_profile": types.SimpleNamespace(value="ci"),
        "lstmperf_seed": types.SimpleNamespace(value=0),
    }
    session = session_module.LstmPerfSession(None, settings, resolve_device("cpu"), [], {})  # type: ignore[arg-type]
    monkeypatch.setattr(session_module, "recompiled_torch_line", lambda: "lstmperf: Python writes no bytecode")
    assert "lstmperf: Python writes no bytecode" in session.header_lines()
    monkeypatch.setattr(session_module, "recompiled_torch_line", lambda: None)
    assert not [text for text in session.header_lines() if "bytecode" in text]


def test_the_header_says_keras_on_jax_runs_its_cpu_calls_inline_where_it_runs() -> None:
    """A CPU run fixes threads, and its Keras-on-JAX worker runs JAX's CPU calls inline (server.one_thread_dispatch):
    the threads line says the second where a Keras-on-JAX path runs, and only there."""
    from pytest_lstmperf import paths as registry
    from pytest_lstmperf.device import resolve_device
    from pytest_lstmperf.session import LstmPerfSession

    settings = {
        "lstmperf_device": types.SimpleNamespace(where=lambda: "default"),
        "lstmperf_paths": types.SimpleNamespace(value=None),
        "lstmperf_profile": types.SimpleNamespace(value="ci"),
        "lstmperf_seed": types.SimpleNamespace(value=0),
        "lstmperf_threads": types.SimpleNamespace(value=1, where=lambda: "default"),
        "lstmperf_xla_cache": types.SimpleNamespace(where=lambda: "default"),
    }

    def threads_line(*names: str) -> str:
        paths = [registry.get(name) for name in names]
        session = LstmPerfSession(None, settings, resolve_device("cpu"), paths, {})  # type: ignore[arg-type]
        (line,) = [text for text in session.header_lines() if "CPU threads fixed at 1" in text]
        return line

    assert "Keras on JAX runs each CPU call inline" in threads_line("torch-cpu-native", "keras-jax-cpu")
    assert "inline" not in threads_line("torch-cpu-native", "keras-torch-cpu")
