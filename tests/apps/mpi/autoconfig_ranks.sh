#!/usr/bin/env bash
# nekton autoconfig (issue 42): on a grid this machine runs (a 2-layer
# GPT-2 of width 128 on 2 ranks), the layouts spread over the predicted
# ranking are run for a few steps each in two rounds (the median of the
# rounds' steps after each run's first):
# every one is measured, and the recipe --out wrote (the measured best)
# trains under nekton train --nproc 2; a run past --timeout is killed,
# reported and leaves no process behind; and bad input (an unknown key,
# --nodes 0, --procs-per-node x, a memory that no layout fits, --measure
# over several nodes) fails naming the flag or key; FSDP's costs are fitted
# to its two fully sharded probes, and on 4 ranks to a third in a sharding
# group of 2. How close the predictions come is
# timing: bench/run_autoconfig_bench.sh measures it.
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
refused zero_rounds "--rounds must be at least 1" "${MODEL[@]}" --nodes 1 --procs-per-node 2 \
  --measure 1 --rounds 0

# Several nodes: predicted only (the link given), a table and the best.
timeout "$T" "$NK" autoconfig "${MODEL[@]}" --nodes 2 --procs-per-node 2 --link-gbps 10 \
  >nodes.log 2>&1 || fail "autoconfig on 2 nodes"
grep -q "predicted best: #1" nodes.log || fail "2 nodes: no predicted best"

# A run past its deadline: killed, reported, nothing left running. 50 ms is
# less than any run takes (mpirun's start alone); at 0.5 s the tiny model's
# best layout sometimes finished its few steps in time.
if timeout "$T" "$NK" autoconfig "${MODEL[@]}" --nodes 1 --procs-per-node 2 --measure 1 \
  --timeout 0.05 >timeout.log 2>&1; then
  fail "every run timed out, yet autoconfig succeeded"
fi
grep -q "killed at its deadline (timed out)" timeout.log || fail "the timed-out run is not reported"
grep -q "none of the 1 measured runs finished" timeout.log ||
  fail "the measured run's timeout is not the error"
# Killed processes may take a moment to go on a loaded host: up to 10 s.
for _ in $(seq 20); do pgrep -f "nekton-autoconfig-" >/dev/null || break; sleep 0.5; done
if pgrep -f "nekton-autoconfig-" >/dev/null; then
  pgrep -af "nekton-autoconfig-"
  fail "a timed-out run left processes behind"
fi

