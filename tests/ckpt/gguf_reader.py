#!/usr/bin/env python3
"""An independent GGUF v3 reader (written from ggml's docs/gguf.md, numpy only)
that checks a file written by `nekton export gguf` against the Nekton model it
came from.

usage: gguf_reader.py FILE.gguf MODEL_DIR EXPECT.json

EXPECT.json: {"type": "f32"|"f16"|"bf16"|"q8_0", "name": str,
              "tokenizer": "llama"|"gpt2",
              "token_bytes_hex": [hex of Tokenizer::token_bytes(id), ...],
              "specials": [ids], "bos": id, "eos": id, "unk": id}

Checks: header, metadata types and values (llama.cpp's keys for the model's
architecture: "llama" with rotary keys and the RMS norm epsilon, "gpt2"
with the LayerNorm epsilon and no rotary keys), tensor infos (dims, types,
alignment, no overlap, inside the file), every tensor against
MODEL_DIR/model.safetensors (llama: after undoing the q/k permutation and
the q|k|v and gate|up splits; gpt2: fused attn_qkv, learned positions and
every bias) (f32 exact; f16/bf16 equal to the round-to-nearest-even of the
f32 weight; q8_0 within half the block's stored scale), and the tokenizer
arrays (each token spells the bytes Nekton's tokenizer gives it).
Prints one line per check group with the measured differences; exits 1 on
any failure.
"""
import json
import struct
import sys

import numpy as np

GGML_F32, GGML_F16, GGML_Q8_0, GGML_BF16 = 0, 1, 8, 30
TYPE_NAMES = {"f32": GGML_F32, "f16": GGML_F16, "q8_0": GGML_Q8_0, "bf16": GGML_BF16}
FILE_TYPES = {"f32": 0, "f16": 1, "q8_0": 7, "bf16": 32}

failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL:", msg)


class Reader:
    def __init__(self, buf):
        self.b = buf
        self.at = 0

    def take(self, n):
        if self.at + n > len(self.b):
            raise ValueError(f"truncated at byte {self.at} (need {n} more)")
        s = self.b[self.at:self.at + n]
        self.at += n
        return s

    def u(self, fmt):
        size = struct.calcsize("<" + fmt)
        return struct.unpack("<" + fmt, self.take(size))[0]

    def string(self):
        n = self.u("Q")
        return self.take(n).decode("utf-8")

    # gguf_metadata_value_type -> struct format
    SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q",
               11: "q", 12: "d"}

    def value(self, vtype):
        if vtype in self.SCALARS:
            return self.u(self.SCALARS[vtype])
        if vtype == 8:
            return self.string()
        if vtype == 9:
            etype = self.u("I")
            n = self.u("Q")
            return ("array", etype, [self.value(etype) for _ in range(n)])
        raise ValueError(f"unknown metadata value type {vtype}")


def parse(path):
    buf = open(path, "rb").read()
    r = Reader(buf)
    check(r.take(4) == b"GGUF", "magic is not GGUF")
    version = r.u("I")
    check(version == 3, f"version {version}, expected 3")
    n_tensors, n_kv = r.u("Q"), r.u("Q")
    kv, kv_types = {}, {}
    for _ in range(n_kv):
        key = r.string()
        vtype = r.u("I")
        check(key not in kv, f"duplicate key {key}")
        kv[key] = r.value(vtype)
        kv_types[key] = vtype
    tensors = []
    for _ in range(n_tensors):
        name = r.string()
        n_dims = r.u("I")
        ne = [r.u("Q") for _ in range(n_dims)]
        ttype = r.u("I")
        offset = r.u("Q")
        tensors.append({"name": name, "ne": ne, "type": ttype, "offset": offset})
    align = kv.get("general.alignment", 32)
    data_start = (r.at + align - 1) // align * align
    check(all(b == 0 for b in buf[r.at:data_start]), "padding before the data is not zeros")
    return buf, kv, kv_types, tensors, align, data_start


def nbytes(ttype, n):
    if ttype == GGML_F32:
        return 4 * n
    if ttype in (GGML_F16, GGML_BF16):
        return 2 * n
    if ttype == GGML_Q8_0:
        assert n % 32 == 0
        return n // 32 * 34
    raise ValueError(f"unexpected ggml type {ttype}")


