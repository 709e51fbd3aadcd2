"""The run's speed verdict, in one place, beside the per-benchmark rule of :mod:`.policy`.

:func:`run_gate` decides every record of a run against the baseline (:func:`.policy.decide`) and adds the
entries the run did not measure (``not-run``, or ``path-lost`` where their path is unavailable now).
:func:`judge` turns that result, the gate's own errors and the run's settings into a :class:`Verdict`: whether
the session fails and the lines that say so. Nothing else decides: the terminal prints the verdict's lines, the
CI summary its rows, and the exit status is its ``failed``. pytest-benchmark's ``--benchmark-compare-fail`` (a
second rule on raw means) is refused where the gate compares (:func:`refuse_compare_fail`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .baseline_file import reference_of
from .policy import Check, Decision, GateResult, Reference, decide, pooled, upgrade_of

if TYPE_CHECKING:
    from .baseline_file import Baseline
    from .records import BenchRecord


def references_of(baseline: Baseline) -> dict[str, Reference]:
    """Every entry of ``baseline`` as a :class:`~.policy.Reference`, how far processes lie apart pooled over them."""
    return pooled({name: reference_of(entry) for name, entry in baseline.benchmarks.items()})


def run_gate(
    baseline: Baseline,
    records: Sequence[BenchRecord],
    threshold: float,
    versions: Mapping[str, str],
    unavailable: Mapping[str, str],
    more: Mapping[str, Sequence[BenchRecord]] | None = None,
) -> GateResult:
    """Every record against the baseline (:func:`.policy.decide`, with the figures of ``more`` processes where a
    compare timed them); baseline entries this run did not measure are not-run, or path-lost where their path is
    ``unavailable`` now (path name -> why); the upgrade, where the entries' versions differ from ``versions``."""
    entries = baseline.benchmarks
    references = references_of(baseline)
    more = more or {}
    decisions = [
        decide(
            record.measurement(),
            references.get(record.fullname),
            threshold,
            [r.measurement() for r in more.get(record.fullname, ())],
        )
        for record in records
    ]
    seen = {record.fullname for record in records}
    for name, entry in entries.items():
        if name in seen:
            continue
        path = entry.path
        if path is not None and path in unavailable:
            decisions.append(Decision(name, "path-lost", notes=(f"{path} is unavailable now: {unavailable[path]}",)))
        else:
            decisions.append(Decision(name, "not-run"))
    compared = [references[name] for name in seen if name in references]
    return GateResult(decisions, upgrade_of(compared, versions))


@dataclass(frozen=True)
class Verdict:
    """Whether the run fails on speed, and why, in the lines printed last.

    ``failed``: the session fails (a regression, a kernel or host-count change, a lost path, an inconclusive
    benchmark not accepted, nothing compared, or an error of the gate's own). ``coarse``: the compared checks that
    resolve less than the threshold here (printed; with ``failed`` false they passed, having seen nothing
    slower than what they resolve)."""

    failed: bool
    regressed: tuple[Decision, ...]
    unsettled: tuple[str, ...]
    accepted: bool
    coarse: tuple[tuple[str, Check], ...]
    threshold: float
    lines: tuple[str, ...]

    @property
    def passed(self) -> bool:
        return not self.failed


def judge(
    gate: GateResult | None,
    errors: Sequence[str],
    *,
    threshold: float,
    accept_inconclusive: bool,
    accept_where: str = "",
    update_command: str = "",
    rerun_command: str = "",
) -> Verdict:
    """The run's verdict: ``gate`` (None: nothing was compared, a recording run say) and the gate's own
    ``errors``; ``accept_inconclusive`` (and where it was set) lets an inconclusive run pass, saying so. The
    commands are those the lines name: the one that records the new numbers, and the one that reruns."""
    if gate is None:
        return Verdict(bool(errors), (), (), False, (), threshold, ())
    regressed = tuple(gate.failed)
    unsettled = tuple(gate.unsettled())
    coarse = tuple(gate.coarse(threshold))
    failed = bool(errors) or bool(regressed) or (bool(unsettled) and not accept_inconclusive)
    lines = []
    if regressed:
        kinds = sorted({d.verdict for d in regressed})
        lines.append(
            f"SPEED GATE FAILED: {len(regressed)} benchmark(s) {'/'.join(kinds)}. If the change is intended, "
            f"record the new numbers with: {update_command}"
        )
    if unsettled:  # one line for the run: "2 benchmark(s) inconclusive; nothing was compared with the baseline"
        problem = "; ".join(unsettled)
        if accept_inconclusive:
            lines.append(f"speed gate: {problem}, accepted ({accept_where})")
        else:
            # noise is what a quiet machine cures, unless the baseline's own processes and sittings blind every
            # inconclusive check (each check says so); a run in which nothing was timed (every benchmark skipped or
            # deselected, each with its reason) would fail the same way again there
            settled = [
                c.settled_by_baseline for d in gate.inconclusive for c in d.checks if c.verdict == "inconclusive"
            ]
            rerun = (
                "A rerun will not settle it against this baseline (each line says what would)"
                if settled and all(settled)
                else f"Rerun on a quiet machine: {rerun_command}"
                if gate.inconclusive
                else f"Rerun once the benchmarks listed above run here (each line says why it did not): {rerun_command}"
            )
            lines.append(
                f"SPEED GATE NOT PASSED: {problem} (listed above: each says why); this is not a pass. {rerun}; or "
                "accept it with --lstmperf-accept-inconclusive (env PYTEST_LSTMPERF_ACCEPT_INCONCLUSIVE=1)"
            )
    if not failed:
        listed = f" ({len(coarse)} check(s) resolving less than the threshold, listed above)" if coarse else ""
        upgrade = f", across an {gate.upgrade.headline(gate.decisions)}" if gate.upgrade is not None else ""
        lines.append(f"speed gate passed: {gate.compared} benchmark(s) compared, none slower{listed}{upgrade}")
    return Verdict(failed, regressed, unsettled, accept_inconclusive, coarse, threshold, tuple(lines))


def refuse_compare_fail(compare_fail: object, threshold: float) -> str | None:
    """Why pytest-benchmark's ``--benchmark-compare-fail`` cannot run beside the gate (None where it was not
    given): it fails on raw means against one recorded figure, a second rule on the same baseline, blind to the
    spread between processes that the gate measures."""
    if not compare_fail:
        return None
    checks = compare_fail if isinstance(compare_fail, (list, tuple)) else [compare_fail]
    given = ",".join(_compare_fail_text(c) for c in checks)
    return (
        f"--benchmark-compare-fail={given}: pytest-benchmark's rule on raw means cannot judge a pytest-lstmperf "
        "baseline: it would fail or pass on noise the speed gate measures (how far recording processes lie apart) "
        f"and allows for. The speed gate decides against this baseline (its threshold {threshold:.2f}: "
        "--lstmperf-threshold or the lstmperf_threshold marker). Drop --benchmark-compare-fail, or compare "
        "against a pytest-benchmark run of your own (--benchmark-compare=NNNN)"
    )


def _compare_fail_text(check: object) -> str:
    """One parsed ``--benchmark-compare-fail`` check as the user wrote it (``median:5%``, ``mean:0.001``)."""
    field, threshold = getattr(check, "field", None), getattr(check, "threshold", None)
    if field is None or threshold is None:
        return str(check)
    percent = type(check).__name__.startswith("Percentage")
    return f"{field}:{threshold:g}%" if percent else f"{field}:{threshold:g}"