# The grid: 6 layouts spread from the predicted best to the worst, 7 steps
# each in 2 rounds (the median of the 12 after each run's first). Asserted:
# every layout ran in both rounds and was measured (its step the median of
# the rounds' pooled timed steps), --out took the measured best, and each
# prediction is a positive step time. How close predictions come to measurements is timing,
# so it is printed here and measured by bench/run_autoconfig_bench.sh, its
# figures in BENCHMARKS.md, not asserted: a test never asserts on time, and
# on CI beside other tests (2026-11-30) one grid failed the earlier "within
# 2x on a quiet host" check.
check_grid() {  # check_grid GRID.json: 0 checked, 1 failed
  /usr/bin/python3 - "$1" <<'PY'
import json, math, sys
j = json.load(open(sys.argv[1]))
host = j["host_load"]
runs = [c for c in j["candidates"] if "measured" in c]
assert len(runs) >= 5, f"{len(runs)} runs measured"
for c in runs:
    m = c["measured"]
    assert m["ok"], f"#{c['rank']} {c['layout']} failed: {m.get('failure')}"
    pred, got = c["step_seconds"]["total"], m["step_s"]
    assert math.isfinite(pred) and pred > 0, f"#{c['rank']}: predicted step {pred}"
    assert math.isfinite(got) and got > 0, f"#{c['rank']}: measured step {got}"
    rounds, steps = m["round_step_s"], m["steps_s"]
    assert len(rounds) == 2 and len(steps) == 14, f"#{c['rank']}: {rounds}, {len(steps)} steps"
    timed = sorted(steps[1:7] + steps[8:])
    assert abs(got - (timed[5] + timed[6]) / 2) < 1e-9, f"#{c['rank']}: {got} not the median"
    print(f"#{c['rank']:<3} {c['layout']:<36} predicted {pred * 1e3:7.1f} ms "
          f"measured {got * 1e3:7.1f} ms ({100 * (pred - got) / got:+.0f} %), others "
          f"{100 * m['others_cpu_share']:.0f} %, load {m['load_averages']}")
# FSDP's costs: two fully sharded probes (one sequence per micro-batch, then
# one micro-batch per rank: 1 and 4 here), measured, and the calibration
# fitted to them: with a two-probe fit (taken only at a per-byte cost no
# less than the page probe's) a layout the same as a probe is predicted at
# its measured step; when that fit's per-step cost is negative, the
# per-byte cost alone by least squares; with the fallback (said in the log) the page probe's
# cost per byte, and the probe that leaves the least past it predicted at
# its measured step, the other at most at its own.
cal, probes, kind = j["calibration"], j["fsdp_probes"], j["fsdp_fit"]
assert [(p["tp"], p["micro_batch"]) for p in probes] == [(1, 1), (1, 4)], probes
assert cal["fsdp_pair_step_s"] == -1, "a pair probe on 2 ranks"  # (the group is 2)
for p in probes:
    assert p["measured_s"] > 0 and p["per_s_per_byte"] > 0 and p["per_step_s"] > 0, p
page = cal["page_refault_s_per_byte"]
def fsdp(mb):
    return next(c for c in j["candidates"] if c["shard"] == "full" and c["dp"] == 2 and
                c["tp"] == c["cp"] == c["pp"] == 1 and c["micro_batch"] == mb and
                c["recompute"] == "none")
got = {p["micro_batch"]: fsdp(p["micro_batch"])["step_seconds"]["total"] for p in probes}
if kind in ("two probes", "two probes, two rounds"):
    assert cal["refault_s_per_byte"] >= page and cal["fsdp_step_s"] >= 0, (kind, cal)
    for p in probes:
        assert abs(got[p["micro_batch"]] - p["measured_s"]) <= 1e-9 * p["measured_s"], (p, got)
elif kind == "two probes per byte alone":
    # (their fit's per-step cost was negative) least squares through 0:
    # the probes' gaps, weighted by what a byte's cost adds to each, cancel
    assert cal["refault_s_per_byte"] >= page and cal["fsdp_step_s"] == 0, (kind, cal)
    gaps = [p["measured_s"] - got[p["micro_batch"]] for p in probes]
    w = sum(p["per_s_per_byte"] * g for p, g in zip(probes, gaps))
    scale = sum(p["per_s_per_byte"] * p["measured_s"] for p in probes)
    assert abs(w) <= 1e-9 * scale, (gaps, w)
elif kind == "page probe per byte, the probes per step":
    assert cal["refault_s_per_byte"] == page and cal["fsdp_step_s"] >= 0, (kind, cal)
    # (a per-step cost of 0: the least was negative, clamped)
    gaps = [p["measured_s"] - got[p["micro_batch"]] for p in probes]
    tol = 1e-9 * max(p["measured_s"] for p in probes)
    assert cal["fsdp_step_s"] == 0 or (min(gaps) >= -tol and min(map(abs, gaps)) <= tol), gaps
else:
    assert kind == "page probe" and cal["refault_s_per_byte"] == page, (kind, cal)
print(f"FSDP ({kind}): {cal['refault_s_per_byte'] * 1e9:.2f} ns a gathered byte + "
      f"{cal['fsdp_step_s'] * 1e3:.1f} ms a step (probes at {probes[0]['measured_s'] * 1e3:.1f} "
      f"and {probes[1]['measured_s'] * 1e3:.1f} ms)")
# ZeRO-2's probe (dp 2, one sequence per micro-batch: 4 a rank) and its
# fitted per-micro-batch cost: the same layout is predicted at the probe's
# measured step (or above it, where the model alone already was).
z = j["zero2_probe"]
assert z["micro_batches"] == 4 and z["measured_s"] > 0 and z["predicted_without_s"] > 0, z
zc = next(c for c in j["candidates"] if c["shard"] == "grads" and c["dp"] == 2 and
          c["tp"] == c["cp"] == c["pp"] == 1 and c["micro_batch"] == 1 and
          c["recompute"] == "none")
pz = zc["step_seconds"]["total"]
if cal["zero2_micro_batch_s"] > 0:
    assert abs(pz - z["measured_s"]) <= 1e-9 * z["measured_s"], (pz, z)
else:
    assert pz >= z["measured_s"] * (1 - 1e-9), (pz, z)
print(f"ZeRO-2: {cal['zero2_micro_batch_s'] * 1e3:.1f} ms a micro-batch past its bytes "
      f"(probe {z['measured_s'] * 1e3:.1f} ms, the model without it "
      f"{z['predicted_without_s'] * 1e3:.1f})")
best = min(runs, key=lambda c: c["measured"]["step_s"])
assert j["chosen"] + 1 == best["rank"], "--out did not take the measured best"
# The host's drift: the one-process probe run again after measuring, over
# the calibration's (a ratio; how far it moved is timing, not asserted).
drift = host["probe_drift"]
assert math.isfinite(drift) and drift > 0, f"probe_drift {drift}"
print(f"measured best: #{best['rank']}; other work took "
      f"{100 * host['others_cpu_share_measuring']:.0f} % of the {host['cores']} cores; the "
      f"probe ran {100 * (drift - 1):+.0f} % after measuring")
PY
}
timeout $((4 * T)) "$NK" autoconfig "${MODEL[@]}" --nodes 1 --procs-per-node 2 --measure 6 \
  --spread --steps 7 --rounds 2 --out chosen.yaml --json >grid.json 2>grid.log ||
  fail "autoconfig --measure"
