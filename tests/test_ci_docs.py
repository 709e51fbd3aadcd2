"""The CI recipe stays true: the options the workflow and docs/ci.md use exist, the workflow's commands name
folders that exist, and the job summary shown in docs/ci.md is what ``ci_summary.markdown`` writes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from ci_recipe import steps

from pytest_lstmperf.ci_summary import SummaryRow, junit_properties, markdown

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / "examples" / "ci" / "lstmperf.yml"
OWN_PROJECT = ROOT / "examples" / "ci" / "lstmperf-own-project.yml"
CI_DOC = ROOT / "docs" / "ci.md"


@pytest.fixture(scope="module")
def pytest_help() -> str:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--help", "-p", "no:cacheprovider"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def _options(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])(--(?:lstmperf|benchmark|junit|device)[\w-]*)", text))


def test_every_option_of_the_recipe_exists(pytest_help: str) -> None:
    used = _options(WORKFLOW.read_text(encoding="utf-8")) | _options(CI_DOC.read_text(encoding="utf-8"))
    assert {"--benchmark-compare", "--lstmperf-update-baseline", "--lstmperf-save-baseline", "--device"} <= used
    missing = sorted(option for option in used if not re.search(rf"(?<![\w-]){re.escape(option)}\b", pytest_help))
    assert missing == [], f"not options of pytest with the plugin: {missing}"


def test_workflow_jobs_and_commands() -> None:
    text = WORKFLOW.read_text(encoding="utf-8")
    assert "\t" not in text
    jobs = re.findall(r"^  ([\w-]+):\n", text.split("\njobs:\n", 1)[1], flags=re.M)
    assert jobs == ["tests-cpu", "speed-gate", "update-baseline"]
    assert "pytest suites/ --device=cuda --benchmark-compare" in " ".join(text.split())
    assert "runs-on: [self-hosted, linux, gpu]" in text
    assert "pytest tests suites examples --device=cpu -n 2" in text
    for folder in ("tests", "suites", "examples"):
        assert (ROOT / folder).is_dir()
    # the label the docs tell reviewers to add is the one the workflow reacts to
    label = re.search(r"github\.event\.label\.name == '([\w-]+)'", text)
    assert label is not None and f"`{label.group(1)}`" in CI_DOC.read_text(encoding="utf-8")
    # pytest-lstmperf's extras named by the install steps exist
    extras = set(re.findall(r"-e '\.\[([\w,]+)\]'", text))
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    for group in extras:
        for extra in group.split(","):
            assert re.search(rf"^{extra} = \[", pyproject, flags=re.M), extra


def _doc_example() -> str:
    doc = CI_DOC.read_text(encoding="utf-8")
    start = doc.index("  ```\n  ### lstmperf speed gate")
    block = doc[start:].split("\n", 1)[1]
    return textwrap.dedent(block[: block.index("  ```")])


def test_the_summary_shown_in_the_docs_is_what_the_code_writes() -> None:
    shown = _doc_example()
    rows = []
    for line in shown.splitlines():
        if line.startswith("| suites/"):
            name, verdict, kernel, ratio, limit, note = (c.strip() for c in line.strip("|").split(" | "))
            rows.append(SummaryRow(name, verdict, kernel, float(ratio[:-1]), float(limit[:-1]), note))
    assert len(rows) == 2
    rows += [SummaryRow(f"u{i}", "unchanged", "cudnn/fp32", 1.0, 1.1, "") for i in range(74)]
    rows += [SummaryRow(f"i{i}", "improved", "cudnn/fp32", 0.8, 1.1, "") for i in range(2)]
    headline = "speed gate: 1 kernel-changed, 1 regressed, 2 improved, 74 unchanged"
    assert markdown(rows, headline) == shown
    doc = " ".join(CI_DOC.read_text(encoding="utf-8").split())
    properties = dict(junit_properties(rows, headline))
    assert properties["lstmperf.gate"] == headline and properties["lstmperf.gate.failed"] == "2"
    for documented in ("`lstmperf.gate`", "`lstmperf.gate.failed`", "`lstmperf.gate.<verdict>`",
                       "`lstmperf.gate.failed.<benchmark>`"):  # fmt: skip
        assert documented in doc
    value = properties[f"lstmperf.gate.failed.{rows[1].name}"]
    assert value.startswith("regressed: kernel cudnn/tf32, 1.243x (fails at 1.050x); ")
    assert "`regressed: kernel cudnn/tf32, 1.243x (fails at 1.050x); ...`" in doc


#: a pytest command without the interpreter or folder that has the plugin: at a command's start in a code block
#: (after `$ `, `VAR=value ` or `&&`, `;`, `|`), or an inline code span that starts with it
_BARE_IN_BLOCK = re.compile(r"(?:^\s*(?:\$\s+)?(?:\w+=\S*\s+)*|(?:&&|;|\|)\s*)pytest(?=\s|$)")


def bare_pytest_commands(text: str) -> list[tuple[int, str]]:
    """(line number, code) of every bare ``pytest`` command in a Markdown text's fenced code blocks and inline
    code spans (``.venv/bin/pytest`` and ``python -m pytest`` are not bare)."""
    found = []
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced:
            if _BARE_IN_BLOCK.search(line.split(" #", 1)[0]):
                found.append((number, line.strip()))
        else:
            found += [(number, span) for span in re.findall(r"`([^`]+)`", line) if re.match(r"pytest\s", span)]
    return found


def test_bare_pytest_commands_are_found() -> None:
    planted = "Run `pytest suites/` or `.venv/bin/pytest x`.\n```bash\n$ pytest a  # x\nA=1 pytest b\n"
    planted += "cd x && pytest c\n"
    planted += ".venv/bin/pytest d\npython -m pytest e\n# pytest in a comment\n```\npytest outside a block\n"
    assert bare_pytest_commands(planted) == [(1, "pytest suites/"), (3, "$ pytest a  # x"), (4, "A=1 pytest b"),
                                             (5, "cd x && pytest c")]  # fmt: skip


def test_the_docs_run_pytest_from_the_environment_that_has_the_plugin() -> None:
    """A bare ``pytest`` outside the activated virtual environment is another pytest, without the plugin
    (``unrecognized arguments: --device=cpu``): the README and docs write ``.venv/bin/pytest`` (the Install
    section's environment) or ``python -m pytest``."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    bare = [f"{page.relative_to(ROOT)}:{number}: {code}" for page in pages
            for number, code in bare_pytest_commands(page.read_text(encoding="utf-8"))]  # fmt: skip
    assert bare == [], "bare pytest commands:\n" + "\n".join(bare)


