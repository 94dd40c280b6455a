# Shared by the tests/apps/mpi scripts (sourced, after NAME is set): a work
# folder, the clean-up on any exit, and the PASS / FAIL / SKIPPED verdicts.
#   WORK     a fresh temporary folder, removed on exit
#   JOBS     pids of background `timeout` processes: killed with their
#            descendants on exit
#   cleanup  a function the script may define: called on exit first
WORK=$(mktemp -d "${TMPDIR:-/tmp}/nk_$NAME.XXXXXX")
JOBS=()
VERDICT=""  # set once PASS, FAIL or SKIPPED is printed

# SIGKILLs a process and all its descendants (mpirun puts every rank in a
# process group of its own, so a group kill would miss them).
kill_tree() {
  local child
  for child in $(pgrep -P "$1" || true); do kill_tree "$child"; done
  kill -KILL "$1" 2>/dev/null || true
}

finish() {
  local rc=$?
  local pid
  for pid in "${JOBS[@]}"; do kill_tree "$pid"; done
  if declare -F cleanup >/dev/null; then cleanup; fi
  rm -rf "$WORK"
  if ((rc != 0)) && [[ -z $VERDICT ]]; then
    echo "FAIL: $NAME: unexpected error (exit status $rc)"
  fi
  exit "$rc"
}
trap finish EXIT
trap 'VERDICT=fail; echo "FAIL: $NAME: interrupted"; exit 130' INT TERM

# Prints the end of every log in WORK and FAIL: NAME: MESSAGE, exits 1.
fail() {
  local log
  for log in "$WORK"/*.log; do
    [[ -e $log ]] && { echo "--- $(basename "$log") (last lines)"; tail -n 25 "$log"; }
  done
  VERDICT=fail
  echo "FAIL: $NAME: $*"
  exit 1
}

pass() {
  VERDICT=pass
  echo "PASS: $NAME: $*"
}
