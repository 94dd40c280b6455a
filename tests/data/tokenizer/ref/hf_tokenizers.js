// Hugging Face tokenizer.json files for the parity tests, and Hugging Face's
// JavaScript tokenizers (@huggingface/tokenizers) as the reference encoder.
//   node hf_tokenizers.js llama3 RANKS.tiktoken OUT_DIR [REGEX]
//       a Llama-3-style folder from tiktoken ranks (id = rank): every split of
//       a token into two tokens a merge ("a b" strings, in the order of the
//       tokens made, then of the parts' ranks), a Split of the Llama 3 regex
//       (or REGEX) then ByteLevel without its own regex, ignore_merges; after
//       the ranks three tokens no merge makes (kWholeOnly), then Llama 3's 256
//       added special tokens; tokenizer_config.json names <|begin_of_text|>
//       and <|end_of_text|>
//   node hf_tokenizers.js qwen RANKS.tiktoken OUT_DIR [NORMALIZER_JSON]
//       a Qwen2-style folder from the same ranks: normalizer NFC (or the JSON
//       given), Qwen2's Split regex then ByteLevel, ignore_merges false, the
//       added tokens <|endoftext|>, <|im_start|>, <|im_end|> (normalized
//       false) and one normalized added token, "Añadido" (so that the
//       normalizer's handling of added tokens is compared too)
//   node hf_tokenizers.js gpt2 ENCODER.json VOCAB.bpe OUT_DIR
//       a GPT-2-style folder from GPT-2's files: merges as ["a", "b"] pairs,
//       ByteLevel with GPT-2's regex, <|endoftext|> added
//   node hf_tokenizers.js spm STYLE PIECES.tsv OUT_DIR
//       a SentencePiece-style BPE folder from a SentencePiece BPE model's
//       pieces ("piece\tscore\ttype" lines in id order, type one of normal,
//       unknown, control, user, unused, byte), converted as transformers'
//       convert_slow_tokenizer does (merges: every split of a piece into two
//       pieces, by the piece's score, then the lengths of the parts; byte
//       fallback, fuse_unk, unk_token; control and user pieces added tokens,
//       normalized false). STYLE:
//         llama     Llama 2 / Mistral (legacy): normalizer Prepend "▁" then
//                   Replace " " -> "▁", no pre-tokenizer, merges "a b"
//         metaspace Llama 2 by recent transformers, Phi-3: no normalizer,
//                   Metaspace {prepend_scheme first, split false}
//         gemma     Gemma 2/3: normalizer Replace only, Split " "
//                   MergedWithPrevious, "\t" for <0x09>, no Strip decoder,
//                   merges ["a", "b"], user pieces special
//   node hf_tokenizers.js encode_decode DIR IN OUT
//       as encode (no round-trip check), each ids line followed by a line
//       with the JSON string of their decode (skip_special_tokens false)
//   node hf_tokenizers.js encode DIR IN OUT
//       encodes each document of IN (u32 little-endian byte length, bytes;
//       decoded as UTF-8 the way Node does) without added bos/eos, writes a
//       line of ids (separated by spaces) per document, and fails unless
//       decoding the ids gives the document back (normalized, when the
//       tokenizer has a normalizer and the document no added token)
'use strict';
const fs = require('fs');
const path = require('path');

const assets = process.env.NEKTON_ASSETS || path.join(__dirname, '..', '..', '..', '..', 'assets');
const mods = path.join(assets, 'npm', 'node_modules');
const kLlama3Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

const kQwen2Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

const kWholeOnly = [' qzxqzxqzx', ' Xyzzyplugh', ' kwyjibo'];

// GPT-2's byte -> printable character table: printable Latin-1 stands for
// itself, the other bytes take U+0100 onwards in byte order.
const byteChar = (() => {
  const out = new Array(256);
  let next = 256;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
    out[b] = String.fromCodePoint(printable ? b : next++);
  }
  return out;
})();
const spell = (buf) => Array.from(buf, (b) => byteChar[b]).join('');

function writeFolder(dir, tokenizer, config) {
  fs.mkdirSync(dir, {recursive: true});
  fs.writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify(tokenizer));
  fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify(config, null, 2));
}

