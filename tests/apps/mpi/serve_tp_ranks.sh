#!/usr/bin/env bash
# `nekton serve` split by tensor parallelism (serve.tp=2 over --nproc 2:
# rank 0 serves HTTP, its engine's steps mirrored on rank 1) answers as one
# process's server does: the same completions, greedy and sampled with a
# seed, with log-probabilities within 1e-4 (f32), streamed and not; four
# requests at once (in-flight batching on both ranks); a stream whose client
# hangs up (the cancellation mirrored) and a request after it; a request
# for the prompt's log-probabilities (echo) refused (400); SIGTERM ends the
# whole job cleanly; a hung rank fails its request naming it and ends the
# job; the repository's guardrails (none runs the model) in front of it; a
# LoRA adapter (serve.adapter) split over the ranks; q8_0 weights
# (serve.quantize) and a q8_0 GGUF file.
# What cannot run is refused naming the key: serve.tp without that many
# processes, --nproc other than serve.tp, guardrails that run the model
# (the jailbreak perplexity checks).
#   tests/apps/mpi/serve_tp_ranks.sh REPO BUILD
set -euo pipefail
NAME=serve_tp_ranks
REPO=$1
NK=$2/bin/nekton
source "$REPO/tests/apps/mpi/ranks_lib.sh"

run llama "$NK" finetune "${SFT_ARGS[@]}" train.steps=2
M=$WORK/llama/model

# Starts a server in the background (its log in $WORK/OUT.log; serve.timeout_s
# $TIMEOUT, 30 by default); sets PORT and PID.
start() {
  local out=$1
  shift
  "$@" serve.port=0 serve.timeout_s="${TIMEOUT:-30}" >"$WORK/$out.log" 2>&1 &
  JOBS+=($!)
  PID=$!
  for _ in $(seq 600); do
    PORT=$(grep -oE 'listening on http://[^:]+:[0-9]+' "$WORK/$out.log" | grep -oE '[0-9]+$' || true)
    [[ -n $PORT ]] && return 0
    kill -0 "$PID" 2>/dev/null || fail "$out: the server exited before listening"
    sleep 0.1
  done
  fail "$out: no 'listening on' line"
}
start one "$NK" serve --model "$M"
ONE=$PORT ONE_PID=$PID
start tp2 "$NK" serve --nproc 2 --model "$M" serve.tp=2
TP2=$PORT TP2_PID=$PID
grep -q "the model split over 2 tensor-parallel ranks" "$WORK/tp2.log" ||
  fail "serve.tp=2 did not split the model"

/usr/bin/python3 - "$ONE" "$TP2" <<'PY' || fail "the tensor-parallel server answers otherwise than one process's"
import json, sys, threading, urllib.error, urllib.request
one, tp2 = sys.argv[1], sys.argv[2]

def post(port, body, timeout=60):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()

def same(a, b, what):
    ca, cb = json.loads(a)["choices"], json.loads(b)["choices"]
    assert len(ca) == len(cb), what
    for x, y in zip(ca, cb):
        assert x["text"] == y["text"], (what, x["text"], y["text"])
        assert x["finish_reason"] == y["finish_reason"], what
        if x.get("logprobs"):
            lx, ly = x["logprobs"]["token_logprobs"], y["logprobs"]["token_logprobs"]
            assert len(lx) == len(ly) and all(abs(p - q) <= 1e-4 for p, q in zip(lx, ly)), what

cases = [
    {"prompt": "repeat abc:", "max_tokens": 12, "temperature": 0},
    {"prompt": "say hi", "max_tokens": 16, "temperature": 1.0, "seed": 7, "n": 2, "logprobs": 2},
    {"prompt": "repeat j:", "max_tokens": 10, "temperature": 0.8, "top_p": 0.9, "seed": 3},
]
for i, body in enumerate(cases):
    a, b = post(one, body), post(tp2, body)
    assert a[0] == 200 and b[0] == 200, (i, a, b)
    same(a[1], b[1], f"case {i}")