check_grid grid.json >check.log 2>&1
rc=$?
cat check.log
((rc == 0)) || fail "the grid's check"
grep -q "^parallel:" chosen.yaml || fail "chosen.yaml holds no parallel section"
timeout "$T" "$NK" train --nproc 2 --config chosen.yaml data.path="$REPO/README.md" \
  train.steps=2 train.out_dir="$WORK/chosen" train.peak_tflops=1 >chosen.log 2>&1 ||
  fail "nekton train --config chosen.yaml"
[[ -s chosen/metrics.jsonl ]] || fail "the chosen recipe's run wrote no metrics"
# 4 ranks (on this host's cores): the calibration only. FSDP's per-step
# cost is fitted on all 4 ranks and measured again in a sharding group of
# 2 (tp 2 x dp 2, one micro-batch per rank), at the per-byte cost fitted:
# that layout is predicted at its measured step (at least it, when the
# per-step cost came out negative and was clamped to 0).
timeout $((2 * T)) "$NK" autoconfig "${MODEL[@]}" --nodes 1 --procs-per-node 4 --json \
  >four.json 2>four.log || fail "autoconfig --procs-per-node 4"
/usr/bin/python3 - four.json <<'PY' || fail "the 4-rank FSDP calibration"
import json, sys
j = json.load(open(sys.argv[1]))
cal, probes = j["calibration"], j["fsdp_probes"]
assert [(p["tp"], p["micro_batch"]) for p in probes] == [(1, 1), (1, 2), (2, 4)], probes
assert cal["fsdp_group"] == 4 and cal["fsdp_pair_step_s"] >= 0, cal
pair = probes[2]
got = next(c for c in j["candidates"] if c["shard"] == "full" and c["tp"] == 2 and c["dp"] == 2
           and c["pp"] == c["cp"] == 1 and c["micro_batch"] == 4 and c["recompute"] == "none"
           and not c["sp"])["step_seconds"]["total"]
if cal["fsdp_pair_step_s"] > 0:
    assert abs(got - pair["measured_s"]) <= 1e-9 * pair["measured_s"], (got, pair)
else:
    assert got >= pair["measured_s"] * (1 - 1e-9), (got, pair)
print(f"4 ranks: FSDP {cal['fsdp_step_s'] * 1e3:.1f} ms a step in groups of 4, "
      f"{cal['fsdp_pair_step_s'] * 1e3:.1f} in groups of 2 ({j['fsdp_fit']}); the tp 2 x dp 2 "
      f"probe measured {pair['measured_s'] * 1e3:.1f} ms, predicted {got * 1e3:.1f}")
PY
pass "bad input refused; timeouts killed; every layout of the grid measured and the" \
  "measured best written by --out trains; FSDP's per-step cost by sharding group on 4 ranks" \
  "(accuracy: bench/run_autoconfig_bench.sh)"
