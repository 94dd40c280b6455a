#!/usr/bin/env bash
# Data-parallel `nekton train` across two "hosts": two network namespaces
# joined by a veth pair, one rank in each, launched by mpirun through OpenMPI's
# rsh launcher (as over ssh) and talking only TCP over the veth link. The
# per-step losses must equal, as text, those of the same 2-rank job on one host
# (plain DDP and ZeRO-1). Without the privilege to make network namespaces it
# prints "SKIPPED: ..." and exits 0.
#
# usage: multihost_netns.sh REPO BUILD
set -euo pipefail

REPO=$1
BUILD=$2
NEKTON=$BUILD/bin/nekton
NAME=multihost_netns
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_NUM_THREADS=1

JOB_LIMIT_S=$((120 * ${NK_TIME_SCALE:-1}))  # any one mpirun: a hang fails the test instead of blocking it
STEPS=6
ARGS=(model.preset=gpt-tiny model.n_layer=2 model.d_model=64 model.n_head=4 model.d_ff=128
      "data.path=$REPO/README.md" train.dtype=f32 train.micro_batch=2 train.seq_len=32
      train.global_batch=8 "train.steps=$STEPS" train.val_every=0 train.peak_tflops=1
      parallel.bucket_mb=0.05 parallel.timeout_s=60)
NS1=nk_h1_$$
NS2=nk_h2_$$
# The two namespaces form a network of their own, so these addresses cannot
# clash with the host's or with another run of this test.
SUBNET=10.231.1
ADDR1=$SUBNET.1
ADDR2=$SUBNET.2

# shellcheck source=script_lib.sh
source "$(dirname "$0")/script_lib.sh"
MADE_NS=()  # namespaces to delete
# Called on exit by script_lib.sh's clean-up.
cleanup() {
  local ns pid
  for ns in "${MADE_NS[@]}"; do
    # Anything still running in the namespace (a daemon that left its parent).
    for pid in $(ip netns pids "$ns" 2>/dev/null || true); do kill -KILL "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true  # also destroys its end of the veth pair
  done
}

skip() {
  VERDICT=skip
  echo "SKIPPED: network namespaces unavailable: $*"
  exit 0
}

# Runs COMMAND... bounded by `timeout`, output to WORK/LABEL.log; fails unless
# it exits 0. In the background + wait, so that a signal reaches the cleanup.
run_job() {
  local label=$1 rc=0
  shift
  timeout -k 5 "$JOB_LIMIT_S" "$@" >"$WORK/$label.log" 2>&1 </dev/null &
  JOBS+=("$!")
  wait "$!" || rc=$?
  ((rc == 0)) || fail "the $label run exited with status $rc"
}

# "STEP LOSS" per line of a metrics.jsonl, the loss as written.
losses() {
  sed -E 's/.*"step": ([0-9]+),.*"loss": ([^,}]+).*/\1 \2/' "$1"
}

[[ -x $NEKTON ]] || fail "no executable $NEKTON"
command -v mpirun >/dev/null || fail "mpirun is not on PATH"
command -v ip >/dev/null || skip "no 'ip' command (iproute2)"

# The two hosts: loopback up in each, one veth end with one address in each.
for ns in "$NS1" "$NS2"; do
  err=$(ip netns add "$ns" 2>&1) || skip "ip netns add $ns: $err"
  MADE_NS+=("$ns")
  ip -n "$ns" link set lo up
done
err=$(ip link add nk0 netns "$NS1" type veth peer name nk0 netns "$NS2" 2>&1) ||
  skip "cannot make a veth pair: $err"
ip -n "$NS1" addr add "$ADDR1/24" dev nk0
ip -n "$NS2" addr add "$ADDR2/24" dev nk0
ip -n "$NS1" link set nk0 up
ip -n "$NS2" link set nk0 up

# OpenMPI's rsh launcher starts the daemon (orted) of each host that is not
# mpirun's own as `AGENT HOST COMMAND...`, as it would call ssh (ssh options,
# if any, come before HOST). Like ssh, the agent joins COMMAND into one shell
# line (it holds quoted arguments) and runs it, here in the namespace owning
# HOST's address. It records each launch, to show the remote path was taken.
AGENT=$WORK/netns_agent.sh
cat >"$AGENT" <<EOF
#!/usr/bin/env bash
while ((\$#)); do
  case \$1 in
    $ADDR1) ns=$NS1; break ;;
    $ADDR2) ns=$NS2; break ;;
  esac
  shift  # an ssh option
done
((\$#)) || { echo "netns agent: no known host in its arguments" >&2; exit 255; }
shift
echo "\$ns" >>"$WORK/launches"
exec ip netns exec "\$ns" /bin/sh -c "\$*"
EOF
chmod +x "$AGENT"
printf '%s slots=1\n%s slots=1\n' "$ADDR1" "$ADDR2" >"$WORK/hostfile"

# mpirun runs in the first namespace, so ADDR1 is its own host (rank 0 there)
# and ADDR2 is remote (rank 1 through the agent). MPI's messages (BTL) and
# the runtime's own (OOB) may only use TCP on the veth subnet: no shared
# memory between the "hosts", and no other interface.
MULTIHOST=(ip netns exec "$NS1" mpirun -np 2 --hostfile "$WORK/hostfile"
           --mca plm rsh --mca plm_rsh_agent "$AGENT"
           --mca btl tcp,self --mca btl_tcp_if_include "$SUBNET.0/24"
           --mca oob_tcp_if_include "$SUBNET.0/24")
ONEHOST=(mpirun -np 2 --oversubscribe)

for shard in none optimizer; do
  run_job "onehost_$shard" "${ONEHOST[@]}" "$NEKTON" train "${ARGS[@]}" \
    "parallel.shard=$shard" "train.out_dir=$WORK/onehost_$shard"
  run_job "netns_$shard" "${MULTIHOST[@]}" "$NEKTON" train "${ARGS[@]}" \
    "parallel.shard=$shard" "train.out_dir=$WORK/netns_$shard"
  grep -qx "$NS2" "$WORK/launches" || fail "mpirun did not launch into $NS2 through the agent"
  grep -q 'data parallel: world 2 ' "$WORK/netns_$shard.log" ||
    fail "the two-host run (parallel.shard=$shard) did not run data parallel over 2 ranks"
  diff <(losses "$WORK/netns_$shard/metrics.jsonl" | cut -d' ' -f1) <(seq 1 "$STEPS") >/dev/null ||
    fail "the two-host run (parallel.shard=$shard) did not record steps 1..$STEPS"
  if ! d=$(diff <(losses "$WORK/onehost_$shard/metrics.jsonl") \
                <(losses "$WORK/netns_$shard/metrics.jsonl")); then
    fail "parallel.shard=$shard: losses differ (< one host, > two namespaces):"$'\n'"$d"
  fi
  rm "$WORK/launches"
done

pass "DP2 across network namespaces $NS1/$NS2 over TCP matches one host" \
  "(parallel.shard none and optimizer, $STEPS steps)"
