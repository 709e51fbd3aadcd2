"""Long CLI commands say how long they have left: the estimate (:class:`pytest_lstmperf.progress.Remaining`) on a
planted clock, and the progress lines of ``lstmperf crossover`` and ``lstmperf report --run`` on stderr."""

from __future__ import annotations

import re

import pytest

from pytest_lstmperf.progress import Remaining, format_duration

#: what format_duration prints
DURATION = r"(?:\d+ s|\d+ min \d\d s|\d+ h \d\d min)"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_durations_read_plainly() -> None:
    assert [format_duration(s) for s in (0.4, 42, 185, 3720)] == ["0 s", "42 s", "3 min 05 s", "1 h 02 min"]


def test_the_estimate_fits_the_finished_steps_against_their_size() -> None:
    clock = Clock()
    left = Remaining([1, 2, 4, 8], clock=clock)
    assert left.estimate() is None and left.line() == "time left: known after the first step"
    clock.now += 3.0  # batch 1: 3 s
    left.finished()
    # one size seen: every larger step left is assumed to take as long, a lower bound
    assert left.estimate() == (9.0, True) and left.line() == "at least 9 s left"
    clock.now += 5.0  # batch 2: 5 s -> 1 s + 2 s per batch unit
    left.finished()
    assert left.estimate() == pytest.approx((9.0 + 17.0, False)) and left.line() == "about 26 s left"
    left.start()  # time between steps is not counted
    clock.now += 1000.0
    left.start()
    clock.now += 9.0
    left.finished()
    seconds, bound = left.estimate()  # type: ignore[misc]
    assert not bound and 15 < seconds < 20
    clock.now += 17.0
    left.finished()
    assert left.estimate() == (0.0, False)


def test_the_estimate_never_goes_negative_or_falls_with_size() -> None:
    clock = Clock()
    left = Remaining([1, 2, 64], clock=clock)
    for seconds in (4.0, 2.0):  # noisy: the larger step measured faster
        clock.now += seconds
        left.finished()
    assert left.estimate() == (3.0, False)  # the mean, not a negative slope
    left = Remaining([10, 20, 40], clock=clock)
    for seconds in (1.0, 4.0):  # steeper than proportional: the fit's intercept would be negative
        clock.now += seconds
        left.finished()
    seconds, _ = left.estimate()  # type: ignore[misc]
    assert seconds > 0


def test_crossover_prints_the_time_left_as_each_batch_starts(tmp_path, capsys: pytest.CaptureFixture) -> None:
    from pytest_lstmperf import cli

    argv = ["crossover", "lstm", "input_size=4", "hidden_size=8", "seq_len=3", "--device=cpu", "--batches=1,2,4",
            "--repeats=1", "--paths=torch-cpu-native,torch-cpu-onednn", f"--out={tmp_path / 'cx'}"]  # fmt: skip
    assert cli.main(argv) == 0, capsys.readouterr().err
    captured = capsys.readouterr()
    progress = [line for line in captured.err.splitlines() if line.startswith("batch ")]
    assert progress[0] == "batch 1 (1/3): preparing and timing 2 paths, 1 call each"
    assert re.fullmatch(rf"batch 2 \(2/3\): .* \({DURATION} so far, at least {DURATION} left\)", progress[1]), progress
    assert re.fullmatch(rf"batch 4 \(3/3\): .* \({DURATION} so far, about {DURATION} left\)", progress[2]), progress
    assert "left" not in captured.out  # the progress goes to stderr, the results to stdout


def test_report_run_prints_each_layer_with_the_time_left(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_lstmperf.device import resolve_device
    from pytest_lstmperf.model.spec import LayerSpec
    from pytest_lstmperf.observation import eligibility
    from pytest_lstmperf.observation.model_configs import CELL_FRAMEWORK

    monkeypatch.setattr(eligibility, "measure_cell_loop", lambda spec, device: ("cpu-native/fp32", 2.0, (2e-3, 1e-3)))
    specs = [LayerSpec(cell="gru", input_size=8, hidden_size=h, batch=4, seq_len=10) for h in (16, 32, 64)]
    lines: list[str] = []
    rows = eligibility.build_report([(CELL_FRAMEWORK, s, None) for s in specs], resolve_device("cpu", "--device"),
                                    run=True, prepare=lambda *a: None, progress=lines.append)  # fmt: skip
    assert [r.slowdown for r in rows] == ["2.0x"] * 3
    assert lines[0] == "layer 1/3 torch-cell gru-I8-H16-L1-B4-T10: running (time left: known after the first step)"
    assert re.fullmatch(rf"layer 2/3 torch-cell gru-I8-H32-L1-B4-T10: running \(about {DURATION} left\)", lines[1])
    assert len(lines) == 3
    quiet: list[str] = []
    eligibility.build_report([(CELL_FRAMEWORK, specs[0], None)], "cpu", run=False, progress=quiet.append)
    assert quiet == []  # without --run nothing runs: no progress lines
