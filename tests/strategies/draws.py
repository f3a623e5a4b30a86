"""Helpers shared by the strategies' self-tests."""

from hypothesis import HealthCheck, given, settings

from conformance import profiles


def collect(strategy, n, key=lambda x: x):
    """``key`` of ``n`` derandomized draws: distribution checks that do not depend on luck.
    Drawn as the suite draws, without constants harvested from local source
    (``conformance.profiles.without_local_constants``)."""
    profiles.without_local_constants()
    seen = []

    @settings(
        max_examples=n,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def run(value):
        seen.append(key(value))

    run()
    return seen
