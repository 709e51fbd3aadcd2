"""Known findings: documented upstream behaviours that make a path run something other than it claims.

The one table of them, and the one lookup. A known finding changes only what a path is *expected* to run
(its kernel family or precision); it never switches off the path's numbers: the equivalence suite checks
every path for NaN/Inf and against the bound of the precision it actually ran in, whatever is documented
here (see :mod:`pytest_lstmperf.numerics.equivalence`).

Each finding carries the versions it was seen with. On those versions it *applies*; on others it is
*re-confirmed* (the mismatch is still a finding, reported as "re-confirmed on torch X (first seen on Y)"),
never assumed. A finding that is no longer observed is reported too ("not observed ...; remove it").

Paths defined outside this package (tests, users) may still document findings in
``ExecutionPath.options["known_findings"]`` as ``{(check, observed): why}``; those carry no versions and
apply on every version.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any


@dataclass(frozen=True)
class KnownFinding:
    """``path`` observed ``observed`` where it claims otherwise, for ``check``:

    - ``"kernel"``: ``observed`` is the kernel family that runs (``"cpu-native"``);
    - ``"precision"``: ``observed`` is the precision that runs (``"fp16"``).
    """

    path: str
    check: str
    observed: str
    why: str
    seen_with: dict[str, str] = field(default_factory=dict, hash=False)

    def version_note(self, versions: dict[str, str]) -> str:
        """'' on the versions it was seen with; else "re-confirmed on torch 2.13 (first seen on torch 2.11)"."""
        differing = [k for k, v in self.seen_with.items() if versions.get(k) and not _same(versions[k], v)]
        if not differing:
            return ""
        now = ", ".join(f"{k} {versions[k]}" for k in differing)
        then = ", ".join(f"{k} {self.seen_with[k]}" for k in differing)
        return f"re-confirmed on {now} (first seen on {then})"

    def describe(self, versions: dict[str, str]) -> str:
        note = self.version_note(versions)
        return f"{self.why} [{note}]" if note else self.why


def _same(current: str, seen: str) -> bool:
    """``"2.11.0+cu130"`` matches ``"2.11"``: a seen version matches the current one it prefixes."""
    current = current.split("+")[0]
    return current == seen or current.startswith(seen + ".")


_AUTOCAST_BF16 = (
    "torch.autocast(dtype=torch.bfloat16) runs the cuDNN RNN in float16, not bfloat16: PyTorch's autocast "
    "wrapper of aten::_cudnn_rnn casts to half whatever the autocast dtype (kernels elemWiseRNNcell<__half,...>); "
    "its numbers are checked against the fp16 bound"
)

#: the documented findings of the built-in paths
KNOWN_FINDINGS: tuple[KnownFinding, ...] = (
    KnownFinding("torch-cuda-autocast-bf16", "precision", "fp16", _AUTOCAST_BF16, {"torch": "2.11", "cudnn": "91900"}),
)


def _from_options(path: Any) -> list[KnownFinding]:
    raw = getattr(path, "options", {}).get("known_findings")
    if not isinstance(raw, dict):
        return []
    return [KnownFinding(path.name, check, observed, str(why)) for (check, observed), why in raw.items()]


def findings_for(path: Any) -> list[KnownFinding]:
    """Every known finding of ``path``: the table's, then those of its own options."""
    return [f for f in KNOWN_FINDINGS if f.path == path.name] + _from_options(path)


def lookup(path: Any, check: str, observed: str) -> KnownFinding | None:
    """The known finding that explains ``path`` observing ``observed`` for ``check``, else None."""
    return next((f for f in findings_for(path) if f.check == check and f.observed == observed), None)


@lru_cache(maxsize=4)
def current_versions(framework: str = "torch") -> dict[str, str]:
    """The versions a finding is keyed by, of the framework a path runs (imported lazily)."""
    versions: dict[str, str] = {}
    try:
        import torch

        versions["torch"] = torch.__version__
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        if cudnn:
            versions["cudnn"] = str(cudnn)
    except ImportError:
        pass
    if framework.startswith("keras"):
        try:
            import keras

            versions["keras"] = keras.__version__
        except ImportError:
            pass
    return versions


def explain_trace(path: Any, expected: tuple[str, str], trace: Any, same_precision) -> list[KnownFinding] | None:
    """The known findings that explain every difference between ``expected`` (family, precision) and the
    observed ``trace``: [] when there is none, None when one is not explained. ``same_precision(a, b)`` says
    whether observed precision ``b`` meets claimed ``a``."""
    family, precision = expected
    explained: list[KnownFinding] = []
    if trace.family != family:
        explained.append(lookup(path, "kernel", trace.family))  # type: ignore[arg-type]
    if not same_precision(precision, trace.precision):
        explained.append(lookup(path, "precision", trace.precision))  # type: ignore[arg-type]
    if any(f is None for f in explained):
        return None
    return explained