// The vocabulary and merges of tiktoken ranks (id = rank), in GPT-2's spelling:
// every split of a token into two tokens a merge, in the order of the tokens
// made, then of the parts' ranks.
function bpeFromRanks(ranksPath) {
  const ranks = new Map();  // token bytes as a latin1 string -> rank
  for (const line of fs.readFileSync(ranksPath, 'utf8').split('\n')) {
    if (!line) continue;
    const [b64, r] = line.split(' ');
    ranks.set(Buffer.from(b64, 'base64').toString('latin1'), Number(r));
  }
  const vocab = {};
  const merges = [];
  const byRank = [...ranks.entries()].sort((x, y) => x[1] - y[1]);
  for (const [tok, rank] of byRank) {
    vocab[spell(Buffer.from(tok, 'latin1'))] = rank;
    const splits = [];
    for (let i = 1; i < tok.length; i++) {
      const l = tok.slice(0, i), r = tok.slice(i);
      if (ranks.has(l) && ranks.has(r)) splits.push([l, r]);
    }
    splits.sort((x, y) => ranks.get(x[0]) - ranks.get(y[0]) || ranks.get(x[1]) - ranks.get(y[1]));
    for (const [l, r] of splits)
      merges.push(spell(Buffer.from(l, 'latin1')) + ' ' + spell(Buffer.from(r, 'latin1')));
  }
  return {vocab, merges, size: byRank.length};
}

function llama3(ranksPath, outDir, regex) {
  const {vocab, merges, size} = bpeFromRanks(ranksPath);
  // Tokens no merge makes (no split of them is two tokens): only ignore_merges
  // emits them, for a piece that is exactly one of them.
  let base = size;
  for (const t of kWholeOnly) vocab[spell(Buffer.from(t, 'utf8'))] = base++;
  // Llama 3's specials: named ones where Llama 3 has them, reserved ones between.
  const named = {0: 'begin_of_text', 1: 'end_of_text', 6: 'start_header_id', 7: 'end_header_id',
                 8: 'eom_id', 9: 'eot_id', 10: 'python_tag'};
  const added = [];
  let reserved = 0;
  for (let i = 0; i < 256; i++) {
    const content = named[i] ? `<|${named[i]}|>` : `<|reserved_special_token_${reserved++}|>`;
    added.push({id: base + i, content, single_word: false, lstrip: false, rstrip: false,
                normalized: false, special: true});
  }
  const tokenizer = {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: added,
    normalizer: null,
    pre_tokenizer: {
      type: 'Sequence',
      pretokenizers: [
        {type: 'Split', pattern: {Regex: regex || kLlama3Regex}, behavior: 'Isolated',
         invert: false},
        {type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false},
      ],
    },
    post_processor: {
      type: 'Sequence',
      processors: [
        {type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true},
        {
          type: 'TemplateProcessing',
          single: [{SpecialToken: {id: '<|begin_of_text|>', type_id: 0}},
                   {Sequence: {id: 'A', type_id: 0}}],
          pair: [{SpecialToken: {id: '<|begin_of_text|>', type_id: 0}},
                 {Sequence: {id: 'A', type_id: 0}},
                 {SpecialToken: {id: '<|begin_of_text|>', type_id: 1}},
                 {Sequence: {id: 'B', type_id: 1}}],
          special_tokens: {
            '<|begin_of_text|>': {id: '<|begin_of_text|>', ids: [base], tokens: ['<|begin_of_text|>']},
          },
        },
      ],
    },
    decoder: {type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true},
    model: {
      type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null,
      end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, ignore_merges: true,
      vocab, merges,
    },
  };
  writeFolder(outDir, tokenizer, {
    bos_token: '<|begin_of_text|>',
    eos_token: '<|end_of_text|>',
    clean_up_tokenization_spaces: true,
    model_max_length: 131072,
    tokenizer_class: 'PreTrainedTokenizerFast',
  });
}