# Streamed: the same text as the whole answer.
s = post(tp2, dict(cases[0], stream=True))
assert s[0] == 200, s
text = "".join(json.loads(l[6:])["choices"][0]["text"] for l in s[1].splitlines()
               if l.startswith("data: {"))
assert text == json.loads(post(one, cases[0])[1])["choices"][0]["text"], text
# Four at once: decoded in one batch on both ranks, each as alone (greedy).
bodies = [{"prompt": p, "max_tokens": 12, "temperature": 0} for p in
          ["repeat abc:", "repeat j:", "say hi", "repeat ab:"]]
out = [None] * 4
def worker(i):
    out[i] = post(tp2, bodies[i])
threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
for t in threads: t.start()
for t in threads: t.join()
for i in range(4):
    assert out[i][0] == 200, out[i]
    same(out[i][1], post(one, bodies[i])[1], f"concurrent {i}")
# A stream whose client hangs up mid-way: its sequence is cancelled on every
# rank, and the next request is answered as before.
import socket
body = json.dumps({"prompt": "repeat abc:", "max_tokens": 240, "temperature": 1.0, "seed": 1,
                   "stream": True, "ignore_eos": True}).encode()
sock = socket.create_connection(("127.0.0.1", int(tp2)))
sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             b"Content-Length: %d\r\n\r\n" % len(body) + body)
assert sock.recv(64).startswith(b"HTTP/1.1 200"), "the stream did not start"
sock.close()
a, b = post(one, cases[0]), post(tp2, cases[0])
assert b[0] == 200, b
same(a[1], b[1], "after a cancelled stream")
# The prompt's log-probabilities (echo with logprobs) would run the model
# apart from the mirrored steps.
code, body = post(tp2, {"prompt": "repeat abc:", "max_tokens": 2, "echo": True, "logprobs": 1})
assert code == 400 and "serve.tp" in body, (code, body)
print("the tensor-parallel server answers as one process's")
PY
kill -TERM "$ONE_PID" "$TP2_PID"
for p in "$ONE_PID" "$TP2_PID"; do
  for _ in $(seq 200); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$p" 2>/dev/null && fail "a server did not stop within 20 s of SIGTERM"
done
# (mpirun exits non-zero when it is signalled, as OpenMPI does, however its
# ranks end.)
wait "$TP2_PID" || true
grep -q "nekton serve: stopped" "$WORK/tp2.log" || fail "the tensor-parallel server did not stop cleanly"
grep -q "POST /v1/completions 200 prompt_tokens=11 completion_tokens=240 " "$WORK/tp2.log" &&
  fail "the stream whose client hung up ran to its end"
! grep -q "nekton rank" "$WORK/tp2.log" || fail "a rank of the tensor-parallel server failed"

# A rank that hangs: the request waiting on it fails (500) naming it within
# serve.timeout_s, and the whole job ends rather than serve on out of step.
TIMEOUT=5 start hung "$NK" serve --nproc 2 --model "$M" serve.tp=2
R1=""
for p in $(pgrep -P "$PID"); do
  tr '\0' '\n' <"/proc/$p/environ" | grep -qx OMPI_COMM_WORLD_RANK=1 && R1=$p
done
[[ -n $R1 ]] || fail "no rank 1 under the server's mpirun"
kill -STOP "$R1"
code=$(curl -s -o "$WORK/hung.json" -w '%{http_code}' -m 60 "localhost:$PORT/v1/completions" \
  -H 'Content-Type: application/json' -d '{"prompt": "repeat abc:", "max_tokens": 8}')
[[ $code == 500 ]] && grep -q "missing rank 1" "$WORK/hung.json" ||
  fail "a hung rank 1 gave $code: $(cat "$WORK/hung.json")"
for _ in $(seq 300); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
kill -0 "$PID" 2>/dev/null && fail "the job did not end after rank 1 hung"
kill -KILL "$R1" 2>/dev/null || true
grep -q "the tensor-parallel group cannot go on" "$WORK/hung.log" ||
  fail "the job ended without saying why"

