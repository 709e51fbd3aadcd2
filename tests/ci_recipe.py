"""The commands of the GitHub Actions recipes in ``examples/ci/``, read from their YAML, and a job run as written.

The recipes keep to a small part of YAML (two-space indents, ``run: |`` literal blocks, ``run: >`` folded
ones, one-line values), so they are read without a YAML library. :func:`run_step` runs one step's command as a
GitHub-hosted runner does (``bash --noprofile --norc -eo pipefail``, the workflow's and the job's ``env``, in
the checkout). ``python tests/ci_recipe.py FILE JOB`` prints the job's steps (name, then the command), for
``scripts/validate.sh ci-recipe``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Step:
    name: str
    run: str


def _block(lines: list[str], start: int, indent: int) -> tuple[list[str], int]:
    """The lines after ``start`` indented deeper than ``indent`` (blank lines kept), and the index after them."""
    out, i = [], start + 1
    while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent):
        out.append(lines[i])
        i += 1
    while out and not out[-1].strip():
        out.pop()
    return out, i


def _env(lines: list[str]) -> dict[str, str]:
    env = {}
    for line in lines:
        found = re.match(r"\s*([A-Z_][A-Z0-9_]*):\s*(.*)$", line)
        if found and not line.lstrip().startswith("#"):
            env[found.group(1)] = found.group(2).split(" #")[0].strip().strip('"')
    return env


def workflow_env(text: str) -> dict[str, str]:
    lines = text.splitlines()
    start = lines.index("env:")
    return _env(_block(lines, start, 0)[0])


def job_lines(text: str, job: str) -> list[str]:
    lines = text.splitlines()
    return _block(lines, lines.index(f"  {job}:"), 2)[0]


def job_env(text: str, job: str) -> dict[str, str]:
    lines = job_lines(text, job)
    return _env(_block(lines, lines.index("    env:"), 4)[0]) if "    env:" in lines else {}


def steps(text: str, job: str) -> list[Step]:
    """The ``run`` steps of ``job``, in order (``uses`` steps are left out)."""
    lines = job_lines(text, job)
    found: list[Step] = []
    name = ""
    for i, line in enumerate(lines):
        named = re.match(r"\s+- name:\s*(.*)$", line)
        if named:
            name = named.group(1).strip()
        elif re.match(r"\s+- ", line):
            name = ""
        run = re.match(r"(\s+)(?:- )?run:\s*(.*)$", line)
        if not run:
            continue
        indent, value = len(run.group(1)), run.group(2).strip()
        if value in ("|", ">"):
            body, _ = _block(lines, i, indent)
            margin = min(len(b) - len(b.lstrip()) for b in body if b.strip())
            body = [b[margin:] for b in body]
            command = "\n".join(body) if value == "|" else " ".join(b.strip() for b in body if b.strip())
        else:
            command = value
        found.append(Step(name, command))
    return found


def run_step(step: Step, cwd: Path, env: dict[str, str], timeout: float = 1800) -> subprocess.CompletedProcess:
    """``step`` run as a runner runs it: bash, ``-eo pipefail``, in ``cwd`` with ``env``."""
    return subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step.run],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def main(argv: list[str]) -> int:
    path, job = Path(argv[0]), argv[1]
    text = path.read_text(encoding="utf-8")
    for key, value in {**workflow_env(text), **job_env(text, job)}.items():
        print(f"export {key}={value!r}" if "'" not in value else f"export {key}={value}")
    for step in steps(text, job):
        print(f"# step: {step.name}")
        print(step.run)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
