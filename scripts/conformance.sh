#!/usr/bin/env bash
# Run the conformance suite against an implementation (default: canary) on the default
# device (cuda if available, else cpu with the Triton interpreter), from the current folder.
# It is the suite's own command, `python -m conformance` (kv-canary-conformance), in the
# project's environment: the same options, selections, summary and exit statuses (--help).
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
exec "$py" -m conformance "$@"
