#!/usr/bin/env python3
"""A real-text corpus for the curation benchmarks, of any size, with planted
duplicates.

Documents are made of dictionary entries from Debian's GCIDE (dict-gcide):
each document joins 4 to 20 entries drawn at random from the whole dictionary,
so documents are real English prose and definitions, distinct from each other
(their pairwise Jaccard similarity is near zero). Then, by a fixed seed:
  - `--exact` of the documents are followed later by an exact copy
    (whitespace and case changed in half of them);
  - `--near` of the documents are followed later by a near-duplicate, a copy
    with a fraction of its words substituted, deleted or inserted, the
    fraction uniform in [0, --max-edit].
Writes JSONL {"id", "text"} and, with --truth, the planted pairs as
JSONL {"a": id, "b": id, "kind": "exact"|"near", "edit": fraction}.

  bench/curate_corpus.py --mb 100 --out corpus.jsonl [--truth pairs.jsonl]
"""
import argparse
import gzip
import json
import random

GCIDE = "/usr/share/dictd/gcide.dict.dz"


def entries():
    text = gzip.open(GCIDE, "rb").read().decode("utf-8", errors="replace")
    out = []
    for e in text.split("\n\n"):
        e = " ".join(e.split())
        if len(e) >= 80:
            out.append(e)
    return out


def edit(words, frac, rng, vocab):
    out = []
    for w in words:
        r = rng.random()
        if r < frac / 3:  # delete
            continue
        if r < 2 * frac / 3:  # substitute
            out.append(rng.choice(vocab))
            continue
        out.append(w)
        if r < frac:  # insert after
            out.append(rng.choice(vocab))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--truth")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--exact", type=float, default=0.05)
    ap.add_argument("--near", type=float, default=0.10)
    ap.add_argument("--max-edit", type=float, default=0.3)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    ents = entries()
    vocab = [w for e in ents[:5000] for w in e.split()][:100000]
    target = int(a.mb * 1e6)
    written = 0
    n = 0
    pending = []  # (due_at_doc, id, text, kind, frac)
    with open(a.out, "w", encoding="utf-8") as out, (
        open(a.truth, "w") if a.truth else open("/dev/null", "w")
    ) as truth:
        while written < target:
            if pending and pending[0][0] <= n:
                _, src, text, kind, frac = pending.pop(0)
                doc_id = f"d{n}"
                truth.write(json.dumps({"a": src, "b": doc_id, "kind": kind, "edit": frac}) + "\n")
            else:
                k = rng.randint(4, 20)
                text = "\n\n".join(rng.choice(ents) for _ in range(k))
                doc_id = f"d{n}"
                r = rng.random()
                due = n + rng.randint(1, 2000)
                if r < a.exact:
                    copy = text.upper() if rng.random() < 0.5 else text.replace(" ", "  ")
                    pending.append((due, doc_id, copy, "exact", 0.0))
                elif r < a.exact + a.near:
                    frac = rng.uniform(0, a.max_edit)
                    words = edit(text.split(" "), frac, rng, vocab)
                    pending.append((due, doc_id, " ".join(words), "near", round(frac, 4)))
                pending.sort(key=lambda p: p[0])
            line = json.dumps({"id": doc_id, "text": text}, ensure_ascii=False) + "\n"
            out.write(line)
            written += len(line.encode("utf-8"))
            n += 1
    print(json.dumps({"docs": n, "bytes": written, "out": a.out}))


if __name__ == "__main__":
    main()
