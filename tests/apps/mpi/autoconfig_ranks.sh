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
# to its three fully sharded probes, and on 4 ranks to a fourth in a
# sharding group of 2. How close the predictions come is
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

# What the grid's and the 4-rank calibration's checks share (imported by
# their Python through PYTHONPATH): a layout's predicted step, and a probe's
# layout predicted at its measured step when the cost fitted to it is
# positive (at least at it when the fit came out negative, clamped to 0).
cat >"$WORK/autoconfig_check.py" <<'PY'
def layout(j, shard, tp=1, cp=1, dp=1, pp=1, mb=1, recompute="none", sp=False):
    return next(c for c in j["candidates"] if c["shard"] == shard and c["tp"] == tp and
                c["cp"] == cp and c["dp"] == dp and c["pp"] == pp and c["micro_batch"] == mb and
                c["recompute"] == recompute and c["sp"] == sp)["step_seconds"]["total"]

def at_measured(predicted, measured, cost, tol):
    if cost > 0:
        assert abs(predicted - measured) <= tol * measured, (predicted, measured, cost)
    else:
        assert predicted >= measured * (1 - 1e-9), (predicted, measured, cost)
PY

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
  PYTHONPATH="$WORK" /usr/bin/python3 - "$1" <<'PY'
import json, math, sys
from autoconfig_check import at_measured, layout
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
# FSDP's costs: three fully sharded probes (one sequence per micro-batch,
# one micro-batch per rank: 1 and 4 here; one sequence per micro-batch of
# twice the batch), measured, and the calibration fitted to them by least
# squares (each probe's residual past its step at the fit, fitted_s,
# orthogonal to the model's slopes there; taken only at a per-byte cost no
# less than the page probe's); when that fit's per-step cost is negative,
# the per-byte cost alone by least squares; with the fallback (said in the
# log) the page probe's cost per byte, and the probe that leaves the least
# past it predicted at its measured step. And fitted_s is the search's:
# the layout of the first probe is predicted at it.
cal, probes, kind = j["calibration"], j["fsdp_probes"], j["fsdp_fit"]
assert [(p["tp"], p["micro_batch"], p["global_batch"]) for p in probes] == \
    [(1, 1, 8), (1, 4, 8), (1, 1, 16)], probes
assert cal["fsdp_pair_step_s"] == -1, "a pair probe on 2 ranks"  # (the group is 2)
for p in probes:
    assert p["measured_s"] > 0 and p["per_s_per_byte"] > 0 and p["per_step_s"] > 0, p
    assert p["fitted_s"] >= p["predicted_without_s"], p
page, per_byte, per_step = (cal["page_refault_s_per_byte"], cal["refault_s_per_byte"],
                            cal["fsdp_step_s"])
res = [p["measured_s"] - p["fitted_s"] for p in probes]
scale = max(p["measured_s"] for p in probes)
def orthogonal(slope):
    dot = sum(r * p[slope] for r, p in zip(res, probes))
    return abs(dot) <= 1e-9 * scale * sum(abs(p[slope]) for p in probes)
if kind in ("3 probes", "3 probes, two rounds"):
    assert per_byte >= page and per_step >= 0, (kind, cal)
    assert orthogonal("per_s_per_byte") and orthogonal("per_step_s"), (res, probes)
elif kind == "3 probes per byte alone":
    assert per_byte >= page and per_step == 0, (kind, cal)
    assert orthogonal("per_s_per_byte"), (res, probes)
elif kind == "page probe per byte, the probes per step":
    assert per_byte == page and per_step >= 0, (kind, cal)
    # (a per-step cost of 0: the least was negative, clamped)
    assert per_step == 0 or (min(res) >= -1e-9 * scale and min(map(abs, res)) <= 1e-9 * scale), res
else:
    assert kind == "page probe" and per_byte == page, (kind, cal)