# With the repository's guardrails (none of them runs the model) it serves too.
start rails "$NK" serve --nproc 2 --model "$M" serve.tp=2 \
  "serve.guardrails.config=$REPO/configs/guardrails.yaml"
curl -sf "localhost:$PORT/v1/completions" -H 'Content-Type: application/json' \
  -d '{"prompt": "repeat abc:", "max_tokens": 8, "temperature": 0}' | grep -q '"text"' ||
  fail "the tensor-parallel server with guardrails did not answer"
kill -TERM "$PID"
wait "$PID" || true
grep -q "nekton serve: stopped" "$WORK/rails.log" || fail "the server with guardrails did not stop"

# With a LoRA adapter (serve.adapter; trained hard enough to move the
# answers), each rank its slice of it; quantised as it loads
# (serve.quantize=q8_0) and a q8_0 GGUF file, each rank its share: the same
# completions as one process with the same model and key.
run lora "$NK" finetune "${SFT_ARGS[@]}" train.steps=3 train.lr=3e-2 train.init_from="$M" \
  peft.method=lora peft.target_modules=all-linear
"$NK" export gguf --tokenizer bytes "$M" "$WORK/m.gguf" --type q8_0 >"$WORK/gguf.log" 2>&1 ||
  fail "export gguf: $(tail -3 "$WORK/gguf.log")"
for case in "$M serve.adapter=$WORK/lora/adapter" "$M serve.quantize=q8_0" \
  "$WORK/m.gguf serve.quantize=none"; do
  read -r model key <<<"$case"
  start one_key "$NK" serve --model "$model" "$key"
  ONE=$PORT ONE_PID=$PID
  start tp2_key "$NK" serve --nproc 2 --model "$model" serve.tp=2 "$key"
  /usr/bin/python3 - "$ONE" "$PORT" "$case" <<'PY' || fail "serve.tp=2 with $case answers otherwise than one process"
import json, sys, urllib.request
def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())["choices"][0]
# q8_0 quantises the activations too: a last-bit difference in a partial sum
# can round one of them to the next step (generate_tp_ranks.sh): greedy, 2e-2.
quantized = "quantize=q8_0" in sys.argv[3] or ".gguf" in sys.argv[3]
body = {"prompt": "say hi", "max_tokens": 16, "temperature": 0 if quantized else 1.0, "seed": 7,
        "logprobs": 1}
a, b = post(sys.argv[1], body), post(sys.argv[2], body)
assert a["text"] == b["text"], (a["text"], b["text"])
lp = lambda c: c["logprobs"]["token_logprobs"]
tol = 2e-2 if quantized else 1e-4
assert all(abs(p - q) <= tol for p, q in zip(lp(a), lp(b))), (lp(a), lp(b))
PY
  echo "with $case: the same completion as one process"
  kill -TERM "$ONE_PID" "$PID"
  wait "$PID" || true
  wait "$ONE_PID" || true
done

refused_cmd no_ranks "serve.tp = 2: launch 2 processes" "$NK" serve --model "$M" serve.tp=2
refused_cmd nproc_tp "--nproc 2: nekton serve runs one tensor-parallel group" \
  "$NK" serve --nproc 2 --model "$M"
sed 's/length_per_perplexity: false/length_per_perplexity: true/' "$REPO/configs/guardrails.yaml" \
  >"$WORK/rails.yaml"
refused_cmd rails_tp "serve.tp = 2: not supported yet with the jailbreak perplexity checks" \
  "$NK" serve --nproc 2 --model "$M" serve.tp=2 "serve.guardrails.config=$WORK/rails.yaml"
pass "nekton serve split over 2 tensor-parallel ranks answers as one process's (greedy, seeded, n, logprobs, streamed, concurrent, a cancelled stream); SIGTERM stops it; a hung rank ends the job; with a LoRA adapter, q8_0 and a GGUF file; refusals name the key"
