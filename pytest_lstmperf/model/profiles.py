"""The hypothesis profiles that bound generated layer specs (hypothesis itself is imported only when a
profile's settings are asked for: the session header names the profile at start-up, in every run).

Each profile caps sizes so that no example can exhaust device memory (the largest ``nightly`` example
holds a few MB of activations) and sets how many examples each path gets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .spec import LayerSpec

if TYPE_CHECKING:
    from hypothesis import settings


@dataclass(frozen=True)
class ShapeBounds:
    max_input: int
    max_hidden: int
    max_layers: int
    max_batch: int
    max_seq: int
    max_elements: int  # cap on B * T * G*H * L * D, the gate activations of one pass

    def fits(self, spec: LayerSpec) -> bool:
        work = spec.batch * spec.seq_len * spec.gates * spec.hidden_size * spec.num_layers * spec.directions
        return work <= self.max_elements


@dataclass(frozen=True)
class Profile:
    name: str
    max_examples: int
    derandomize: bool
    bounds: ShapeBounds
    description: str

    def hypothesis_settings(self) -> settings:
        from hypothesis import HealthCheck, settings

        database = None
        if not self.derandomize:
            current = settings.default  # the loaded profile's settings (None only while hypothesis imports)
            database = None if current is None else current.database
        return settings(
            max_examples=self.max_examples,
            derandomize=self.derandomize,
            deadline=None,
            database=database,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
            print_blob=True,
        )


PROFILES: dict[str, Profile] = {
    "ci": Profile(
        "ci",
        6,
        True,
        ShapeBounds(24, 40, 2, 6, 16, 40_000),
        "quick and derandomized: the same 6 small shapes per path on every run",
    ),
    "gpu": Profile(
        "gpu",
        15,
        True,
        ShapeBounds(96, 256, 3, 32, 48, 3_000_000),
        "derandomized, 15 shapes per path up to hidden 256, T 48, batch 32",
    ),
    "nightly": Profile(
        "nightly",
        150,
        False,
        ShapeBounds(256, 512, 4, 64, 128, 40_000_000),
        "random (saved in hypothesis's database), 150 shapes per path up to hidden 512, T 128, batch 64",
    ),
}
