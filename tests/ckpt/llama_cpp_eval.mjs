// Runs a GGUF file through llama.cpp (the prebuilt CPU build that the npm
// package node-llama-cpp ships; scripts/fetch_assets.sh --test installs it) and
// prints JSON for the GGUF export tests:
//   logits     f32 logits after each prompt token (llama.cpp's own forward pass)
//   greedy     N_GEN tokens continuing the prompt, each the argmax of llama.cpp's logits
//   tokenized  llama.cpp's tokenization of TEXT (no BOS, specials as text)
//   detokenized  the text of `tokenized` as llama.cpp spells it back
//   n_vocab    the vocabulary size llama.cpp read
// usage: node llama_cpp_eval.mjs NODE_MODULES FILE.gguf ID,ID,... N_GEN TEXT
import {pathToFileURL} from "node:url";

const [modules, gguf, idList, nGenArg, text] = process.argv.slice(2);
const {getLlama} = await import(pathToFileURL(`${modules}/node-llama-cpp/dist/index.js`).href);

const llama = await getLlama({gpu: false, build: "never", logLevel: "error", progressLogs: false});
const model = await llama.loadModel({modelPath: gguf, gpuLayers: 0});
const prompt = idList.split(",").map(Number);
const nGen = Number(nGenArg);
const context = await model.createContext({
  contextSize: Math.max(32, prompt.length + nGen + 1),
  batchSize: Math.max(32, prompt.length),
  sequences: 1,
  threads: 2,
  flashAttention: false,
  // f32 cache: the comparison measures the weights, not llama.cpp's default f16 cache.
  experimentalKvCacheKeyType: "F32",
  experimentalKvCacheValueType: "F32",
});
const seq = context.getSequence();

function dense(logitsMap, n) {
  const row = new Array(n).fill(null);
  for (const [tok, v] of logitsMap) row[tok] = v;
  return row;
}

const outs = await seq.controlledEvaluate(prompt.map((t) => [t, {generateNext: {logits: true}}]));
let n = 0;
for (const o of outs) for (const [tok] of o.next.logits) n = Math.max(n, tok + 1);
const logits = outs.map((o) => dense(o.next.logits, n));

function argmax(row) {
  let best = 0;
  for (let i = 1; i < row.length; ++i) if (row[i] > row[best]) best = i;
  return best;
}
const greedy = [];
let last = logits[logits.length - 1];
for (let i = 0; i < nGen; ++i) {
  const tok = argmax(last);
  greedy.push(tok);
  if (i + 1 === nGen) break;
  const [o] = await seq.controlledEvaluate([[tok, {generateNext: {logits: true}}]]);
  last = dense(o.next.logits, n);
}

let tokenized = null, detokenized = null;
if (text !== undefined && text !== "") {
  tokenized = Array.from(model.tokenize(text, false));
  detokenized = model.detokenize(tokenized);
}
console.log(JSON.stringify({n_vocab: n, logits, greedy, tokenized, detokenized}));
await context.dispose();
await model.dispose();
await llama.dispose();
