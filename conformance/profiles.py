"""Hypothesis profiles of the suite, and how example counts scale per property.

- ``dev``: random, with the example database, for local runs;
- ``ci``: derandomized, no deadline, no database, ``print_blob`` (chosen when ``CI`` is set);
- ``nightly``: thousands of examples, random.

On the CPU (the Triton interpreter runs one program after another in numpy) every
profile runs half of its examples; a test asks for a share of the profile's count
with :func:`examples`, so the profile, not the test, decides how long a run takes.
"""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, settings

CPU_SCALE = 0.5

_COMMON = dict(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

settings.register_profile("dev", max_examples=100, deadline=None, **_COMMON)
settings.register_profile(
    "ci",
    max_examples=200,
    # no explain phase: on the interpreter it can take minutes per failure, and the failing
    # example with its labelled draws already tells the story
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
    derandomize=True,
    deadline=None,
    database=None,
    print_blob=True,
    **_COMMON,
)
settings.register_profile("nightly", max_examples=2000, deadline=None, **_COMMON)

OWN_PROFILES = ("dev", "ci", "nightly")


def select(name: str, *, on_cpu: bool) -> str:
    """Load profile ``name``, scaled down when the device is the CPU; returns what was loaded."""
    if on_cpu and name in OWN_PROFILES:
        parent = settings.get_profile(name)
        scaled = f"{name}-cpu"
        settings.register_profile(
            scaled, parent=parent, max_examples=max(1, int(parent.max_examples * CPU_SCALE))
        )
        name = scaled
    settings.load_profile(name)
    return name


def examples(share: float = 1.0) -> settings:
    """A ``@settings`` decorator running ``share`` of the loaded profile's examples (at least 2)."""
    return settings(max_examples=max(2, round(settings.default.max_examples * share)))


# Set by the plugin once the device is known: data sizes shrink with the example counts.
ON_CPU = True


def layout_sizes() -> dict:
    """Size caps for :func:`strategies.source_layouts` on this run's device."""
    if ON_CPU:
        return dict(max_rows=4, max_page_size=8, max_bytes_per_token=128)
    return dict(max_rows=16, max_page_size=32, max_bytes_per_token=512)


def max_slots() -> int:
    """Longest slot list a property draws on this run's device."""
    return 24 if ON_CPU else 256
