"""``scripts/docs_figures.py``: every documented figure is drawn from a data file that exists, reads cleanly, and
the generated tables of docs/validation.md are up to date."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from plot_checks import figure_problems, titles

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("docs_figures", ROOT / "scripts" / "docs_figures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_figure_is_drawn_with_device_and_date(script, drawn: list, tmp_path: Path) -> None:
    for name, (source, _, device, date) in script.FIGURES.items():
        assert (ROOT / "docs" / "data" / source).is_file(), source
        assert (ROOT / "docs" / "img" / name).is_file(), name
        target = script.draw(name, tmp_path)
        assert target == tmp_path / name and target.stat().st_size > 0
        fig = drawn[-1]
        assert any(f"{device}, measured {date}" in title for title in titles(fig)), (name, titles(fig))
        assert figure_problems(fig) == [], name


def test_every_figure_is_used_by_the_docs(script) -> None:
    docs = "".join(p.read_text(encoding="utf-8") for p in (ROOT / "docs").glob("*.md"))
    for name in script.FIGURES:
        assert f"img/{name}" in docs, name


def test_validation_tables_are_up_to_date(script, capsys: pytest.CaptureFixture) -> None:
    assert script.main(["--check"]) == 0, capsys.readouterr().out
    table = script.run_time_table()
    entries = json.loads(script.RUN_TIMES.read_text(encoding="utf-8")) if script.RUN_TIMES.exists() else []
    for entry in entries:
        assert entry["device"] and entry["date"] and f"{entry['seconds']:.0f} s" in table


def test_time_records_a_command(script, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(script, "this_device", lambda: "cpu (test)")
    entry = script.time_command([sys.executable, "-c", "print('= 3 passed in 0.01s =')"])
    assert entry["device"] == "cpu (test)" and entry["result"] == "3 passed in 0.01s" and entry["seconds"] >= 0
    failed = script.time_command([sys.executable, "-c", "import sys; print('1 failed'); sys.exit(1)"])
    assert failed["result"] == "exit 1: 1 failed"


def test_main_times_a_command_into_the_table(script, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(script, "RUN_TIMES", tmp_path / "run-times.json")
    validation = tmp_path / "validation.md"
    validation.write_text(f"# v\n\n{script.START}\n{script.END}\n", encoding="utf-8")
    monkeypatch.setattr(script, "VALIDATION", validation)
    monkeypatch.setattr(script, "ROOT", tmp_path)
    monkeypatch.setattr(script, "this_device", lambda: "cpu (test)")
    command = [sys.executable, "-c", "print('= 2 passed in 0.1s =')"]
    assert script.main(["--note", "busy", "--time", "--", *command]) == 0
    (entry,) = json.loads((tmp_path / "run-times.json").read_text(encoding="utf-8"))
    assert entry["result"] == "2 passed in 0.1s" and entry["note"] == "busy" and entry["command"] == " ".join(command)
    assert "| cpu (test) |" in validation.read_text(encoding="utf-8") and script.main(["--check"]) == 0
    with pytest.raises(SystemExit):
        script.main(["--time"])
