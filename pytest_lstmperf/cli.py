"""The ``lstmperf`` command: one argparse subcommand per function below (``explain``, ``report``, ...).

Add a subcommand by writing ``add_<name>_command(subparsers)`` that registers its parser with
``set_defaults(func=...)``, and appending it to :data:`COMMANDS`. User mistakes print one line on stderr and
exit with status 2, never a traceback.

    lstmperf explain lstm units=128 activation=relu --framework keras-torch --device cuda [--run] [--json]
    lstmperf report configs.json [--device cuda] [--run] [--json OUT]
    lstmperf crossover lstm input_size=64 hidden_size=256 num_layers=2 seq_len=100 [--batches 1,2,4] [--out DIR]
    lstmperf crossover lstm input_size=32 hidden_size=64 seq_len=20 --device=cpu   # CPU paths only, no GPU
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

EXIT_USAGE = 2


class CommandError(Exception):
    """A user mistake found while running a command (printed as one line, exit status 2)."""


def _parse_value(raw: str) -> Any:
    lowered = raw.strip()
    if lowered.lower() in ("true", "false"):
        return lowered.lower() == "true"
    try:
        return ast.literal_eval(lowered)
    except (ValueError, SyntaxError):
        return lowered


def parse_layer(cell: str, items: Sequence[str], framework: str) -> tuple[str, Any, Any]:
    """``lstm units=128 activation=relu`` -> ``(framework, LayerSpec, KerasOptions | None)``."""
    from .observation.model_configs import config_from_dict

    data: dict[str, Any] = {"framework": framework, "cell": cell.lower()}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CommandError(f"layer option {item!r} is not key=value (e.g. units=128 activation=relu)")
        data[key.strip()] = _parse_value(value)
    return config_from_dict(data)


# ------------------------------------------------------------------------------------------- explain
def add_explain_command(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "explain",
        help="predict which kernel a layer runs and why it is not cuDNN",
        description="Predict the kernel family and precision of an LSTM/GRU layer, with every reason it is not "
        "cuDNN, the change that would make it eligible, and its cost.",
    )
    parser.add_argument("cell", choices=["lstm", "gru"], type=str.lower, help="the layer type")
    parser.add_argument(
        "layer", nargs="*", metavar="KEY=VALUE",
        help="LayerSpec fields (units/hidden_size, input_size, num_layers, bidirectional, use_bias, reset_after, "
        "batch, seq_len, length_mode, lengths, dtype) and Keras options (activation, recurrent_activation, "
        "recurrent_dropout, unroll, use_cudnn, implementation, go_backwards, mask)",
    )  # fmt: skip
    parser.add_argument(
        "--framework",
        "-f",
        default="keras-tensorflow",
        help="keras-tensorflow (default), keras-torch, keras-jax, torch, torch-compile or onnxruntime",
    )
    parser.add_argument("--device", "-d", default="cpu", help="cpu (default), cuda, cuda:N")
    parser.add_argument("--run", action="store_true", help="also run the layer here and show the observed kernel")
    parser.add_argument("--json", action="store_true", help="print the verdict as JSON")
    parser.set_defaults(func=cmd_explain)


def _device(value: str, run: bool) -> Any:
    if not run:
        return value
    from .device import DeviceError, resolve_device

    try:
        return resolve_device(value, "--device")
    except DeviceError as exc:
        raise CommandError(str(exc)) from None


def cmd_explain(args: argparse.Namespace) -> int:
    from .paths.config_runs import build_report

    framework, spec, options = parse_layer(args.cell, args.layer, args.framework)
    device = _device(args.device, args.run)
    row = build_report([(framework, spec, options)], device, run=args.run)[0]
    if args.json:
        print(json.dumps({**row.verdict.to_dict(), **row.to_dict()}, indent=2, default=str))
        return 0
    print(row.verdict.describe())
    if args.run:
        if row.error:
            print(f"observed: could not run: {row.error}")
            return 1
        match = row.observed.split("/")[0] == row.verdict.kernel if row.observed else False
        print(f"observed: {row.observed} ({'matches' if match else 'DIFFERS FROM'} the prediction)")
        return 0 if match else 1
    return 0


# ------------------------------------------------------------------------------------------- report
def add_report_command(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "report",
        help="eligibility table for a list of layer configs or a model",
        description="config -> predicted kernel, observed kernel (with --run), reasons, estimated slowdown.",
    )
    parser.add_argument(
        "source",
        help="a JSON file (list of layer dicts with 'framework') or module:attribute "
        "(a list of such dicts, a torch.nn.Module or a Keras model, or a callable returning one)",
    )
    parser.add_argument("--device", "-d", default="cpu", help="cpu (default), cuda, cuda:N")
    parser.add_argument("--run", action="store_true", help="run each config and measure its slowdown here")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON to FILE")
    parser.add_argument(
        "--batch",
        type=int,
        default=4,
        help="batch size of a torch model's layers (Keras models: their own input shape)",
    )
    parser.add_argument("--seq-len", type=int, default=10, help="sequence length of a torch model's layers")
    parser.add_argument(
        "--fail-on-fallback",
        action="store_true",
        help="exit 1 when a layer leaves the device's fast kernel (GPU: cuDNN; CPU: oneDNN for a PyTorch LSTM)",
    )
    parser.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from .observation.eligibility import build_report, falls_back, render_table
    from .observation.model_configs import load_configs
    from .paths.config_runs import run_config

    if args.batch < 1 or args.seq_len < 1:
        raise CommandError(f"--batch {args.batch} / --seq-len {args.seq_len}: both must be >= 1")
    configs = load_configs(args.source, batch=args.batch, seq_len=args.seq_len)
    if not configs:
        raise CommandError(f"{args.source}: no LSTM/GRU layer configs found")

    def progress(line: str) -> None:
        print(f"lstmperf report: {line}", file=sys.stderr, flush=True)

    device = _device(args.device, args.run)
    rows = build_report(configs, device, run=args.run, prepare=run_config if args.run else None, progress=progress)
    print(render_table(rows))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump([r.to_dict() for r in rows], handle, indent=2, default=str)
    fallen = [row.config for row in rows if falls_back(row)]
    if args.fail_on_fallback and fallen:
        print(f"lstmperf report: {len(fallen)} of {len(rows)} layers fall back: {'; '.join(fallen)}")
        return 1
    return 0


# ------------------------------------------------------------------------------------------- paths
def add_paths_command(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "paths",
        help="list the execution paths and what each claims",
        description="Every registered execution path: device, claimed kernel family and precision, and (with "
        "--device) whether it can run here and why not.",
    )
    parser.add_argument("--device", "-d", default=None, help="also check availability on cpu, cuda or cuda:N")
    parser.add_argument("--gate", action="store_true", help="only the paths of the quick merge gate")
    parser.set_defaults(func=cmd_paths)


def cmd_paths(args: argparse.Namespace) -> int:
    from . import paths as registry

    device = None
    if args.device:
        from .device import DeviceError, resolve_device

        try:
            device = resolve_device(args.device, "--device")
        except DeviceError as exc:
            raise CommandError(str(exc)) from None
    rows = [("path", "device", "kernel", "precision", "gate", "default", "status", "description")]
    for path in sorted(registry.all_paths().values(), key=lambda p: (p.device, p.framework, p.name)):
        if args.gate and not path.in_gate:
            continue
        status = "-"
        if device is not None:
            status = (path.available(device) or "available") if path.device == device.kind else "other device"
        rows.append(
            (
                path.name,
                path.device,
                path.kernel,
                path.precision,
                "yes" if path.in_gate else "no",
                "no" if path.extended else "yes",
                status,
                path.description,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1])
    return 0


# ------------------------------------------------------------------------------------------- crossover
#: default paths per --device kind; the first is the reference the others are compared with
CROSSOVER_PATHS = {
    "cuda": ("torch-cpu-onednn", "torch-cudnn-default", "torch-cuda-generic"),
    "cpu": ("torch-cpu-native", "torch-cpu-onednn", "torch-cpu-autocast-bf16", "torch-cpu-native-autocast-bf16"),
}


def _batches(raw: str) -> list[int]:
    try:
        values = sorted({int(v) for v in raw.split(",") if v.strip()})
    except ValueError:
        raise CommandError(f"--batches={raw}: expected comma-separated positive integers, e.g. 1,2,4,8") from None
    if not values or values[0] < 1:
        raise CommandError(f"--batches={raw}: expected comma-separated positive integers, e.g. 1,2,4,8")
    return values


def add_crossover_command(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "crossover",
        help="sweep batch size and find from which batch each path beats a reference path (CPU vs GPU, or the "
        "CPU paths with --device=cpu)",
        description="Forward time per call of one layer at each batch size on each path; prints the batch size "
        "from which each path beats the first (the reference), and writes crossover.png, crossover.csv and "
        "crossover.json into --out. With a GPU (--device=cuda, the default): the CPU (oneDNN) against cuDNN and "
        "the generic CUDA kernel. On a CPU-only machine, --device=cpu: the native CPU kernel against oneDNN, in "
        "fp32 and bf16.",
    )
    parser.add_argument("cell", choices=["lstm", "gru"], type=str.lower, help="the layer type")
    parser.add_argument(
        "layer", nargs="*", metavar="KEY=VALUE",
        help="LayerSpec fields, e.g. input_size=64 hidden_size=256 num_layers=2 seq_len=100",
    )  # fmt: skip
    parser.add_argument("--batches", default="1,2,4,8,16,32,64,128,256,512,1024", help="batch sizes to sweep")
    parser.add_argument(
        "--device", "-d", default="cuda",
        help="cuda (default) or cuda:N: the CPU against that GPU; cpu: the CPU paths only (needs no GPU)",
    )  # fmt: skip
    parser.add_argument(
        "--paths",
        help="comma-separated paths to sweep, the first being the reference (default: "
        + "; ".join(f"{kind}: {','.join(names)}" for kind, names in CROSSOVER_PATHS.items())
        + ")",
    )
    parser.add_argument("--repeats", type=int, default=7, help="timed calls per point (median; default 7)")
    parser.add_argument("--out", default="crossover", help="folder for the plot and the numbers (default crossover)")
    parser.set_defaults(func=cmd_crossover)


def _crossover_devices(value: str) -> dict[str, Any]:
    """{"cpu": ..., kind: ...} for ``--device``; one message, with an action that works, when it cannot be."""
    from .device import DeviceError, resolve_device

    if value != "cpu" and not value.startswith("cuda"):
        raise CommandError(f"--device={value}: not a device for the crossover (valid: cuda, cuda:N, cpu)")
    devices = {"cpu": resolve_device("cpu", "--device")}
    if value == "cpu":
        return devices
    try:
        devices["cuda"] = resolve_device(value, "--device")
    except DeviceError as exc:
        raise CommandError(
            f"{str(exc).rstrip('.')}. The CPU/GPU crossover needs a GPU; --device=cpu sweeps the CPU paths "
            "instead (oneDNN vs native, fp32 vs bf16)"
        ) from None
    return devices


def _crossover_paths(raw: str | None, kind: str) -> list[str]:
    from . import paths as registry

    names = [n.strip() for n in (raw or ",".join(CROSSOVER_PATHS[kind])).split(",") if n.strip()]
    known = registry.all_paths()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise CommandError(f"--paths: unknown {', '.join(unknown)} (valid: {', '.join(sorted(known))})")
    elsewhere = [n for n in names if known[n].device not in ("cpu", kind)]
    if elsewhere:
        raise CommandError(f"--paths: {', '.join(elsewhere)} do not run with --device={kind} (they need a GPU)")
    if len(names) < 2:
        raise CommandError(f"--paths={raw}: need at least two paths (the first is the reference)")
    return names


def cmd_crossover(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .workloads.crossover import crossover_sweep, crossovers, plot_sweep, sweep_label

    _, spec, _ = parse_layer(args.cell, args.layer, "torch")
    batches = _batches(args.batches)
    if args.repeats < 1:
        raise CommandError(f"--repeats={args.repeats}: must be >= 1")
    devices = _crossover_devices(args.device)
    kind = "cuda" if "cuda" in devices else "cpu"
    names = _crossover_paths(args.paths, kind)
    where = devices[kind].describe()
    print(f"crossover of {sweep_label(spec)} on {where}: {len(names)} paths x {len(batches)} batch sizes", flush=True)
    points = crossover_sweep(
        spec, batches, names, devices, args.repeats,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )  # fmt: skip
    marks = crossovers(points, names[0], names[1:])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    _write_sweep(out, points, {"spec": spec.to_dict(), "device": where, "cpu": devices["cpu"].describe(),
                               "reference": names[0], "crossover": marks})  # fmt: skip
    title = f"{sweep_label(spec)}, forward, against {names[0]}\n{where}"
    plot = plot_sweep(points, out / "crossover.png", title, marks)
    for name, batch in marks.items():
        verdict = f"wins from batch {batch}" if batch is not None else "never wins for good in this sweep"
        print(f"{name}: {verdict} (against {names[0]})")
    failed = [p for p in points if p.seconds is None]
    if failed:
        print(f"{len(failed)} of {len(points)} points not measured; see crossover.csv (note column)")
    print(f"wrote {plot}, {out / 'crossover.csv'}, {out / 'crossover.json'}")
    return 0


def _write_sweep(out: Any, points: list[Any], about: dict[str, Any]) -> None:
    import csv

    with open(out / "crossover.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["path", "batch", "seconds", "kernel", "note"])
        for p in points:
            writer.writerow([p.path, p.batch, "" if p.seconds is None else f"{p.seconds:.6e}", p.kernel, p.note])
    with open(out / "crossover.json", "w", encoding="utf-8") as handle:
        json.dump({**about, "points": [p.__dict__ for p in points]}, handle, indent=2)


# ------------------------------------------------------------------------------------------- entry point
COMMANDS: list[Callable[[Any], None]] = [
    add_explain_command,
    add_report_command,
    add_paths_command,
    add_crossover_command,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lstmperf", description="pytest-lstmperf tools for LSTM/GRU layers")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in COMMANDS:
        add(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from .model.keras_options import KerasOptionsError
    from .model.spec import SpecError
    from .observation.explain import ExplainError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (CommandError, ExplainError, KerasOptionsError, SpecError, ValueError) as exc:
        print(f"lstmperf {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:
        name = type(exc).__name__
        print(f"lstmperf {args.command}: {name}: {str(exc).splitlines()[0] if str(exc) else name}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
