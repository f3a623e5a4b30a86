#!/usr/bin/env bash
# Mutation testing with cosmic-ray: one session per module, each with its own config
# (mutation/<name>.toml) and session database (mutation/<name>.sqlite, an output, gitignored).
#
#   bash mutation/run.sh                     every session
#   bash mutation/run.sh canary_source ...   the named sessions
#
# A session is resumable: its database keeps every result, and a second run executes only the
# mutants still pending. Delete the database to start that session over. Stop a run with
# Ctrl-C (SIGINT), never SIGKILL: cosmic-ray mutates the module file in place and restores it
# when a mutant's test run ends; after a hard kill, `git diff` shows the mutant left behind.
# Run it in a clone or worktree of its own, not in a tree someone is editing.
set -euo pipefail
cd "$(dirname "$0")/.."

names=("$@")
if [ ${#names[@]} -eq 0 ]; then
    for config in mutation/*.toml; do names+=("$(basename "$config" .toml)"); done
fi
for name in "${names[@]}"; do
    config="mutation/$name.toml"
    session="mutation/$name.sqlite"
    [ -f "$config" ] || { echo "no config $config" >&2; exit 2; }
    if [ ! -f "$session" ]; then
        cosmic-ray init "$config" "$session"
        # the unmutated module must pass its test selection, or every mutant would look killed
        cosmic-ray baseline "$config"
    fi
    start=$(date +%s)
    cosmic-ray exec "$config" "$session"
    echo "== $name: $(( $(date +%s) - start )) s"
    cr-report --show-pending "$session" | tail -n 3
done
