"""The Python checks that ``scripts/validate.sh`` runs on a GPU machine, one per name:

    python scripts/validate_checks.py env OUT.json          # versions, the GPUs, each CUDA path and why it cannot run
    python scripts/validate_checks.py meters OUT.json       # the device meters' two guarantees, each beside a control
    python scripts/validate_checks.py own-model OUT.json    # verify_model on the word-language model (LSTM, GRU)
    python scripts/validate_checks.py translation OUT.json  # verify_model on the translation tutorial's model
    python scripts/validate_checks.py cells OUT.json        # a cell-loop model: observed cuda-generic, report rows

Run from the repository root (the checkout on ``PYTHONPATH``, as ``scripts/gpu_env.sh`` sets it). Each check prints
what it found, writes it as JSON to ``OUT.json`` and exits 1 where what it checks does not hold.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _dump(out: str, data: Any) -> None:
    Path(out).write_text(json.dumps(data, indent=1, default=str) + "\n")


def check_env(out: str) -> int:
    """Versions of what the runs use, the GPUs, and each registered CUDA path with the reason it cannot run here."""
    import importlib.metadata as metadata
    import platform

    os.environ.setdefault("KERAS_BACKEND", "torch")
    facts: dict[str, Any] = {"python": platform.python_version(), "packages": {}}
    for name in ("torch", "triton", "jax", "jaxlib", "keras", "tensorflow", "onnx", "onnxruntime", "onnxruntime-gpu",
                 "pytest", "pytest-benchmark", "pytest-xdist", "numpy", "pytest-lstmperf"):  # fmt: skip
        try:
            facts["packages"][name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            facts["packages"][name] = None
    facts["plugin_entry_point"] = any(e.name == "lstmperf" for e in metadata.entry_points(group="pytest11"))
    facts["carried_wheels"] = sorted(p.name for p in (ROOT / ".whl").glob("*.whl"))
    import torch

    facts["cuda"] = torch.cuda.is_available()
    facts["torch_cuda"] = torch.version.cuda
    facts["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    facts["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    for module in ("keras", "jax"):
        try:
            imported = __import__(module)
            facts[f"{module}_import"] = getattr(imported, "__version__", "?")
            if module == "jax":
                facts["jax_backend"] = imported.default_backend()
        except Exception as exc:  # absent, or present but broken: either is worth a line
            facts[f"{module}_import"] = f"{type(exc).__name__}: {exc}"
    from pytest_lstmperf import paths
    from pytest_lstmperf.device import DeviceError, resolve_device

    try:
        device = resolve_device("cuda")
        facts["device"] = device.describe()
    except (DeviceError, Exception) as exc:
        facts["device"] = f"--device=cuda is refused here: {exc}"
        device = None
    rows = []
    for path in paths.for_device("cuda", sorted(paths.all_paths())):
        reason = "no usable GPU" if device is None else path.available(device)
        rows.append({"path": path.name, "framework": path.framework, "in_gate": path.in_gate,
                     "extended": path.extended, "unavailable": reason})  # fmt: skip
    facts["cuda_paths"] = rows
    _dump(out, facts)
    print(f"python {facts['python']}; " + ", ".join(f"{k} {v}" for k, v in facts["packages"].items() if v))
    print(f"device: {facts['device']}")
    print(f"keras: {facts['keras_import']}; jax: {facts['jax_import']} ({facts.get('jax_backend', '-')})")
    for row in rows:
        state = "available" if not row["unavailable"] else f"unavailable: {row['unavailable']}"
        print(f"  {row['path']:34} {row['framework']:14} {'gate' if row['in_gate'] else '    '}  {state}"[:220])
    return 0 if device is not None else 1


def check_meters(out: str) -> int:
    """1. a capture that fails leaves the default random generator usable (control: the generator's release off,
    where torch raises "Offset increment outside graph capture ..."); 2. graph replays are timed without the host's
    launch gaps: a graph of 60 small kernels timed quiet and beside a Python thread holding the GIL, with the spin
    (the meters' way) and without it (control)."""
    import torch

    from pytest_lstmperf import graph_replay, meters

    dev = torch.device("cuda")
    facts: dict[str, Any] = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}

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

    facts["capture_released"] = capture_then_dropout(release=True)
    facts["capture_not_released_control"] = capture_then_dropout(release=False)
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
        quiet, busy = median_us(spin, busy=False), median_us(spin, busy=True)
        facts["spin" if spin else "no_spin_control"] = {
            "quiet_us": round(quiet, 1),
            "gil_busy_us": round(busy, 1),
            "ratio": round(busy / quiet, 3),
        }
    facts["ok"] = (
        "dropout ran" in facts["capture_released"]
        and "raised" in facts["capture_not_released_control"]
        and abs(facts["spin"]["ratio"] - 1) < 0.05
    )
    _dump(out, facts)
    print(json.dumps(facts, indent=2))
    return 0 if facts["ok"] else 1