def dequantize(buf, t, data_start):
    n = int(np.prod(t["ne"]))
    raw = buf[data_start + t["offset"]: data_start + t["offset"] + nbytes(t["type"], n)]
    shape = tuple(reversed(t["ne"]))  # ne[0] is innermost -> last numpy axis
    if t["type"] == GGML_F32:
        return np.frombuffer(raw, "<f4").reshape(shape), None
    if t["type"] == GGML_F16:
        return np.frombuffer(raw, "<f2").astype(np.float32).reshape(shape), None
    if t["type"] == GGML_BF16:
        bits = np.frombuffer(raw, "<u2").astype(np.uint32) << 16
        return bits.view(np.float32).reshape(shape), None
    blocks = np.frombuffer(raw, dtype=[("d", "<f2"), ("q", "i1", 32)])
    d = blocks["d"].astype(np.float32)
    x = blocks["q"].astype(np.float32) * d[:, None]
    return x.reshape(shape), d


def bf16_round(x):
    # Round to nearest even on the f32 bit pattern (no NaNs in the weights).
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16
    return u.astype(np.uint32).view(np.float32)


def read_safetensors(path):
    buf = open(path, "rb").read()
    n = struct.unpack("<Q", buf[:8])[0]
    header = json.loads(buf[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        assert e["dtype"] == "F32", (name, e["dtype"])
        a, b = e["data_offsets"]
        out[name] = np.frombuffer(buf[8 + n + a: 8 + n + b], "<f4").reshape(e["shape"])
    return out


def unpermute(w, n_heads):
    # Inverse of reshape(n_heads, 2, hd/2, in).swapaxes(1, 2): Meta's
    # interleaved rotary rows back to Hugging Face's rotate-half rows.
    rows, cols = w.shape
    hd = rows // n_heads
    return w.reshape(n_heads, hd // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def gpt2_unicode_to_byte():
    # GPT-2's bytes_to_unicode: printable bytes map to themselves, the other
    # 68 to 256, 257, ... in byte order.
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) +
                 list(range(0xAE, 0xFF + 1)))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


def main():
    path, model_dir, expect_path = sys.argv[1:4]
    expect = json.load(open(expect_path))
    cfg = json.load(open(f"{model_dir}/config.json"))
    weights = read_safetensors(f"{model_dir}/model.safetensors")
    buf, kv, kv_types, tensors, align, data_start = parse(path)

    # ---- metadata
    C, L, H, KV = cfg["d_model"], cfg["n_layer"], cfg["n_head"], cfg["n_kv_head"]
    F, V, hd = cfg["d_ff"], cfg["vocab_size"], cfg["d_model"] // cfg["n_head"]
    arch = cfg["arch"]
    check(arch in ("llama", "gpt2"), f"this reader checks llama and gpt2 exports, not {arch}")
    u32, f32, string = 4, 6, 8
    want = {
        "general.architecture": (string, arch),
        "general.name": (string, expect["name"]),
        "general.file_type": (u32, FILE_TYPES[expect["type"]]),
        "general.alignment": (u32, 32),
        f"{arch}.context_length": (u32, cfg["max_seq_len"]),
        f"{arch}.embedding_length": (u32, C),
        f"{arch}.block_count": (u32, L),
        f"{arch}.feed_forward_length": (u32, F),
        f"{arch}.attention.head_count": (u32, H),
        f"{arch}.attention.head_count_kv": (u32, KV),
        f"{arch}.vocab_size": (u32, V),
    }
    if arch == "llama":
        want["llama.rope.dimension_count"] = (u32, hd)
        want["llama.rope.freq_base"] = (f32, cfg["rope_theta"])
        want["llama.attention.layer_norm_rms_epsilon"] = (f32, cfg["norm_eps"])
    else:
        # llama.cpp's gpt2 loader reads the LayerNorm epsilon; no rotary keys.
        want["gpt2.attention.layer_norm_epsilon"] = (f32, cfg["norm_eps"])
        for key in kv:
            check(".rope." not in key and "rms" not in key, f"{key} in a gpt2 export")
    for key, (vtype, value) in want.items():
        check(key in kv, f"missing key {key}")
        if key not in kv:
            continue
        check(kv_types[key] == vtype, f"{key}: value type {kv_types[key]}, expected {vtype}")
        if vtype == f32:
            check(kv[key] == np.float32(value), f"{key} = {kv[key]}, expected {value}")
        else:
            check(kv[key] == value, f"{key} = {kv[key]!r}, expected {value!r}")
    print(f"metadata: {len(kv)} keys, {len(want)} checked against config.json")

    # ---- tensor infos
    by_name = {t["name"]: t for t in tensors}
    check(len(by_name) == len(tensors), "duplicate tensor names")
    end = 0
    for t in sorted(tensors, key=lambda t: t["offset"]):
        check(t["offset"] % align == 0, f"{t['name']}: offset {t['offset']} not aligned")
        check(t["offset"] >= end, f"{t['name']}: overlaps the previous tensor")
        end = t["offset"] + nbytes(t["type"], int(np.prod(t["ne"])))
    check(data_start + end <= len(buf), f"tensor data runs past the end of the file")

    mat_type = TYPE_NAMES[expect["type"]]
    # gguf name -> (reference array [rows, in], is 2-d)
    ref = {"token_embd.weight": weights["wte"], "output_norm.weight": weights["ln_f.weight"]}
    if not cfg["tied_embeddings"]:
        ref["output.weight"] = weights["lm_head.weight"]
    if arch == "gpt2":
        # llama.cpp's gpt2 tensors: one fused qkv ([q; k; v] rows), every bias.
        ref["position_embd.weight"] = weights["wpe"]
        ref["output_norm.bias"] = weights["ln_f.bias"]
        for l in range(L):
            h, b = f"h.{l}.", f"blk.{l}."
            for ours, theirs in (("ln1", "attn_norm"), ("attn.qkv", "attn_qkv"),
                                 ("attn.proj", "attn_output"), ("ln2", "ffn_norm"),
                                 ("mlp.up", "ffn_up"), ("mlp.down", "ffn_down")):
                for w in ("weight", "bias"):
                    ref[f"{b}{theirs}.{w}"] = weights[f"{h}{ours}.{w}"]
    for l in range(L if arch == "llama" else 0):
        h, b = f"h.{l}.", f"blk.{l}."
        qkv, up = weights[h + "attn.qkv.weight"], weights[h + "mlp.up.weight"]
        ref[b + "attn_norm.weight"] = weights[h + "ln1.weight"]
        ref[b + "attn_q.weight"] = qkv[:H * hd]
        ref[b + "attn_k.weight"] = qkv[H * hd:(H + KV) * hd]
        ref[b + "attn_v.weight"] = qkv[(H + KV) * hd:]
        ref[b + "attn_output.weight"] = weights[h + "attn.proj.weight"]
        ref[b + "ffn_norm.weight"] = weights[h + "ln2.weight"]
        ref[b + "ffn_gate.weight"] = up[:F]
        ref[b + "ffn_up.weight"] = up[F:]
        ref[b + "ffn_down.weight"] = weights[h + "mlp.down.weight"]
    check(set(by_name) == set(ref),
          f"tensor names differ: extra {sorted(set(by_name) - set(ref))}, "
          f"missing {sorted(set(ref) - set(by_name))}")

    max_abs, max_steps, n_vals = 0.0, 0.0, 0
    for name, want_w in ref.items():
        if name not in by_name:
            continue
        t = by_name[name]
        check(list(reversed(t["ne"])) == list(want_w.shape),
              f"{name}: ne {t['ne']} for shape {list(want_w.shape)}")
        expect_type = GGML_F32 if want_w.ndim == 1 else mat_type
        check(t["type"] == expect_type, f"{name}: type {t['type']}, expected {expect_type}")
        got, scales = dequantize(buf, t, data_start)
        if name.endswith("attn_q.weight"):
            got = unpermute(got, H)
        elif name.endswith("attn_k.weight"):
            got = unpermute(got, KV)
        n_vals += got.size
        if t["type"] == GGML_F32:
            check(np.array_equal(got, want_w), f"{name}: f32 values differ")
            max_abs = max(max_abs, float(np.abs(got - want_w).max()))
        elif t["type"] == GGML_F16:
            check(np.array_equal(got, want_w.astype(np.float16).astype(np.float32)),
                  f"{name}: not the f16 rounding of the weights")
            max_abs = max(max_abs, float(np.abs(got - want_w).max()))
        elif t["type"] == GGML_BF16:
            check(np.array_equal(got, bf16_round(want_w)),
                  f"{name}: not the bf16 rounding of the weights")
            max_abs = max(max_abs, float(np.abs(got - want_w).max()))
        else:
            # The scales belong to the GGUF (Meta) row order; compare there.
            w_meta = want_w
            if name.endswith("attn_q.weight") or name.endswith("attn_k.weight"):
                heads = H if name.endswith("attn_q.weight") else KV
                rows, cols = want_w.shape
                w_meta = want_w.reshape(heads, 2, rows // heads // 2, cols).swapaxes(
                    1, 2).reshape(rows, cols)
            got_meta, _ = dequantize(buf, t, data_start)
            err = np.abs(got_meta - w_meta).reshape(-1, 32)
            step = scales[:, None]
            check(bool(np.all(err <= step / 2 * (1 + 1e-6) + 1e-30)),
                  f"{name}: q8_0 error above half a step")
            amax = np.abs(w_meta).reshape(-1, 32).max(axis=1)
            check(bool(np.all(np.abs(scales - amax / 127) <= amax / 127 * 2**-10 + 1e-12)),
                  f"{name}: q8_0 scale is not max|x|/127 in f16")
            max_abs = max(max_abs, float(err.max()))
            max_steps = max(max_steps, float((err / np.maximum(step, 1e-30)).max()))
    print(f"tensors: {len(tensors)} ({n_vals} values, {expect['type']}): max |gguf - nekton| = "
          f"{max_abs:.3g}" + (f", max error / q8_0 step = {max_steps:.3f}"
                              if expect["type"] == "q8_0" else ""))

    # ---- tokenizer
    tk = expect["tokenizer"]
    check("tokenizer.ggml.model" in kv, "no tokenizer metadata (llama.cpp cannot load the file)")
    if "tokenizer.ggml.model" in kv:
        check(kv.get("tokenizer.ggml.model") == tk, f"tokenizer.ggml.model = "
              f"{kv.get('tokenizer.ggml.model')!r}, expected {tk!r}")
        _, etype, tokens = kv["tokenizer.ggml.tokens"]
        check(etype == string, "tokens are not strings")
        _, etype, types = kv["tokenizer.ggml.token_type"]
        check(etype == 5, "token_type is not i32")
        check(len(tokens) == V and len(types) == V,
              f"{len(tokens)} tokens / {len(types)} types for vocab_size {V}")
        expected_bytes = [bytes.fromhex(h) for h in expect["token_bytes_hex"]]
        specials = set(expect["specials"])
        u2b = gpt2_unicode_to_byte()
        mismatches, pads = 0, 0
        for i, tok in enumerate(tokens):
            if i >= len(expected_bytes) or expected_bytes[i] is None:
                check(tok == f"[PAD{i}]" and types[i] == 5, f"token {i}: padding is {tok!r}")
                pads += 1
                continue
            if i in specials:
                got, want_type = tok.encode(), (3 if tk == "gpt2" or i != expect.get("unk") else 2)
            elif tk == "gpt2":
                got, want_type = bytes(u2b[c] for c in tok), 1
            elif types[i] == 6:  # byte piece <0xAB>
                got, want_type = bytes([int(tok[3:5], 16)]), 6
            else:
                got, want_type = tok.replace("\u2581", " ").encode(), 1
            if got != expected_bytes[i] or types[i] != want_type:
                mismatches += 1
                if mismatches <= 5:
                    print(f"  token {i}: {tok!r} (type {types[i]}) spells {got!r}, "
                          f"Nekton gives {expected_bytes[i]!r} (type {want_type})")
        check(mismatches == 0, f"{mismatches} tokens do not spell Nekton's token bytes")
        for key in ("bos", "eos", "unk"):
            gkey = {"bos": "tokenizer.ggml.bos_token_id", "eos": "tokenizer.ggml.eos_token_id",
                    "unk": "tokenizer.ggml.unknown_token_id"}[key]
            if expect.get(key, -1) >= 0:
                check(kv.get(gkey) == expect[key], f"{gkey} = {kv.get(gkey)}, "
                      f"expected {expect[key]}")
        extra = ""
        if tk == "llama":
            _, etype, scores = kv["tokenizer.ggml.scores"]
            check(etype == f32 and len(scores) == V, "scores: wrong type or count")
            if "scores" in expect:
                got = np.array(scores[:len(expect["scores"])], np.float32)
                check(np.array_equal(got, np.array(expect["scores"], np.float32)),
                      "scores differ from the SentencePiece model's")
            extra = f", {len(scores)} scores"
        else:
            _, etype, merges = kv["tokenizer.ggml.merges"]
            index = {t: i for i, t in enumerate(tokens)}
            bad = 0
            for m in merges:
                a, b = m.split(" ")
                ok = a in index and b in index and (a + b) in index and \
                    index[a + b] > max(index[a], index[b])
                bad += not ok
            check(bad == 0, f"{bad} merges are not (token, token) -> later token")
            check(kv.get("tokenizer.ggml.pre") is not None, "no tokenizer.ggml.pre")
            extra = f", {len(merges)} merges (each a+b a later token), " \
                    f"pre {kv.get('tokenizer.ggml.pre')!r}"
        print(f"tokenizer: {tk}, {len(tokens)} tokens ({pads} padding), all spell Nekton's "
              f"token bytes" + extra)

    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
