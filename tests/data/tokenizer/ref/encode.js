// Reference encoder for the BPE parity tests: reads documents from a binary
// file (each: u32 little-endian byte length, bytes), decodes each as UTF-8 the
// way Node does (U+FFFD per maximal invalid subpart), encodes it with the
// reference library and writes, per document, u32 count then u32 ids.
//   node encode.js tiktoken <encoding> IN OUT     (encode_ordinary)
//   node encode.js gpt-3-encoder gpt2 IN OUT
//   node encode.js tiktoken-dir DIR IN OUT     (a vocabulary saved by Nekton:
//                                               DIR/vocab.tiktoken + tokenizer.json)
'use strict';
const fs = require('fs');
const path = require('path');
const [lib, encoding, inPath, outPath] = process.argv.slice(2);
const assets = process.env.NEKTON_ASSETS || path.join(__dirname, '..', '..', '..', 'assets');
const mods = path.join(assets, 'npm', 'node_modules');

let encode;
if (lib === 'tiktoken') {
  const enc = require(path.join(mods, 'tiktoken')).get_encoding(encoding);
  encode = (s) => enc.encode_ordinary(s);
} else if (lib === 'tiktoken-dir') {
  const meta = JSON.parse(fs.readFileSync(path.join(encoding, 'tokenizer.json'), 'utf8'));
  const specials = {};
  for (const s of meta.specials) specials[s.text] = s.id;
  const {Tiktoken} = require(path.join(mods, 'tiktoken'));
  const enc = new Tiktoken(fs.readFileSync(path.join(encoding, 'vocab.tiktoken'), 'utf8'),
                           specials, meta.pattern);
  encode = (s) => enc.encode_ordinary(s);
} else if (lib === 'gpt-3-encoder') {
  const g = require(path.join(mods, 'gpt-3-encoder'));
  encode = (s) => g.encode(s);
} else {
  throw new Error('unknown library ' + lib);
}

const buf = fs.readFileSync(inPath);
const chunks = [];
for (let off = 0; off < buf.length;) {
  const n = buf.readUInt32LE(off);
  off += 4;
  const ids = encode(buf.subarray(off, off + n).toString('utf8'));
  off += n;
  const out = Buffer.alloc(4 + 4 * ids.length);
  out.writeUInt32LE(ids.length, 0);
  for (let i = 0; i < ids.length; i++) out.writeUInt32LE(ids[i], 4 + 4 * i);
  chunks.push(out);
}
fs.writeFileSync(outPath, Buffer.concat(chunks));
