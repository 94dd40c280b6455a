#!/usr/bin/env python3
"""Reference MinHash for the curation benchmark: the same scheme as Nekton's
`fuzzy_dedup` preset nemo (24-code-point shingles, 260 hashes as
a_i * h + b_i mod 2^32 over a 32-bit shingle hash), written the way Python
dedup tools do it (datasketch-style: hash every shingle in Python, then one
vectorised numpy min over the permutations per document).

  /usr/bin/python3 bench/minhash_numpy.py CORPUS.jsonl [max_mb]
Prints one JSON line: documents, MB, seconds, MB/s (one thread).
"""
import json
import sys
import time
import zlib

import numpy as np

K, H = 24, 260


def main():
    path = sys.argv[1]
    max_mb = float(sys.argv[2]) if len(sys.argv) > 2 else 20.0
    docs = []
    total = 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            t = json.loads(line)["text"]
            docs.append(t)
            total += len(t.encode("utf-8"))
            if total >= max_mb * 1e6:
                break
    rng = np.random.default_rng(42)
    a = (rng.integers(0, 2**32, H, dtype=np.uint64) | 1).astype(np.uint64)
    b = rng.integers(0, 2**32, H, dtype=np.uint64)
    mask = np.uint64(0xFFFFFFFF)
    t0 = time.perf_counter()
    sigs = 0
    for t in docs:
        n = max(1, len(t) - K + 1)
        hs = np.fromiter((zlib.crc32(t[i:i + K].encode()) for i in range(n)), dtype=np.uint64,
                         count=n)
        sig = ((np.outer(hs, a) + b) & mask).min(axis=0)
        sigs += int(sig[0] & np.uint64(1))
    dt = time.perf_counter() - t0
    print(json.dumps({"impl": "numpy", "docs": len(docs), "mb": total / 1e6, "seconds": dt,
                      "mb_per_s": total / 1e6 / dt}))


if __name__ == "__main__":
    main()
