#!/usr/bin/env bash
# Mutation testing with cosmic-ray: one session per module, each with its own config
# (strength/mutation/<name>.toml) and session database (strength/mutation/<name>.sqlite, an output, gitignored).
#
#   bash strength/mutation/run.sh                     every session
#   bash strength/mutation/run.sh canary_source ...   the named sessions
#
# A session is resumable: its database keeps every result, and a second run executes only the
# mutants still pending. Delete the database to start that session over. Stop a run with
# Ctrl-C (SIGINT), never SIGKILL: cosmic-ray mutates the module file in place and restores it
# when a mutant's test run ends; after a hard kill, `git diff` shows the mutant left behind.
# Run it in a clone or worktree of its own, not in a tree someone is editing.
set -euo pipefail
cd "$(dirname "$0")/../.."

# Each session's test command is `python -m pytest ...` (what a distributed worker runs). Here
# it runs through strength/forkserver.py instead, a server that has torch, Triton, numpy,
# Hypothesis and pytest imported and forks for every mutant, which saves Python's start-up
# (about 3 s) per mutant. KV_CANARY_MUTATION_FORKSERVER=0 runs the plain command.
workdir=$(mktemp -d)
server_pid=
cleanup() {
    [ -z "$server_pid" ] || kill "$server_pid" 2>/dev/null || true
    rm -rf "$workdir"
}
trap cleanup EXIT
socket="$workdir/forkserver.sock"
if [ "${KV_CANARY_MUTATION_FORKSERVER:-1}" != 0 ]; then
    python strength/forkserver.py serve --socket "$socket" > "$workdir/forkserver.log" 2>&1 &
    server_pid=$!
    for _ in $(seq 300); do
        [ -S "$socket" ] && break
        kill -0 "$server_pid" 2>/dev/null || { cat "$workdir/forkserver.log" >&2; exit 2; }
        sleep 0.1
    done
    [ -S "$socket" ] || { echo "forkserver did not start" >&2; exit 2; }
fi

names=("$@")
if [ ${#names[@]} -eq 0 ]; then
    for config in strength/mutation/*.toml; do names+=("$(basename "$config" .toml)"); done
fi
for name in "${names[@]}"; do
    config="strength/mutation/$name.toml"
    session="strength/mutation/$name.sqlite"
    [ -f "$config" ] || { echo "no config $config" >&2; exit 2; }
    if [ -n "$server_pid" ]; then
        sed "s|\"python -m pytest |\"python strength/forkserver.py run --socket $socket -- |" \
            "$config" > "$workdir/$name.toml"
        config="$workdir/$name.toml"
    fi
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