first = layout(j, "full", dp=2)
assert abs(first - probes[0]["fitted_s"]) <= 1e-9 * scale, (first, probes)
steps = ", ".join("%.1f" % (p["measured_s"] * 1e3) for p in probes)
resid = ", ".join("%+.1f" % (r * 1e3) for r in res)
print(f"FSDP ({kind}): {per_byte * 1e9:.2f} ns a gathered byte + {per_step * 1e3:.1f} ms a "
      f"step (probes at {steps} ms, residuals {resid})")
# ZeRO-2's probe (dp 2, one sequence per micro-batch: 4 a rank) and its
# fitted per-micro-batch cost: the same layout is predicted at the probe's
# measured step (or above it, where the model alone already was).
z = j["zero2_probe"]
assert z["micro_batches"] == 4 and z["measured_s"] > 0 and z["predicted_without_s"] > 0, z
pz = layout(j, "grads", dp=2)
at_measured(pz, z["measured_s"], cal["zero2_micro_batch_s"], 1e-9)
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
# 4 ranks (on this host's cores): the calibration only. FSDP's costs are
# fitted on all 4 ranks and again in a sharding group of 2 (tp 2 x dp 2:
# one micro-batch per rank, one sequence per micro-batch): the search
# predicts both layouts at their probes' fitted steps, and with the pair's
# two-probe fit (refined where the model bends; taken only where it reaches
# both, else the next fit, as a pair whose noise put the solution past a
# bend did under a parallel ctest) those are the measured ones; with the
# per-byte cost alone, no per-step cost; with the per-step cost alone at
# the group's per-byte cost, the first (at least it, when that cost came
# out negative and was clamped).
timeout $((2 * T)) "$NK" autoconfig "${MODEL[@]}" --nodes 1 --procs-per-node 4 --json \
  >four.json 2>four.log || fail "autoconfig --procs-per-node 4"
PYTHONPATH="$WORK" /usr/bin/python3 - four.json <<'PY' || fail "the 4-rank FSDP calibration"
import json, sys
from autoconfig_check import at_measured, layout
j = json.load(open(sys.argv[1]))
cal, probes, kind = j["calibration"], j["fsdp_probes"], j["fsdp_pair_fit"]
assert [(p["tp"], p["micro_batch"], p["global_batch"]) for p in probes] == \
    [(1, 1, 8), (1, 2, 8), (1, 1, 16), (2, 4, 8), (2, 1, 8)], probes
assert cal["fsdp_group"] == 4 and cal["fsdp_pair_step_s"] >= 0, cal
assert cal["fsdp_pair_refault_s_per_byte"] >= cal["page_refault_s_per_byte"], cal
def pair_layout(mb):
    return layout(j, "full", tp=2, dp=2, mb=mb)
pairs = probes[3:]
for p in pairs:  # the search predicts each pair layout at its probe's fitted step
    got = pair_layout(p["micro_batch"])
    assert abs(got - p["fitted_s"]) <= 1e-9 * p["fitted_s"], (got, p)
if kind == "two probes":  # and that, refined at the fit, is the measured one
    for p in pairs:
        assert abs(p["fitted_s"] - p["measured_s"]) <= 1e-6 * p["measured_s"], p
elif kind == "two probes per byte alone":
    assert cal["fsdp_pair_step_s"] == 0, cal
else:
    assert kind == "the group's per byte, one probe per step", kind
    assert cal["fsdp_pair_refault_s_per_byte"] == cal["refault_s_per_byte"], cal
    at_measured(pairs[0]["fitted_s"], pairs[0]["measured_s"], cal["fsdp_pair_step_s"], 1e-9)