#: the extras of pytest-lstmperf a framework of the paths needs (keras comes with the tensorflow and jax extras)
FRAMEWORK_EXTRAS = {
    "torch": {"torch"},
    "torch-compile": {"torch"},
    "keras-torch": {"torch", "jax|tensorflow"},
    "keras-jax": {"jax"},
    "keras-tensorflow": {"tensorflow"},
    "onnxruntime": {"onnx"},
}


def missing_extras(install: str, frameworks: set[str]) -> dict[str, set[str]]:
    """framework -> the extras it needs that ``install`` (a job's install commands) does not name."""
    named: set[str] = set()
    for group in re.findall(r"pytest-lstmperf\[([\w,]+)\]|-e '\.\[([\w,]+)\]'", install):
        named |= set(",".join(group).strip(",").split(","))
    missing = {}
    for framework in frameworks:
        needs = FRAMEWORK_EXTRAS.get(framework, {framework})
        lacking = {extra for extra in needs if not set(extra.split("|")) & named}
        if lacking:
            missing[framework] = lacking
    return missing


def test_the_gpu_jobs_install_every_framework_of_the_committed_baselines() -> None:
    """A framework the committed baselines time but the job does not install would lose its paths, and each of
    its benchmarks would fail the gate as path-lost."""
    frameworks = set()
    for baseline in sorted((ROOT / "baselines").glob("*.json")):
        data = json.loads(baseline.read_text(encoding="utf-8"))
        frameworks |= {b["extra_info"]["framework"] for b in data["benchmarks"]}
    assert {"torch", "keras-torch", "keras-jax"} <= frameworks
    text = WORKFLOW.read_text(encoding="utf-8")
    for job in ("speed-gate", "update-baseline"):
        install = next(step.run for step in steps(text, job) if step.name == "Install")
        assert missing_extras(install, frameworks) == {}, job
        if "keras-jax" in frameworks:  # JAX's CUDA build, or Keras on JAX would run on the CPU
            assert "'jax[cuda" in install, job
    # planted: the install line the recipe had, and a baseline with Keras on TensorFlow
    assert missing_extras(".venv/bin/pip install -e '.[torch,test]'", frameworks) == {
        "keras-torch": {"jax|tensorflow"}, "keras-jax": {"jax"}}  # fmt: skip
    assert missing_extras(install, frameworks | {"keras-tensorflow"}) == {"keras-tensorflow": {"tensorflow"}}


def test_the_own_project_recipe_uses_real_options_and_extras(pytest_help: str) -> None:
    text = OWN_PROJECT.read_text(encoding="utf-8")
    used = _options(text)
    assert {"--benchmark-compare", "--lstmperf-update-baseline", "--device"} <= used
    missing = sorted(option for option in used if not re.search(rf"(?<![\w-]){re.escape(option)}\b", pytest_help))
    assert missing == [], f"not options of pytest with the plugin: {missing}"
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    extras = {e for group in re.findall(r"pytest-lstmperf\[([\w,]+)\]", code) for e in group.split(",")}
    assert extras >= {"torch", "test"}
    assert all(re.search(rf"^{extra} = \[", pyproject, flags=re.M) for extra in extras), extras
    assert "-e ." not in text and "-e '." not in text  # a user's repository is not this project
    jobs = re.findall(r"^  ([\w-]+):\n", text.split("\njobs:\n", 1)[1], flags=re.M)
    assert jobs == ["tests-cpu", "speed-gate", "update-baseline"]
