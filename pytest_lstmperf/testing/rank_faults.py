"""A fault planted in the rank processes of :mod:`pytest_lstmperf.workloads.distributed` only, so that a
distributed run disagrees with the single-process reference: the scaling suite's equivalence check must fail.

Set the variables :func:`rank_fault_env` returns (in the launcher's environment; the ranks inherit it)::

    for name, value in rank_fault_env("perturb:1e-3").items():
        monkeypatch.setenv(name, value)

``PYTEST_LSTMPERF_RANK_SETUP`` makes each rank call :func:`plant_from_env` before it joins the process group;
that plants the faults of ``PYTEST_LSTMPERF_WORKER_PLANT`` (the syntax of :mod:`.faults`), and the rank undoes
them when it is done. The launcher and the ranks import nothing from this package by themselves.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ..workloads.distributed import RANK_SETUP_ENV
from .faults import parse_faults, plant

#: the faults planted in every rank (``perturb:1e-3``; comma-separated to combine)
WORKER_PLANT_ENV = "PYTEST_LSTMPERF_WORKER_PLANT"


def rank_fault_env(spec: str) -> dict[str, str]:
    """The environment that plants ``spec`` in every rank of the next launches."""
    return {RANK_SETUP_ENV: f"{__name__}:plant_from_env", WORKER_PLANT_ENV: spec}


def plant_from_env() -> Callable[[], None] | None:
    """In a rank: plant the faults :data:`WORKER_PLANT_ENV` names; their undo (None where it is unset)."""
    raw = os.environ.get(WORKER_PLANT_ENV)
    if not raw:
        return None
    return plant(parse_faults(raw))
