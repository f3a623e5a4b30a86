"""The KV-canary conformance suite: ``pytest conformance --canary-impl MODULE``.

The suite checks any module that provides SGLang's ``kv_canary`` names against the
numpy reference, property by property. See ``conformance/README.md``.
"""
