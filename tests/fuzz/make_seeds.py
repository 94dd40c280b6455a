#!/usr/bin/python3
"""Writes the seed corpus of the fuzz harnesses (tests/fuzz/corpus/<harness>/):
small valid inputs of each format, after the fixtures of the unit tests, so
that the fuzzers start from inputs that get past the first checks. Rerun it
after changing a format; findings' inputs are added to the folders by hand.
SentencePiece's seed is trained with spm_train (Debian's sentencepiece)."""
import base64, gzip, json, os, struct, subprocess, sys, tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ckpt"))
from hf_reference import bytes_to_unicode  # GPT-2's byte alphabet

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
SEP = b"\n--- nk-fuzz next file ---\n"  # kFileSeparator in fuzz_util.h


def put(harness, name, data):
    d = os.path.join(ROOT, harness)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def safetensors(tensors, metadata=None):
    header, blob = {}, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(raw)]}
        blob += raw
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + blob


put("safetensors", "two_tensors", safetensors({
    "wte": ("F32", [2, 3], struct.pack("<6f", *range(6))),
    "ln.bias": ("BF16", [4], b"\x80\x3f" * 4)}, {"format": "pt"}))
put("safetensors", "scalar_and_empty", safetensors({
    "s": ("F16", [], b"\x00\x3c"), "e": ("I32", [0, 5], b"")}))

llama = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
         "num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 2,
         "vocab_size": 1000, "max_position_embeddings": 128, "rms_norm_eps": 1e-6,
         "rope_theta": 500000.0, "torch_dtype": "bfloat16"}
put("hf_config", "llama", json.dumps(llama, indent=2))
put("hf_config", "llama3_scaling", json.dumps(dict(llama, head_dim=8, tie_word_embeddings=True, rope_scaling={
    "factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
    "original_max_position_embeddings": 64, "rope_type": "llama3"}), indent=2))
put("hf_config", "qwen2_yarn", json.dumps(dict(llama, architectures=["Qwen2ForCausalLM"], model_type="qwen2",
    use_sliding_window=False, rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                            "original_max_position_embeddings": 32}), indent=2))
put("hf_config", "mistral", json.dumps(dict(llama, architectures=["MistralForCausalLM"], model_type="mistral",
                                            sliding_window=None), indent=2))
put("hf_config", "gpt2", json.dumps({"architectures": ["GPT2LMHeadModel"], "n_embd": 48, "n_layer": 2,
                                     "n_head": 4, "n_positions": 64, "vocab_size": 300, "n_inner": None,
                                     "activation_function": "gelu_new"}, indent=2))


# A byte-level BPE vocabulary: the 256 bytes, then merges.
B2U = bytes_to_unicode()
MERGES = [(b"h", b"e"), (b"l", b"l"), (b"he", b"ll"), (b" ", b"w"), (b"o", b"r"), (b" w", b"or")]
tokens = [bytes([b]) for b in range(256)] + [a + b for a, b in MERGES]
spell = lambda t: "".join(B2U[b] for b in t)
tiktoken = "".join(f"{base64.b64encode(t).decode()} {i}\n" for i, t in enumerate(tokens))
put("tiktoken", "bytes_and_merges", tiktoken)
put("tiktoken", "with_hole", "".join(f"{base64.b64encode(t).decode()} {i + (i > 200)}\n"
                                     for i, t in enumerate(tokens)))

encoder = {spell(t): i for i, t in enumerate(tokens)}
encoder["<|endoftext|>"] = len(tokens)
vocab_bpe = "#version: 0.2\n" + "".join(f"{spell(a)} {spell(b)}\n" for a, b in MERGES)
put("gpt2_vocab", "gpt2_style", json.dumps(encoder).encode() + SEP + vocab_bpe.encode())

meta = {"type": "bpe", "name": "fuzz", "pattern": r"'s|'t| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+",
        "specials": [{"text": "<|endoftext|>", "id": len(tokens)}], "files": {"ranks": "vocab.tiktoken"}}
put("tokenizer_json", "nekton_bpe", json.dumps(meta, indent=2).encode() + SEP + tiktoken.encode())
# Hugging Face's tokenizer.json of the same vocabulary, with every normalizer
# (the second file, vocab.tiktoken, is not read for it).
hf_normalizer = {"type": "Sequence", "normalizers": [
    {"type": "NFC"}, {"type": "NFKD"}, {"type": "StripAccents"}, {"type": "Lowercase"},
    {"type": "Replace", "pattern": {"Regex": r"\s+"}, "content": " "},
    {"type": "Replace", "pattern": {"String": "ll"}, "content": "l"},
    {"type": "Strip", "strip_left": True, "strip_right": False},
    {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
     "strip_accents": None, "lowercase": False},
    {"type": "Prepend", "prepend": " "}]}
