"""Loads the suite's pytest plugin (``conformance.plugin``) for runs of this folder only.

``pytest conformance ...`` and ``pytest conformance/test_x.py`` load this file before pytest
configures, so the plugin's options (``--canary-impl``,
``--canary-device``, ...), its Hypothesis profile and its ``impl``/``device`` fixtures exist
exactly when the suite runs. Other runs (``pytest tests``, ``pytest benchmarks``) never import an
implementation or load a profile. Runs that start elsewhere (``pytest --pyargs conformance``
from an installed copy, or an engine's own test file using the fixtures) load it by name:
``pytest -p conformance.plugin ...``.

A Python without Hypothesis cannot import the plugin: this file then stands in for it
(``conformance.prerequisites``), and the run stops with one line naming what is missing and
the command that sets the project's environment up, as the plugin does for torch and numpy.
"""

try:
    import hypothesis  # noqa: F401  (the one dependency the plugin cannot be imported without)
except ImportError as error:
    from conformance.prerequisites import stand_in

    pytest_addoption, pytest_cmdline_main = stand_in(error)
else:
    pytest_plugins = ["conformance.plugin"]