function qwen(ranksPath, outDir, normalizer) {
  const {vocab, merges, size} = bpeFromRanks(ranksPath);
  const added = ['<|endoftext|>', '<|im_start|>', '<|im_end|>'].map(
      (content, i) => ({id: size + i, content, single_word: false, lstrip: false, rstrip: false,
                        normalized: false, special: true}));
  added.push({id: size + 3, content: 'A\u00f1adido', single_word: false, lstrip: false,
              rstrip: false, normalized: true, special: false});
  const tokenizer = {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: added,
    normalizer: normalizer ? JSON.parse(normalizer) : {type: 'NFC'},
    pre_tokenizer: {
      type: 'Sequence',
      pretokenizers: [
        {type: 'Split', pattern: {Regex: kQwen2Regex}, behavior: 'Isolated', invert: false},
        {type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false},
      ],
    },
    post_processor: {type: 'ByteLevel', add_prefix_space: false, trim_offsets: false,
                     use_regex: false},
    decoder: {type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false},
    model: {
      type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: '',
      end_of_word_suffix: '', fuse_unk: false, byte_fallback: false, ignore_merges: false,
      vocab, merges,
    },
  };
  writeFolder(outDir, tokenizer, {
    bos_token: null,
    eos_token: '<|im_end|>',
    pad_token: '<|endoftext|>',
    model_max_length: 131072,
    tokenizer_class: 'Qwen2Tokenizer',
  });
}

function gpt2(encoderPath, mergesPath, outDir) {
  const vocab = JSON.parse(fs.readFileSync(encoderPath, 'utf8'));
  const merges = fs.readFileSync(mergesPath, 'utf8').split('\n')
                     .filter((l, i) => l && !(i === 0 && l.startsWith('#version')))
                     .map((l) => l.split(' '));
  const byteLevel = {type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true};
  const tokenizer = {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: [{id: vocab['<|endoftext|>'], content: '<|endoftext|>', single_word: false,
                    lstrip: false, rstrip: false, normalized: true, special: true}],
    normalizer: null,
    pre_tokenizer: byteLevel,
    post_processor: {...byteLevel, trim_offsets: false},
    decoder: byteLevel,
    model: {
      type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: '',
      end_of_word_suffix: '', fuse_unk: false, byte_fallback: false, ignore_merges: false,
      vocab, merges,
    },
  };
  writeFolder(outDir, tokenizer, {
    bos_token: '<|endoftext|>', eos_token: '<|endoftext|>', unk_token: '<|endoftext|>',
    model_max_length: 1024, tokenizer_class: 'GPT2Tokenizer',
  });
}

function spm(style, piecesPath, outDir) {
  const pieces = fs.readFileSync(piecesPath, 'utf8').split('\n').filter((l) => l).map((l) => {
    const [piece, score, type] = l.split('\t');
    return {piece, score: Number(score), type};
  });
  if (style === 'gemma')
    for (const p of pieces) if (p.piece === '<0x09>') p.piece = '\t';
  const vocab = {};
  pieces.forEach((p, id) => { vocab[p.piece] = id; });
  const all = [];
  for (const p of pieces) {
    const chars = Array.from(p.piece);
    const local = [];
    for (let i = 1; i < chars.length; i++) {
      const l = chars.slice(0, i).join(''), r = chars.slice(i).join('');
      if (l in vocab && r in vocab) local.push({l, r, score: p.score});
    }
    local.sort((x, y) => vocab[x.l] - vocab[y.l] || vocab[x.r] - vocab[y.r]);
    all.push(...local);
  }
  const len = (s) => Array.from(s).length;
  all.sort((x, y) => y.score - x.score || len(y.l) - len(x.l) || len(y.r) - len(x.r));
  const merges = all.map((m) => (style === 'gemma' ? [m.l, m.r] : m.l + ' ' + m.r));
  const added = [];
  pieces.forEach((p, id) => {
    if (p.type === 'unknown' || p.type === 'control' || p.type === 'user')
      added.push({id, content: p.piece, single_word: false, lstrip: false, rstrip: false,
                  normalized: false, special: p.type !== 'user' || style === 'gemma'});
  });
  const unk = pieces.find((p) => p.type === 'unknown').piece;
  const replace = {type: 'Replace', pattern: {String: ' '}, content: '\u2581'};
  const decoders = [{type: 'Replace', pattern: {String: '\u2581'}, content: ' '},
                    {type: 'ByteFallback'}, {type: 'Fuse'}];
  if (style !== 'gemma') decoders.push({type: 'Strip', content: ' ', start: 1, stop: 0});
  const tokenizer = {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: added,
    normalizer: style === 'llama'
        ? {type: 'Sequence', normalizers: [{type: 'Prepend', prepend: '\u2581'}, replace]}
        : style === 'gemma' ? replace : null,
    pre_tokenizer: style === 'metaspace'
        ? {type: 'Metaspace', replacement: '\u2581', prepend_scheme: 'first', split: false}
        : style === 'gemma'
        ? {type: 'Split', pattern: {String: ' '}, behavior: 'MergedWithPrevious', invert: false}
        : null,
    post_processor: null,
    decoder: {type: 'Sequence', decoders},
    model: {
      type: 'BPE', dropout: null, unk_token: unk, continuing_subword_prefix: null,
      end_of_word_suffix: null, fuse_unk: true, byte_fallback: true, ignore_merges: false,
      vocab, merges,
    },
  };
  writeFolder(outDir, tokenizer, {
    bos_token: '<s>', eos_token: '</s>', unk_token: unk, add_bos_token: true,
    legacy: style === 'llama', tokenizer_class: 'LlamaTokenizerFast',
  });
}