# ZeRO-2 likewise: a probe at tp 2 x dp 2 (one sequence per micro-batch)
# gives the cost in a group of 2, at which the search predicts its layout
# (at least at it, when the cost came out negative and was clamped to 0).
z = j["zero2_pair_probe"]
assert z["micro_batches"] == 4 and z["measured_s"] > 0, z
assert cal["zero2_pair_micro_batch_s"] >= 0 and cal["zero2_group"] == 4, cal
zc = layout(j, "grads", tp=2, dp=2)
at_measured(zc, z["measured_s"], cal["zero2_pair_micro_batch_s"], 1e-6)
print(f"4 ranks: FSDP {cal['refault_s_per_byte'] * 1e9:.2f} ns a byte + "
      f"{cal['fsdp_step_s'] * 1e3:.1f} ms a step in groups of 4 ({j['fsdp_fit']}), "
      f"{cal['fsdp_pair_refault_s_per_byte'] * 1e9:.2f} ns + "
      f"{cal['fsdp_pair_step_s'] * 1e3:.1f} ms in groups of 2 ({kind}); the tp 2 x dp 2 probes "
      f"measured {pairs[0]['measured_s'] * 1e3:.1f} and {pairs[1]['measured_s'] * 1e3:.1f} ms, "
      f"predicted {pair_layout(4) * 1e3:.1f} and {pair_layout(1) * 1e3:.1f}; ZeRO-2 "
      f"{cal['zero2_micro_batch_s'] * 1e3:.1f} ms a micro-batch in groups of 4, "
      f"{cal['zero2_pair_micro_batch_s'] * 1e3:.1f} in groups of 2 (probe {z['measured_s'] * 1e3:.1f} ms, "
      f"predicted {zc * 1e3:.1f})")
PY

# --calibration: the 4-rank search again from four.json's rates and
# calibration, no probe run: every layout predicted as before, to the bit.
# A file for other ranks, another recipe, no file, no calibration in it:
# refused, naming the file and what differs.
timeout "$T" "$NK" autoconfig "${MODEL[@]}" --nodes 1 --procs-per-node 4 --calibration four.json \
  --json >again.json 2>again.log || fail "autoconfig --calibration four.json"
/usr/bin/python3 - four.json again.json <<'PY' || fail "--calibration did not reproduce the search"
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:])
assert b["calibration_from"] == "four.json", b.get("calibration_from")
assert a["calibration"] == b["calibration"] and a["rates"] == b["rates"]
assert a["fsdp_probes"] == b["fsdp_probes"] and a["fsdp_fit"] == b["fsdp_fit"]
pa = {c["layout"]: c["step_seconds"] for c in a["candidates"]}
pb = {c["layout"]: c["step_seconds"] for c in b["candidates"]}
assert pa == pb, [k for k in pa if pa[k] != pb.get(k)][:5]
print(f"--calibration: {len(pb)} layouts predicted as the search that calibrated")
PY
grep -q "probe-" again.log && fail "--calibration ran a probe"
refused cal_ranks "four.json: calibrated for 4 processes per node" \
  "${MODEL[@]}" --nodes 1 --procs-per-node 2 --calibration four.json
refused cal_recipe "four.json: calibrated for" "${MODEL[@]}" model.n_layer=3 --nodes 1 \
  --procs-per-node 4 --calibration four.json
refused cal_missing "--calibration none.json: no such file" "${MODEL[@]}" --nodes 1 \
  --procs-per-node 4 --calibration none.json
echo '{"world": 4}' >nocal.json
refused cal_empty 'nocal.json: no "calibration" object' "${MODEL[@]}" --nodes 1 \
  --procs-per-node 4 --calibration nocal.json
echo '{"calibration": {"compute_scale": "x"}}' >badcal.json
refused cal_key "badcal.json: calibration key 'compute_scale' is not a number" "${MODEL[@]}" \
  --nodes 1 --procs-per-node 4 --calibration badcal.json
pass "bad input refused; timeouts killed; every layout of the grid measured and the" \
  "measured best written by --out trains; FSDP's and ZeRO-2's costs by sharding group on 4" \
  "ranks;" \
  "--calibration reproduces the search (accuracy: bench/run_autoconfig_bench.sh)"
