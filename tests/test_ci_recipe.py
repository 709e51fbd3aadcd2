"""The CI recipes in ``examples/ci/`` run as written: every command of their CPU job, in a fresh virtual
environment, on this machine.

What is covered, and what is not:

* each ``run`` step of the ``tests-cpu`` jobs is run by bash as a GitHub-hosted runner runs it (``-eo pipefail``,
  the workflow's ``env``), in a fresh copy of the checkout (the tracked files), with ``python`` a new virtual
  environment's; their install commands run as written (pip, build isolation and all), so a missing extra, a
  wrong package URL or an option pytest does not know fails here;
* the new environment reuses the packages already installed in the one running these tests (a ``.pth`` file
  adds its site-packages), as a runner's pip cache would: ``pip install torch==2.13.0 ...`` finds torch
  installed, and TensorFlow, JAX and ONNX Runtime are not downloaded again (about 2 GB). So a package an extra
  names but that is installed here anyway is not caught by this test (``test_histogram`` checks the extras that
  add packages of their own); the project and the plugin themselves are installed into the new environment, and
  the test checks that they are the ones imported;
* this repository's ``Tests`` step is ``python -m pytest tests suites examples --device=cpu -n 2``, the very
  command CI runs (about 18 minutes on 2 cores, and it includes this test): it is run as written plus
  ``--collect-only`` (every module imports and every option is known in the new environment), and as written
  plus a ``-k`` selection of a few tests of each folder (they pass, and the JUnit file is written);
* the user's-project recipe installs the plugin from a URL (``pytest-lstmperf[...] @ file://<a copy of this
  checkout>``, where a user sets a git URL) into a fresh environment and runs its ``Tests`` step as written on a
  small project that uses the marker and ``verify_model``;
* the GPU jobs need a GPU: ``scripts/validate.sh ci-recipe`` runs their commands on one.

Needs bash, ``python -m venv`` and the network (pip's build isolation fetches setuptools); a few minutes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from ci_recipe import Step, job_env, run_step, steps, workflow_env

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "examples" / "ci" / "lstmperf.yml"
OWN_PROJECT = ROOT / "examples" / "ci" / "lstmperf-own-project.yml"
#: a few quick tests of each folder the Tests step names: the plugin's units, a suite's kernel claims on the
#: CPU's oneDNN path, an example's cell loop
SELECTION = (
    "test_spec_round_trips or test_kernel_family_from_ops or (test_kernel_claim and torch-cpu-onednn and lstm) "
    "or test_training_step_runs_the_cell_kernels"
)
#: what a runner's job does not inherit from the run of these tests
CLEARED = ("PYTHONPATH", "VIRTUAL_ENV", "PYTEST_ADDOPTS", "PYTEST_PLUGINS")
CLEARED_PREFIXES = ("PYTEST_XDIST", "PYTEST_LSTMPERF")

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="the recipe's steps run in bash")


def _checkout(dest: Path) -> Path:
    """A fresh copy of this checkout's files, tracked or not yet but not ignored (what actions/checkout gives a
    job, for the commit these files become)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True)  # fmt: skip
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout, no tracked files to copy: {listed.stderr.strip()}")
    for name in filter(None, listed.stdout.split("\0")):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