hf_tokenizer = {
    "version": "1.0",
    "added_tokens": [{"id": len(tokens), "content": "<|endoftext|>", "single_word": False,
                      "lstrip": False, "rstrip": False, "normalized": False, "special": True},
                     {"id": len(tokens) + 1, "content": "Hello", "single_word": False,
                      "lstrip": False, "rstrip": False, "normalized": True, "special": False}],
    "normalizer": hf_normalizer,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "dropout": None, "byte_fallback": False, "ignore_merges": False,
              "vocab": {spell(t): i for i, t in enumerate(tokens)},
              "merges": [f"{spell(a)} {spell(b)}" for a, b in MERGES]}}
put("tokenizer_json", "hf_normalizers", json.dumps(hf_tokenizer, indent=1).encode() + SEP)

# A SentencePiece-style BPE (Llama 2 / Mistral legacy shape): byte fallback,
# pieces spelled with "\u2581", Prepend + Replace, Strip decoder; and the
# Metaspace shape (Phi-3) with Gemma's added-token style.
R = "\u2581"
spm_pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + \
    [R, "a", "b", "H", "e", "l", "o", R + "a", R + "H", "ll", "He", "llo", "Hello", R + "Hello"]
spm_merges = [[R, "a"], [R, "H"], ["l", "l"], ["H", "e"], ["ll", "o"], ["He", "llo"], [R, "Hello"]]
spm_decoder = {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": R}, "content": " "}, {"type": "ByteFallback"},
    {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
spm_tokenizer = {
    "version": "1.0",
    "added_tokens": [{"id": i, "content": c, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True}
                     for i, c in enumerate(["<unk>", "<s>", "</s>"])],
    "normalizer": {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": R},
        {"type": "Replace", "pattern": {"String": " "}, "content": R}]},
    "pre_tokenizer": None,
    "decoder": spm_decoder,
    "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "fuse_unk": True,
              "byte_fallback": True, "ignore_merges": False,
              "vocab": {p: i for i, p in enumerate(spm_pieces)},
              "merges": [f"{a} {b}" for a, b in spm_merges]}}
put("tokenizer_json", "hf_spm_llama", json.dumps(spm_tokenizer, indent=1).encode() + SEP)
spm_tokenizer["normalizer"] = None
spm_tokenizer["pre_tokenizer"] = {"type": "Metaspace", "replacement": R,
                                  "prepend_scheme": "first", "split": True}
spm_tokenizer["decoder"] = {"type": "Metaspace", "replacement": R, "prepend_scheme": "first"}
spm_tokenizer["added_tokens"].append({"id": len(spm_pieces), "content": "<start_of_turn>",
                                      "normalized": False, "special": True})
spm_tokenizer["model"]["merges"] = spm_merges
put("tokenizer_json", "hf_spm_metaspace", json.dumps(spm_tokenizer, indent=1).encode() + SEP)

# Megatron .idx/.bin: 3 sequences in 2 documents, u16 and i32 tokens.
def indexed(code, size, seqs, doc_idx):
    fmt = {2: "<H", 4: "<i"}[size]
    bin_, offsets, off = b"", [], 0
    for s in seqs:
        offsets.append(off)
        for t in s:
            bin_ += struct.pack(fmt, t)
        off += size * len(s)
    idx = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, code, len(seqs), len(doc_idx))
    idx += struct.pack(f"<{len(seqs)}i", *map(len, seqs)) + struct.pack(f"<{len(seqs)}q", *offsets)
    idx += struct.pack(f"<{len(doc_idx)}q", *doc_idx)
    return idx + SEP + bin_


put("megatron_idx", "u16", indexed(8, 2, [[1, 2, 3], [4], [5, 6]], [0, 2, 3]))
put("megatron_idx", "i32", indexed(4, 4, [[70000, 2], [], [9]], [0, 1, 3]))

put("jsonl", "plain", '{"text": "hello", "id": 1}\n{"text": "caf\\u00e9 \\ud83d\\ude00"}\n'
                      '{"id": 2}\n{"text": 3}\nnot json\n{"text": "no newline at the end"}')
put("jsonl", "crlf_and_blank", '{"text": "a"}\r\n\r\n{"text": "b", "nested": {"text": "x"}}\n')
try:
    zst = subprocess.run(["zstd", "-q", "-c"], input=b'{"text": "compressed"}\n' * 4,
                         capture_output=True, check=True).stdout
    put("jsonl", "zstd", zst)
except (OSError, subprocess.CalledProcessError):
    print("zstd not found: no zstd seed", file=sys.stderr)

