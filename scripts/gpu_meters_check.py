"""The device meters' two guarantees, checked on a CUDA machine, each beside a control that shows the check can
fail (prints one JSON object; exit 1 where a guarantee does not hold):

1. a capture that fails leaves the default random generator usable: a call that runs a dropout and then
   synchronises (``.item()``) cannot be captured; afterwards a dropout must run. Control: the same with the
   generator's release switched off, where torch raises "Offset increment outside graph capture ...";
2. graph replays are timed without the host's launch gaps: a graph of 60 small kernels is timed quiet and with
   a Python thread holding the GIL beside it, with the spin (the meters' way) and without (control).

Usage: python scripts/gpu_meters_check.py
"""

from __future__ import annotations

import json
import statistics
import sys
import threading

import torch

from pytest_lstmperf import graph_replay, meters

dev = torch.device("cuda")
out: dict[str, object] = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}


def capture_then_dropout(release: bool) -> str:
    x = torch.ones(64, 64, device=dev)

    def call() -> None:
        y = torch.nn.functional.dropout(x, 0.5, True)
        y.sum().item()  # a synchronisation: the capture fails

    saved = graph_replay.release_generator
    generator = torch.cuda.default_generators[torch.cuda.current_device()]
    state = generator.get_state()
    if not release:
        graph_replay.release_generator = lambda *args: None  # type: ignore[assignment]
    try:
        timed = meters.device_time(call, "cuda", samples=3)
        try:
            torch.nn.functional.dropout(x, 0.5, True).sum().item()
            after = "dropout ran"
        except RuntimeError as exc:
            after = f"dropout raised: {str(exc).splitlines()[0]}"
        return f"{timed.method}; {after}"
    finally:
        graph_replay.release_generator = saved
        if not release:  # repair what the control broke
            saved(torch, dev, generator, state)


out["capture_released"] = capture_then_dropout(release=True)
out["capture_not_released_control"] = capture_then_dropout(release=False)

small = torch.randn(32, 32, device=dev)


def sixty_kernels() -> None:
    h = small
    for _ in range(30):
        h = torch.tanh(h * 0.5)


def median_us(spin: bool, busy: bool) -> float:
    key = str(dev)
    rate = graph_replay._spin_rate(torch, dev)
    graph_replay._SPIN_RATE[key] = rate if spin else 0.0
    stop = threading.Event()

    def hog() -> None:
        n = 0
        while not stop.is_set():
            n += 1

    thread = threading.Thread(target=hog, daemon=True)
    if busy:
        thread.start()
    try:
        timed = meters.device_time(sixty_kernels, "cuda", samples=15)
    finally:
        stop.set()
        if busy:
            thread.join()
        graph_replay._SPIN_RATE[key] = rate
    return statistics.median(timed.samples) * 1e6


sys.setswitchinterval(0.0005)  # the hog thread takes the GIL often
for spin in (True, False):
    quiet = median_us(spin, busy=False)
    busy = median_us(spin, busy=True)
    out["spin" if spin else "no_spin_control"] = {
        "quiet_us": round(quiet, 1),
        "gil_busy_us": round(busy, 1),
        "ratio": round(busy / quiet, 3),
    }

ok = (
    "dropout ran" in str(out["capture_released"])
    and "raised" in str(out["capture_not_released_control"])
    and abs(out["spin"]["ratio"] - 1) < 0.05  # type: ignore[index]
)
out["ok"] = ok
print(json.dumps(out, indent=2))
sys.exit(0 if ok else 1)