@pytest.fixture(scope="module")
def fresh_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bin folder of a new virtual environment that sees this one's installed packages."""
    venv = tmp_path_factory.mktemp("ci-venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=600)
    site = Path(sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"])
    here = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (site / "zz_reuse_installed.pth").write_text(
        "".join(f"import site; site.addsitedir({path!r})\n" for path in here), encoding="utf-8"
    )
    return venv / "bin"


def _runner_env(bin_dir: Path, text: str, job: str, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in CLEARED and not k.startswith(("PYTEST_XDIST", "PYTEST_LSTMPERF"))
    }
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return {**env, **workflow_env(text), **job_env(text, job), **extra}


def _run(step: Step, cwd: Path, env: dict[str, str], extra: str = "") -> subprocess.CompletedProcess:
    done = run_step(Step(step.name, step.run + extra), cwd, env)
    assert done.returncode == 0, (
        f"step {step.name!r}{extra} exited {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    )
    return done


def _imported_from(bin_dir: Path, cwd: Path, env: dict[str, str]) -> Path:
    done = subprocess.run([str(bin_dir / "python"), "-c", "import pytest_lstmperf; print(pytest_lstmperf.__file__)"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip()).resolve()


def _junit(path: Path) -> dict[str, int]:
    suite = ET.parse(path).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    assert suite is not None
    return {key: int(suite.get(key, "0")) for key in ("tests", "failures", "errors", "skipped")}


def test_the_recipes_cpu_job_runs_as_written(fresh_python: Path, tmp_path: Path) -> None:
    text = RECIPE.read_text(encoding="utf-8")
    install, tests = steps(text, "tests-cpu")
    assert (install.name, tests.name) == ("Install", "Tests")
    assert tests.run.startswith("python -m pytest tests suites examples --device=cpu -n 2")
    checkout = _checkout(tmp_path / "checkout")
    env = _runner_env(fresh_python, text, "tests-cpu")
    _run(install, checkout, env)
    assert _imported_from(fresh_python, tmp_path, env).is_relative_to(checkout.resolve())
    # the step as written, narrowed to a few tests: each pytest-xdist worker still collects every test of the
    # job (tests, suites, examples), so an import or collection error anywhere fails the step (exit 0 asserted)
    ran = _run(tests, checkout, env, f" -k '{SELECTION}'")
    assert "error" not in ran.stdout.lower().strip().split("\n")[-1], ran.stdout[-2000:]
    counts = _junit(checkout / "junit-cpu.xml")
    assert counts["tests"] - counts["skipped"] >= 4 and counts["failures"] == counts["errors"] == 0, ran.stdout[-3000:]


USER_TEST = """
import pytest
import torch

import pytest_lstmperf


@pytest.fixture
def model():
    torch.manual_seed(0)
    return torch.nn.LSTM(8, 16, batch_first=True)


@pytest.mark.lstmperf_kernel(cpu="onednn", cuda="cudnn")
def test_training_step_runs_the_fast_kernel(model):
    model(torch.randn(2, 5, 8))[0].sum().backward()


def test_the_fp32_cpu_paths_match_float64(model):
    # a layer this small has bf16 gradient bounds too wide to compare (inconclusive, never a pass): fp32 paths
    pytest_lstmperf.verify_model(model, (torch.randn(2, 5, 8),), paths=["torch-cpu-onednn", "torch-cpu-native"])
"""


def test_the_own_project_recipes_cpu_job_installs_the_plugin_from_a_url(fresh_python: Path, tmp_path: Path) -> None:
    text = OWN_PROJECT.read_text(encoding="utf-8")
    install, tests = steps(text, "tests-cpu")
    assert "-e " not in install.run and '"pytest-lstmperf[' in install.run and "$LSTMPERF_PLUGIN" in install.run
    project = tmp_path / "project"
    (project / "tests").mkdir(parents=True)
    (project / "tests" / "test_model.py").write_text(USER_TEST, encoding="utf-8")
    unset = run_step(install, project, _runner_env(fresh_python, text, "tests-cpu", LSTMPERF_PLUGIN=""))
    assert unset.returncode == 1 and "set the repository variable LSTMPERF_PLUGIN" in unset.stdout
    plugin = _checkout(tmp_path / "pytest-lstmperf")
    env = _runner_env(fresh_python, text, "tests-cpu", LSTMPERF_PLUGIN=plugin.resolve().as_uri())
    _run(install, project, env)
    where = _imported_from(fresh_python, project, env)
    assert "site-packages" in where.parts and where.is_relative_to(fresh_python.parent.resolve()), where
    ran = _run(tests, project, env)
    counts = _junit(project / "junit-cpu.xml")
    assert counts == {"tests": 2, "failures": 0, "errors": 0, "skipped": 0}, ran.stdout[-3000:]
