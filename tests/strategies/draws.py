"""Helpers shared by the strategies' self-tests."""

from hypothesis import HealthCheck, given, settings


def collect(strategy, n, key=lambda x: x):
    """``key`` of ``n`` derandomized draws: distribution checks that do not depend on luck."""
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
