#!/usr/bin/env bash
# Run the conformance suite against an implementation (default: canary) on the default
# device (cuda if available, else cpu with the Triton interpreter). Extra arguments go to
# pytest, e.g. --canary-impl mymodule --canary-device cuda:1 --canary-report report.json
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
cd "$root"
run_pytest conformance "$@"