put("html", "article", """<!DOCTYPE html><html><head><title>T</title><style>p{}</style></head>
<body><nav><a href="/">Home</a> <a href="/a">About</a></nav>
<main><h1>Heading &amp; more</h1><p>First <b>bold</b> paragraph.<br>Line two.</p>
<ul><li>one</li><li>two</li></ul><table><tr><td>a</td><td>b</td></tr></table>
<pre>  verbatim
  text</pre><div hidden>secret</div><div class="cookie-banner">cookies</div></main>
<footer>(c) 2024</footer><script>var x = 1;</script></body></html>
""")
put("html", "broken", "<p>unclosed <b>bold <i>nest</p><table><td>cell<tr>&#x1F600; &bogus; \xff")


def warc_record(version, wtype, uri, block, content_type="application/http; msgtype=response"):
    head = (f"WARC/{version}\r\nWARC-Type: {wtype}\r\nWARC-Record-ID: <urn:uuid:{wtype}-{len(block)}>\r\n"
            f"WARC-Date: 2024-03-01T12:00:00Z\r\nWARC-Target-URI: {uri}\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(block)}\r\n\r\n").encode()
    return head + block + b"\r\n\r\n"


def http(status, content_type, body, extra=b""):
    return (f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n".encode() + extra +
            f"Content-Length: {len(body)}\r\n\r\n".encode() + body)


cp1251 = "<html><body><p>Привет, мир. Летним утром старый рыбак вышел из дома.</p></body></html>".encode("cp1251")
sjis = "<meta charset=shift_jis><p>朝早く、私は駅まで歩いて行きました。</p>".encode("shift_jis")
warc_recs = [
    warc_record("1.0", "warcinfo", "", b"software: seeds\r\n", "application/warc-fields"),
    warc_record("1.0", "request", "<http://a/>", b"GET / HTTP/1.1\r\n\r\n", "application/http; msgtype=request"),
    warc_record("1.0", "response", "<http://a/>", http("200 OK", "text/html; charset=windows-1251", cp1251)),
    warc_record("1.1", "response", "http://b/", http("200 OK", "text/html", sjis)),
    warc_record("1.1", "response", "http://c/", http("200 OK", "text/html", b"3\r\n<p>\r\n2\r\nhi\r\n0\r\n\r\n",
                                                      b"Transfer-Encoding: chunked\r\n")),
    warc_record("1.1", "response", "http://d/", http("404 Not Found", "text/html", b"<p>gone</p>")),
    warc_record("1.1", "conversion", "http://e/", "Простой текст WET.".encode(), "text/plain"),
]
put("warc", "plain", b"".join(warc_recs))
put("warc", "gzip_per_record", b"".join(gzip.compress(r, mtime=0) for r in warc_recs))
put("warc", "gzip_whole", gzip.compress(b"".join(warc_recs), mtime=0))

put("latex", "article", r"""\documentclass{article}
\usepackage{amsmath}
\newcommand{\R}{\mathbb{R}}
\begin{document}
\section{Intro}\label{sec:intro}
Some \textbf{bold} and \emph{emphasis} text~\cite{knuth}, with $x^2$ and \(y\).
% a comment
\begin{itemize}\item first \item second\end{itemize}
\begin{enumerate}\item one\end{enumerate}
\begin{equation} E = mc^2 \end{equation}
\begin{figure}\includegraphics{a.png}\caption{A caption.}\end{figure}
Accents: \'e \"o \c{c} -- --- ``quoted'' \ldots \% \& \verb|raw{|
\begin{verbatim}
kept as is
\end{verbatim}
\footnote{dropped}
\begin{thebibliography}{9}\bibitem{knuth} Knuth.\end{thebibliography}
\end{document}
""")
put("latex", "unbalanced", r"\section{Open {brace \textbf{x" + "\n\n" + r"\begin{itemize} \item $unclosed" + "\n")

# SentencePiece: a tiny BPE model with byte fallback and a unigram one,
# both with the identity normalizer (as Llama's: no 240 KB character map).
with tempfile.TemporaryDirectory() as tmp:
    text = os.path.join(tmp, "text.txt")
    with open(text, "w") as f:
        f.write("hello world\nthe quick brown fox jumps over the lazy dog\n" * 20)
    try:
        subprocess.run(["spm_train", f"--input={text}", f"--model_prefix={tmp}/m", "--vocab_size=300",
                        "--model_type=bpe", "--byte_fallback=true", "--minloglevel=2",
                        "--normalization_rule_name=identity"],
                       check=True, capture_output=True)
        with open(f"{tmp}/m.model", "rb") as f:
            put("sentencepiece", "bpe_byte_fallback", f.read())
        subprocess.run(["spm_train", f"--input={text}", f"--model_prefix={tmp}/u", "--vocab_size=40",
                        "--model_type=unigram", "--minloglevel=2", "--hard_vocab_limit=false",
                        "--normalization_rule_name=identity"], check=True, capture_output=True)
        with open(f"{tmp}/u.model", "rb") as f:
            put("sentencepiece", "unigram", f.read())
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"spm_train failed: {e}: no SentencePiece seeds", file=sys.stderr)
