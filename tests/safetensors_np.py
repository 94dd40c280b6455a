"""Safetensors read/write with struct + numpy (no safetensors package on this
machine), written from the published format: an 8-byte little-endian header
length, a JSON header of {name: {dtype, shape, data_offsets}}, then the bytes.
Shared by the Python references of the tests (tests/model, tests/ckpt)."""
import json
import struct

import numpy as np

NP = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "I64": np.int64, "F64": np.float64}


def bf16_bits_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x):
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        buf = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        raw = buf[b:end]
        if e["dtype"] == "BF16":
            arr = bf16_bits_to_f32(np.frombuffer(raw, dtype=np.uint16))
        else:
            arr = np.frombuffer(raw, dtype=NP[e["dtype"]])
        out[name] = arr.reshape(e["shape"]).copy()
    return out


def write_safetensors(path, tensors, dtype):
    """tensors: list of (name, np array); float arrays are stored as `dtype`."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, a in tensors:
        if a.dtype == np.int32:
            st, raw = "I32", a.tobytes()
        elif dtype == "BF16":
            st, raw = "BF16", f32_to_bf16_bits(a).tobytes()
        elif dtype == "F16":
            st, raw = "F16", a.astype(np.float16).tobytes()
        else:
            st, raw = "F32", a.astype(np.float32).tobytes()
        header[name] = {"dtype": st, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
