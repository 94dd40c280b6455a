// llama.cpp's speed on a GGUF file, through the prebuilt CPU build that the
// npm package node-llama-cpp ships (scripts/fetch_assets.sh --test installs it):
//   pp   prompt processing: PROMPT random tokens evaluated in one call, tokens/s
//   tg   decode at batch 1: NEW greedy tokens after that prompt, tokens/s
//        (time after the first generated token, over NEW - 1 steps)
//   par  aggregate throughput with S parallel sequences in one context
//        (llama.cpp batches them into one evaluation per step): S prompts of
//        PROMPT tokens, then NEW greedy tokens each; S x NEW generated tokens
//        over the whole time, prefill included
// Prints one JSON line per measurement. Threads as given (both sides of a
// comparison get the same). KV cache f16 (llama.cpp's default) unless
// KV=f32. usage:
//   node llama_cpp_bench.mjs NODE_MODULES FILE.gguf THREADS PROMPT NEW [S,S,...]
import {pathToFileURL} from "node:url";

const [modules, gguf, threadsArg, promptArg, newArg, parArg] = process.argv.slice(2);
const {getLlama} = await import(pathToFileURL(`${modules}/node-llama-cpp/dist/index.js`).href);
const threads = Number(threadsArg), P = Number(promptArg), N = Number(newArg);
const parallel = (parArg ?? "").split(",").filter((s) => s !== "").map(Number);

const llama = await getLlama({gpu: false, build: "never", logLevel: "error", progressLogs: false,
                              maxThreads: threads});
const model = await llama.loadModel({modelPath: gguf, gpuLayers: 0});
let seed = 7;
function randomPrompt() {
  const out = [];
  for (let i = 0; i < P; ++i) {
    seed = (seed * 1103515245 + 12345) % 2147483648;
    out.push(1 + (seed % 255));  // ids 1..255: in any vocabulary
  }
  return out;
}

async function makeContext(sequences) {
  const kv = process.env.KV === "f32" ? "F32" : undefined;
  return await model.createContext({
    contextSize: sequences * (P + N + 8),
    batchSize: Math.max(P, 512),
    sequences,
    threads: {ideal: threads, min: threads},
    flashAttention: false,
    ...(kv ? {experimentalKvCacheKeyType: kv, experimentalKvCacheValueType: kv} : {}),
  });
}

// Greedy decoding of n tokens after `prompt` on `seq`; returns the time of the
// first generated token and of the last.
async function decode(seq, prompt, n) {
  let first = 0, count = 0;
  for await (const tok of seq.evaluate(prompt, {temperature: 0})) {
    void tok;
    if (++count === 1) first = performance.now();
    if (count >= n) break;
  }
  return {first, last: performance.now(), count};
}

{
  const ctx = await makeContext(1);
  const seq = ctx.getSequence();
  // Warm-up (weights paged in, threads started).
  await seq.evaluateWithoutGeneratingNewTokens(randomPrompt().slice(0, 16));
  await seq.clearHistory();
  const prompt = randomPrompt();
  let t0 = performance.now();
  await seq.evaluateWithoutGeneratingNewTokens(prompt);
  const pp = P / ((performance.now() - t0) / 1000);
  await seq.clearHistory();
  const d = await decode(seq, prompt, N);
  const tg = (d.count - 1) / ((d.last - d.first) / 1000);
  console.log(JSON.stringify({engine: "llama.cpp", file: gguf, threads, prompt: P, pp_tok_s: pp,
                              new: N, tg_tok_s: tg}));
  await ctx.dispose();
}

for (const S of parallel) {
  const ctx = await makeContext(S);
  const seqs = Array.from({length: S}, () => ctx.getSequence());
  const t0 = performance.now();
  const runs = await Promise.all(seqs.map((s) => decode(s, randomPrompt(), N)));
  const lastAll = Math.max(...runs.map((r) => r.last));
  let tokens = 0;
  for (const r of runs) tokens += r.count;
  console.log(JSON.stringify({engine: "llama.cpp", file: gguf, threads, sequences: S, prompt: P,
                              new: N, aggregate_tok_s: tokens / ((lastAll - t0) / 1000)}));
  await ctx.dispose();
}
await model.dispose();
await llama.dispose();
