// tiktoken (OpenAI's Rust core as WASM) encode throughput in Node, one thread,
// on the corpus written by `bench_tokenizer --corpus-out FILE`. Same timing as
// bench_tokenizer: best of N passes over all documents after one warm-up pass.
//   node bench/tiktoken_bench.js CORPUS [reps] [encodings...]
'use strict';
const fs = require('fs');
const path = require('path');
const [corpusPath, repsArg, ...names] = process.argv.slice(2);
const reps = Number(repsArg || 5);
const encodings = names.length ? names : ['gpt2', 'cl100k_base', 'o200k_base'];
const assets = process.env.NEKTON_ASSETS || path.join(__dirname, '..', 'assets');
const { get_encoding } = require(path.join(assets, 'npm', 'node_modules', 'tiktoken'));

const buf = fs.readFileSync(corpusPath);
const docs = [];
for (let off = 0; off < buf.length;) {
  const n = buf.readUInt32LE(off);
  docs.push(buf.subarray(off + 4, off + 4 + n).toString('utf8'));
  off += 4 + n;
}
const bytes = buf.length - 4 * docs.length;

for (const name of encodings) {
  const enc = get_encoding(name);
  let best = Infinity, cold = 0, tokens = 0;
  for (let r = 0; r < reps + 1; r++) {
    const t0 = process.hrtime.bigint();
    tokens = 0;
    for (const d of docs) tokens += enc.encode_ordinary(d).length;
    const s = Number(process.hrtime.bigint() - t0) / 1e9;
    if (r === 0) cold = s;
    if (r > 0 && s < best) best = s;
  }
  enc.free();
  console.log(JSON.stringify({ impl: 'tiktoken-wasm', encoding: name, docs: docs.length, bytes,
    tokens, seconds: Number(best.toFixed(4)), MB_per_s: Number((bytes / best / 1e6).toFixed(2)),
    cold_MB_per_s: Number((bytes / cold / 1e6).toFixed(2)) }));
}
