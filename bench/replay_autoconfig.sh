#!/usr/bin/env bash
# Replays saved autoconfig grids (run_autoconfig_bench.sh's KEEP=FILE, or
# any `nekton autoconfig --measure ... --json` output) through this build's
# step model: each grid's calibration and rates (--calibration) predict its
# measured layouts again, and the errors against the steps measured then
# are printed, per grid and per kind of layout. A change to the model
# (train/step_calibration.cc) is judged on every saved grid in seconds,
# with no run; grids saved before the rates were kept in the output take
# this host's rates now (a few per cent apart).
#   bench/replay_autoconfig.sh BUILD GRID.json [GRID.json...]
set -euo pipefail
BUILD=$1
shift
NK=$BUILD/bin/nekton
OUT=$(mktemp -d /tmp/nk_autoconfig_replay.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
for g in "$@"; do
  mapfile -t ARGS < <(/usr/bin/python3 - "$g" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
r = j.get("recipe") or {"config": "", "overrides": [
    "model.preset=gpt-tiny", "train.global_batch=8", "train.seq_len=128"]}
if r["config"]:
    print("--config"); print(r["config"])
for o in r["overrides"]:
    print(o)
print("--nodes"); print(j["nodes"])
print("--procs-per-node"); print(j["procs_per_node"])
PY
)
  "$NK" autoconfig "${ARGS[@]}" --calibration "$g" --json >"$OUT/$(basename "$g")" \
    2>"$OUT/log" || { cat "$OUT/log"; exit 1; }
done
/usr/bin/python3 - "$OUT" "$@" <<'PY'
import collections, json, os, statistics, sys
out, grids = sys.argv[1], sys.argv[2:]
kinds = collections.defaultdict(list)
print("| grid | within 20 % then | now | largest error now | measured best in the top 3 now |")
print("|---|---:|---:|---:|---|")
for g in grids:
    old = json.load(open(g))
    new = {c["layout"]: c for c in json.load(open(os.path.join(out, os.path.basename(g))))["candidates"]}
    runs = [c for c in old["candidates"] if c.get("measured", {}).get("ok")]
    then = now = 0
    worst = 0.0
    preds = []
    for c in runs:
        got = c["measured"]["step_s"]
        p0 = c["step_seconds"]["total"]
        p1 = new[c["layout"]]["step_seconds"]["total"] if c["layout"] in new else float("nan")
        then += abs(p0 - got) <= 0.2 * got
        now += abs(p1 - got) <= 0.2 * got
        e = (p1 - got) / got
        worst = max(worst, abs(e))
        preds.append((p1, got))
        kind = "+".join(k for k in ("tp", "cp", "pp") if c[k] > 1) or "dp"
        if c["shard"] in ("grads", "full"):
            kind += "+" + {"grads": "zero2", "full": "fsdp"}[c["shard"]]
        kinds[kind].append(e)
    best = min(preds, key=lambda x: x[1])
    top3 = sorted(preds)[:3]
    print(f"| {os.path.basename(g)} | {then}/{len(runs)} | {now}/{len(runs)} | "
          f"{100 * worst:.0f} % | {'yes' if best in top3 else 'no'} |")
print("\n| kind | runs | mean error | spread (sd) | past 20 % |\n|---|---:|---:|---:|---:|")
for k, v in sorted(kinds.items()):
    sd = statistics.pstdev(v) if len(v) > 1 else 0.0
    print(f"| {k} | {len(v)} | {100 * statistics.mean(v):+.1f} % | {100 * sd:.1f} % | "
          f"{sum(abs(e) > 0.2 for e in v)} |")
PY