def check_own_model(out: str) -> int:
    """verify_model's per-path table for the word-language model (LSTM and GRU) on every CUDA path; a known finding
    (torch-cuda-autocast-bf16) must be reported as known, not failed."""
    import torch

    sys.path.insert(0, str(ROOT / "examples" / "word_language_model"))
    from wlm_model import RNNModel

    from pytest_lstmperf import verify_model

    rows = []
    for rnn_type in ("LSTM", "GRU"):
        torch.manual_seed(0)
        model = RNNModel(rnn_type, 1000, 64, 256, 2, dropout=0.2).cuda()
        tokens = torch.randint(0, 1000, (35, 16), device="cuda")
        start = time.perf_counter()
        outcomes = verify_model(model, (tokens, model.init_hidden(16)), device="cuda", raise_on_failure=False)
        for o in outcomes:
            kernels = sorted({f"{t.phase[:3]} {t.family}/{t.precision}" for t in o.traces})
            worst = max(o.errors.items(), key=lambda kv: kv[1]) if o.errors else ("-", float("nan"))
            rows.append({"model": rnn_type, "path": o.path, "ok": o.ok, "skipped": o.skipped, "kernels": kernels,
                         "worst": worst[0], "error": worst[1], "mismatches": [m.message for m in o.mismatches],
                         "known": o.known, "bounds": o.bounds, "unchecked": o.unchecked})  # fmt: skip
        print(f"{rnn_type}: {len(outcomes)} paths in {time.perf_counter() - start:.1f}s")
    _dump(out, rows)
    for r in rows:
        for m in r["mismatches"][:4]:
            print(f"  {r['model']} {r['path']}: {m[:220]}")
        for k in r["known"][:2]:
            print(f"  {r['model']} {r['path']} known: {k[:220]}")
    print(f"\n{'model':5} {'path':28} {'verdict':8} {'worst tensor':28} {'rel err':>9}  bounds; kernels")
    for r in rows:
        verdict = "skip" if r["skipped"] else ("ok" if r["ok"] else "FAIL") + ("+known" if r["known"] else "")
        print(f"{r['model']:5} {r['path']:28} {verdict:8} {r['worst'][:28]:28} {r['error']:9.2e}  "
              f"{'; '.join(r['bounds'].values())}; {'; '.join(r['kernels'])}")  # fmt: skip
    return 1 if any(not r["ok"] and not r["skipped"] for r in rows) else 0


def check_translation(out: str) -> int:
    """verify_model on the translation tutorial's model on CUDA: its decoder's first input is made on the
    module-level CUDA device, so the float64 reference runs where the model made its tensors."""
    import torch

    sys.path.insert(0, str(ROOT / "examples" / "seq2seq_translation"))
    from seq2seq_model import MAX_LENGTH, AttnDecoderRNN, EncoderRNN, Translator

    import pytest_lstmperf

    torch.manual_seed(0)
    model = Translator(EncoderRNN(30, 16), AttnDecoderRNN(16, 25)).to("cuda")
    g = torch.Generator().manual_seed(1)
    pair = (
        torch.randint(1, 30, (3, 6), generator=g).cuda(),
        torch.randint(1, 25, (3, MAX_LENGTH), generator=g).cuda(),
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outcomes = pytest_lstmperf.verify_model(model, pair, device="cuda", raise_on_failure=False)
    rows = [{"path": o.path, "ok": o.ok, "skipped": o.skipped, "mismatches": [str(m) for m in o.mismatches],
             "not_compared": o.not_compared, "known": o.known, "bounds": o.bounds,
             "max_error": max(o.errors.values()) if o.errors else None} for o in outcomes]  # fmt: skip
    _dump(out, {"outcomes": rows, "warnings": [str(w.message) for w in caught]})
    for r in rows:
        verdict = "ok" if r["ok"] else "NOT OK"
        print(r["path"], verdict, r["skipped"] or "", r["mismatches"][:2], "not compared:", len(r["not_compared"]))
    fine = all(r["ok"] or r["skipped"] or (not r["mismatches"] and r["not_compared"]) for r in rows)
    return 0 if fine else 1


def check_cells(out: str) -> int:
    """A model that loops LSTMCells: observed cuda-generic in both directions, every report row a fallback."""
    import torch

    import pytest_lstmperf
    from pytest_lstmperf import falls_back, report

    cells = torch.nn.ModuleList([torch.nn.LSTMCell(1, 51), torch.nn.LSTMCell(51, 51)]).cuda()

    def forward(x: torch.Tensor) -> torch.Tensor:
        h = c = h2 = c2 = torch.zeros(x.shape[0], 51, device=x.device)
        for x_t in x.split(1, dim=1):
            h, c = cells[0](x_t, (h, c))
            h2, c2 = cells[1](h, (h2, c2))
        return h2

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.cells = cells

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return forward(x)

    x = torch.randn(8, 20, device="cuda")
    with pytest_lstmperf.observe() as seen:
        forward(x).sum().backward()
    families = sorted({f"{t.phase} {t.family}/{t.precision}" for t in seen.all_traces()})
    print("observed:", families)
    rows = report(Model(), x, device="cuda")
    for row in rows:
        print(row.config, row.verdict.kernel, "falls back" if falls_back(row) else "eligible")
    ok = bool(families) and all("cuda-generic" in f for f in families) and all(falls_back(r) for r in rows)
    _dump(out, {"observed": families, "rows": [str(r) for r in rows], "ok": ok})
    return 0 if ok else 1


CHECKS: dict[str, Callable[[str], int]] = {
    "env": check_env,
    "meters": check_meters,
    "own-model": check_own_model,
    "translation": check_translation,
    "cells": check_cells,
}


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in CHECKS:
        print(f"usage: python scripts/validate_checks.py {{{','.join(CHECKS)}}} OUT.json", file=sys.stderr)
        return 2
    return CHECKS[argv[0]](argv[1])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
