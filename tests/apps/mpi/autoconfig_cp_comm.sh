#!/usr/bin/env bash
# nekton autoconfig searches parallel.cp_comm_type (issue 42): on 2 nodes x
# 2 ranks of a 2-layer GPT-2 (4 heads) the table names every type at cp 2
# and cp 4 (a2a+p2p only at cp 4, as 2x2) and each type's override line
# loads back as a config with that type; a type the user gives stays fixed
# (no other type, no override line of its own); and --measure runs the
# override lines as given: on 2 ranks where only cp 2 layouts train (d_ff
# odd: no tp; one layer: no pp; one sequence a step: no dp), every measured
# run's trainer reports the type its candidate names. No time is asserted.
# Usage: autoconfig_cp_comm.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
REPO=$1
NK=$2/bin/nekton
NAME=autoconfig_cp_comm
# shellcheck source=script_lib.sh
source "$REPO/tests/apps/mpi/script_lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
cd "$WORK" || fail "no work folder"
T=$((120 * ${NK_TIME_SCALE:-1}))
MODEL=(model.preset=gpt-tiny model.n_layer=2 model.d_model=128 model.n_head=4
       train.global_batch=8 train.seq_len=64)
NODES=(--nodes 2 --procs-per-node 2 --link-gbps 10)

# The table: every type at cp 2 and 4 (predicted only: 2 nodes).
timeout "$T" "$NK" autoconfig "${MODEL[@]}" "${NODES[@]}" --top 100000 >table.log 2>&1 ||
  fail "autoconfig on 2 nodes"
for t in "cp2 p2p " "cp2 a2a " "cp2 all_gather " "cp4 p2p " "cp4 a2a " "cp4 all_gather " \
  "cp4 a2a+p2p 2x2 "; do
  grep -qF " tp1 $t" table.log || fail "the table has no '$t' layout"
done
if grep -qE "cp[12] a2a\+p2p|cp[0-9]+ a2a\+p2p (1x|[0-9]+x1 )" table.log; then
  fail "a2a+p2p below cp 4 or with a split of 1"
fi
grep -q "predicted best: #1" table.log || fail "no predicted best"

# The JSON: each (cp, type)'s override line through nekton train's config
# loader (--print-config checks the settings as nekton train does).
timeout "$T" "$NK" autoconfig "${MODEL[@]}" "${NODES[@]}" --json >search.json 2>search.log ||
  fail "autoconfig --json"
/usr/bin/python3 - search.json >lines.txt <<'PY' || fail "the JSON's types"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["cp_comm_searched"] is True
seen = {}
for c in j["candidates"]:
    if c["cp"] == 1:
        assert "cp_comm_type" not in c and not any("cp_comm_type" in o for o in c["overrides"]), c
        continue
    t = c["cp_comm_type"]
    assert f"parallel.cp_comm_type={t}" in c["overrides"], c
    if t == "a2a+p2p":
        assert c["hierarchical_cp_sizes"] == [2, 2], c
        assert "parallel.hierarchical_context_parallel_sizes=2,2" in c["overrides"], c
    seen.setdefault((c["cp"], t), c["overrides"])
assert set(seen) == {(2, "p2p"), (2, "a2a"), (2, "all_gather"), (4, "p2p"), (4, "a2a"),
                     (4, "all_gather"), (4, "a2a+p2p")}, sorted(seen)
for (cp, t), o in sorted(seen.items()):
    print(t, " ".join(o))
PY
while read -r type line; do
  # shellcheck disable=SC2086
  timeout "$T" "$NK" train --print-config "${MODEL[@]}" data.path="$REPO/README.md" $line \
    >config.log 2>&1 || fail "nekton train does not load the line of $type: $line"
  grep -qF "cp_comm_type: \"$type\"" config.log ||
    fail "the line of $type loads another type: $(grep cp_comm_type config.log)"
  if [[ $type == a2a+p2p ]]; then
    grep -qF 'hierarchical_context_parallel_sizes: "2,2"' config.log ||
      fail "the line of a2a+p2p loads other sizes"
  fi
done <lines.txt

# A type the user gives stays fixed.
timeout "$T" "$NK" autoconfig "${MODEL[@]}" parallel.cp_comm_type=all_gather "${NODES[@]}" \
  --top 100000 >fixed.log 2>&1 || fail "autoconfig with a fixed type"
grep -q "parallel.cp_comm_type = all_gather: as given, not searched" fixed.log ||
  fail "the fixed type is not reported"
grep -qF " tp1 cp2 all_gather " fixed.log || fail "no cp 2 layout with the fixed type"
if grep -qE "cp[0-9]+ (p2p|a2a)" fixed.log; then
  fail "another type than the fixed one: $(grep -E "cp[0-9]+ (p2p|a2a)" fixed.log | head -1)"
fi

# --measure: the override lines run as given; the trainer's log of each
# run names the type (only cp 2 layouts train here: 3 types x 3 recompute).
timeout $((3 * T)) "$NK" autoconfig "${MODEL[@]}" model.n_layer=1 model.d_ff=511 \
  train.global_batch=1 train.micro_batch=1 --nodes 1 --procs-per-node 2 --measure 9 --steps 2 --json \
  >measured.json 2>measured.log || fail "autoconfig --measure"
/usr/bin/python3 - measured.json <<'PY' || fail "the measured runs' types"
import json, sys
j = json.load(open(sys.argv[1]))
words = {"p2p": "ring attention over the cp group",
         "a2a": "parallel.cp_comm_type=a2a:",
         "all_gather": "parallel.cp_comm_type=all_gather:"}
types = set()
assert len(j["candidates"]) == 9, [c["layout"] for c in j["candidates"]]
for c in j["candidates"]:
    m = c["measured"]
    assert m["ok"], f"{c['layout']} failed: {m.get('failure')} {m.get('log_tail')}"
    t = c["cp_comm_type"]
    types.add(t)
    assert words[t] in m.get("context_parallel", ""), (c["layout"], m.get("context_parallel"))
    print(f"{c['layout']}: {m['context_parallel']}")
assert types == set(words), types
PY
pass "every cp_comm_type at cp 2 and 4 listed, each line loads back, a given type stays fixed," \
  "and each measured run trains the type its line names"
