"""Loads the suite's pytest plugin (``conformance.plugin``) for runs of this folder only.

``pytest conformance ...`` and ``pytest conformance/test_x.py`` load this file before pytest
configures, so the plugin's options (``--canary-impl``,
``--canary-device``, ...), its Hypothesis profile and its ``impl``/``device`` fixtures exist
exactly when the suite runs. Other runs (``pytest tests``, ``pytest benchmarks``) never import an
implementation or load a profile. Runs that start elsewhere (``pytest --pyargs conformance``
from an installed copy, or an engine's own test file using the fixtures) load it by name:
``pytest -p conformance.plugin ...``.
"""

pytest_plugins = ["conformance.plugin"]
