"""An independent reader and writer of Megatron-Core's indexed dataset, written
from the published format (megatron/core/datasets/readme.md and indexed_dataset
docs), used to check Nekton's files both ways.

  megatron_index.py read PREFIX          -> JSON {dtype, sequences, doc_idx} on stdout
  megatron_index.py write PREFIX SPEC    -> writes PREFIX.bin/.idx from SPEC (JSON
                                            {dtype, documents: [[seq, ...], ...]})
"""
import json
import struct
import sys

import numpy as np

MAGIC = b"MMIDIDX\x00\x00"
CODES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64,
         6: np.float64, 7: np.float32, 8: np.uint16}


def read(prefix):
    with open(prefix + ".idx", "rb") as f:
        assert f.read(9) == MAGIC, "bad magic"
        (version,) = struct.unpack("<Q", f.read(8))
        assert version == 1
        (code,) = struct.unpack("<B", f.read(1))
        (n_seq,) = struct.unpack("<Q", f.read(8))
        (n_doc,) = struct.unpack("<Q", f.read(8))
        offset = f.tell()
    buf = np.memmap(prefix + ".idx", mode="r", order="C")
    lengths = np.frombuffer(buf, dtype=np.int32, count=n_seq, offset=offset)
    pointers = np.frombuffer(buf, dtype=np.int64, count=n_seq, offset=offset + lengths.nbytes)
    doc_idx = np.frombuffer(buf, dtype=np.int64, count=n_doc,
                            offset=offset + lengths.nbytes + pointers.nbytes)
    dtype = CODES[code]
    data = np.memmap(prefix + ".bin", mode="r", order="C")
    seqs = []
    for n, p in zip(lengths, pointers):
        seqs.append(np.frombuffer(data, dtype=dtype, count=int(n), offset=int(p)).tolist())
    return {"dtype": np.dtype(dtype).name, "sequences": seqs, "doc_idx": doc_idx.tolist()}


def write(prefix, spec):
    dtype = np.dtype(spec["dtype"]).type
    code = {v: k for k, v in CODES.items()}[dtype]
    lengths, pointers, doc_idx = [], [], [0]
    pos = 0
    with open(prefix + ".bin", "wb") as b:
        for doc in spec["documents"]:
            for seq in doc:
                arr = np.array(seq, dtype=dtype)
                b.write(arr.tobytes(order="C"))
                lengths.append(len(seq))
                pointers.append(pos)
                pos += arr.nbytes
            doc_idx.append(len(lengths))
    with open(prefix + ".idx", "wb") as f:
        f.write(MAGIC)
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", code))
        f.write(struct.pack("<Q", len(lengths)))
        f.write(struct.pack("<Q", len(doc_idx)))
        f.write(np.array(lengths, dtype=np.int32).tobytes(order="C"))
        f.write(np.array(pointers, dtype=np.int64).tobytes(order="C"))
        f.write(np.array(doc_idx, dtype=np.int64).tobytes(order="C"))


if __name__ == "__main__":
    if sys.argv[1] == "read":
        json.dump(read(sys.argv[2]), sys.stdout)
    else:
        with open(sys.argv[3]) as f:
            write(sys.argv[2], json.load(f))