function encodeDecode(dir, inPath, outPath) {
  const {Tokenizer} = require(path.join(mods, '@huggingface', 'tokenizers', 'dist', 'tokenizers.cjs'));
  const read = (f) => JSON.parse(fs.readFileSync(path.join(dir, f), 'utf8'));
  const tok = new Tokenizer(read('tokenizer.json'), read('tokenizer_config.json'));
  const buf = fs.readFileSync(inPath);
  const lines = [];
  for (let off = 0; off < buf.length;) {
    const n = buf.readUInt32LE(off);
    off += 4;
    const text = buf.subarray(off, off + n).toString('utf8');
    off += n;
    const ids = tok.encode(text, {add_special_tokens: false}).ids;
    const back = ids.length === 0 ? '' :
        tok.decode(ids, {skip_special_tokens: false, clean_up_tokenization_spaces: false});
    lines.push(ids.join(' ') + '\n' + JSON.stringify(back) + '\n');
  }
  fs.writeFileSync(outPath, lines.join(''));
}

function encode(dir, inPath, outPath) {
  const {Tokenizer} = require(path.join(mods, '@huggingface', 'tokenizers', 'dist', 'tokenizers.cjs'));
  const read = (f) => JSON.parse(fs.readFileSync(path.join(dir, f), 'utf8'));
  const tok = new Tokenizer(read('tokenizer.json'), read('tokenizer_config.json'));
  const buf = fs.readFileSync(inPath);
  const lines = [];
  let doc = 0, bad = 0;
  for (let off = 0; off < buf.length; doc++) {
    const n = buf.readUInt32LE(off);
    off += 4;
    const text = buf.subarray(off, off + n).toString('utf8');
    off += n;
    const ids = tok.encode(text, {add_special_tokens: false}).ids;
    const plain = !tok.added_tokens.some((a) => text.includes(a.content));
    const want = tok.normalizer === null ? text : plain ? tok.normalizer(text) : null;
    if (ids.length > 0 && want !== null &&
        tok.decode(ids, {skip_special_tokens: false, clean_up_tokenization_spaces: false}) !== want &&
        bad++ < 5)
      console.error(`document ${doc}: decoding its ids does not give it back`);
    lines.push(ids.join(' ') + '\n');
  }
  fs.writeFileSync(outPath, lines.join(''));
  if (bad) {
    console.error(`${bad} documents do not round-trip`);
    process.exit(1);
  }
}

const [cmd, ...args] = process.argv.slice(2);
if (cmd === 'llama3') llama3(args[0], args[1], args[2]);
else if (cmd === 'qwen') qwen(args[0], args[1], args[2]);
else if (cmd === 'gpt2') gpt2(args[0], args[1], args[2]);
else if (cmd === 'spm') spm(args[0], args[1], args[2]);
else if (cmd === 'encode_decode') encodeDecode(args[0], args[1], args[2]);
else if (cmd === 'encode') encode(args[0], args[1], args[2]);
else throw new Error('unknown command ' + cmd);
