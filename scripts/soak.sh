#!/usr/bin/env bash
# Long soaks of the kill-round tests, one after the other (never in parallel):
#
#   writer   tests/test_crash.py: a real writer process appending with durability="sync", SIGKILLed at
#            random moments; after each round every acknowledged message is there, in order, nothing
#            invented, and what recovery cuts is kept byte for byte in its quarantine file.
#   hub      tests/test_hub_copy.py: a real hub copy process (local source) SIGKILLed mid-copy while a
#            producer writes; in the end the copy is byte-identical and holds every message once.
#   ssh      tests/test_hub_ssh.py: the same over SSH (a real sshd on 127.0.0.1): even rounds kill
#            the hub process, odd rounds cut its SSH connection.
#   scale    tests/test_hub_scale.py: `sej copy` over SSH SIGKILLed at random moments of its passes over
#            1,000 journals (SEJ_SOAK_JOURNALS) that writers append to all along; the hub ends
#            byte-identical, every message once, every offset on the source equal to the hub's.
#
# The same tests run in CI with a few rounds in a time budget; SEJ_SOAK_ROUNDS=N makes them run N
# rounds, bounded by that count only. Usage:
#
#   scripts/soak.sh                  # writer 200, hub 100, ssh 40 rounds (20 kills + 20 cuts), scale 20 kills
#   scripts/soak.sh writer 500       # one soak with its own round count
#
# Seeds are printed (rerun with SEJ_CRASH_SEED / SEJ_HUB_SEED); a failing round's journals are copied
# to $SEJ_SOAK_KEEP (default: $TMPDIR/sej-soak-failures).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

run() {
    local name=$1 rounds=$2
    shift 2
    echo "== soak $name: $rounds rounds"
    local t0=$SECONDS log="${SEJ_SOAK_LOGDIR:-${TMPDIR:-/tmp}}/sej-soak-$name.log"
    set +e
    SEJ_SOAK_ROUNDS=$rounds python3 -m pytest -p no:cacheprovider -q -s "$@" 2>&1 | tee "$log" |
        grep -E "^seed|passed|failed|kept in|Error"
    local rc=${PIPESTATUS[0]}
    set -e
    echo "== soak $name: exit $rc after $((SECONDS - t0)) s (full output: $log)"
    return "$rc"
}

soak_writer() { SEJ_CRASH_MODES=${SEJ_CRASH_MODES:-sync} run writer "${1:-200}" "tests/test_crash.py::test_sigkill_writer_at_random_moments[0]"; }
soak_hub() { run hub "${1:-100}" "tests/test_hub_copy.py::test_copier_killed_at_random_moments_never_gaps_or_duplicates"; }
soak_ssh() { mkdir -p /run/sshd 2>/dev/null || true; run ssh "${1:-40}" "tests/test_hub_ssh.py::test_hub_killed_and_connection_cut_at_random_moments"; }
soak_scale() {
    mkdir -p /run/sshd 2>/dev/null || true
    SEJ_SOAK_JOURNALS=${SEJ_SOAK_JOURNALS:-1000} run scale "${1:-20}" "tests/test_hub_scale.py"
}

case "${1:-all}" in
    writer) soak_writer "${2:-}" ;;
    hub) soak_hub "${2:-}" ;;
    ssh) soak_ssh "${2:-}" ;;
    scale) soak_scale "${2:-}" ;;
    all)
        status=0
        soak_writer || status=1
        soak_hub || status=1
        soak_ssh || status=1
        soak_scale || status=1
        exit $status
        ;;
    *)
        echo "usage: $0 [all | writer [ROUNDS] | hub [ROUNDS] | ssh [ROUNDS] | scale [ROUNDS]]" >&2
        exit 2
        ;;
esac
