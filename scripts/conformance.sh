#!/usr/bin/env bash
# Run the conformance suite against an implementation (default: canary) on the default
# device (cuda if available, else cpu with the Triton interpreter), from the current folder.
# It is the suite's own command, `python -m conformance` (kv-canary-conformance), in the
# project's environment: the same options, selections, summary and exit statuses (--help).
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
# the command's messages name it as it was run (a usage error: "bash scripts/conformance.sh: ...")
KV_CANARY_PROG="bash $(printf '%q' "${BASH_SOURCE[0]}")" exec "$py" -m conformance "$@"
