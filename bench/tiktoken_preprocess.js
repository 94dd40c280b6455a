// Reference for bench/run_preprocess_bench.sh: the tokenizing core of a
// preprocess run done with tiktoken (WASM) in Node, one thread: read a JSONL
// file, parse each line, encode the "text" field with encode_ordinary, count
// tokens plus one end-of-document token per document. Writes nothing, so it is
// a lower bound on the time a JS/WASM preprocess would take.
//   node bench/tiktoken_preprocess.js FILE.jsonl [encoding]
'use strict';
const fs = require('fs');
const path = require('path');
const assets = process.env.NEKTON_ASSETS || path.join(__dirname, '..', 'assets');
const { get_encoding } = require(path.join(assets, 'npm', 'node_modules', 'tiktoken'));
const [file, encoding = 'gpt2'] = process.argv.slice(2);
const enc = get_encoding(encoding);
const t0 = process.hrtime.bigint();
const buf = fs.readFileSync(file);
let docs = 0, tokens = 0;
for (let at = 0; at < buf.length;) {
  let nl = buf.indexOf(10, at);
  if (nl < 0) nl = buf.length;
  if (nl > at) {
    const text = JSON.parse(buf.toString('utf8', at, nl)).text;
    tokens += enc.encode_ordinary(text).length + 1;
    docs++;
  }
  at = nl + 1;
}
const s = Number(process.hrtime.bigint() - t0) / 1e9;
console.log(`tiktoken-wasm ${encoding}: ${docs} documents, ${tokens} tokens, ` +
            `${(buf.length / 1e6).toFixed(1)} MB in ${s.toFixed(2)} s: ` +
            `${(buf.length / s / 1e6).toFixed(1)} MB/s (1 thread)`);
