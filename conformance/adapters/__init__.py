"""Adapters that put third-party KV canaries behind the names the suite imports.

Each module here is a ``--canary-impl`` target: ``conformance.adapters.sglang`` runs
SGLang's own ``kv_canary`` code under the suite.
"""
