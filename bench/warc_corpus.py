#!/usr/bin/env python3
"""A Common-Crawl-like WARC corpus for the curation benchmarks: the documents
of bench/curate_corpus.py (real GCIDE prose with planted exact and near
duplicates) as HTML pages in WARC/1.0 files, gzip member per record like
Common Crawl's .warc.gz.

Every page gets a navigation bar, a footer and a link list around its
paragraphs (boilerplate for html_to_text to drop), and per record a
`request` (skipped by the reader) and a `response` with HTTP headers. Pages
declare their charset in the HTTP header (most), in a <meta> tag only, or not
at all; a tenth are served in windows-1252 (their text is ASCII-compatible
GCIDE prose, so the UTF-8 text is the same).

  bench/warc_corpus.py --mb 1000 --files 8 --out DIR   (MB of uncompressed WARC)
"""
import argparse
import gzip
import html
import json
import os
import random
import subprocess
import sys
import tempfile


def page(doc_id, text, rng):
    paras = "".join(f"<p>{html.escape(p)}</p>\n" for p in text.split("\n\n"))
    nav = "".join(f'<li><a href="/s/{rng.randint(0, 999)}">Section {i}</a></li>' for i in range(8))
    return (
        f"<!DOCTYPE html><html><head><title>{doc_id}</title>{{meta}}</head><body>"
        f'<nav><ul>{nav}</ul></nav><div class="content"><h1>{html.escape(" ".join(text.split()[:4]))}</h1>\n{paras}</div>'
        f'<footer><a href="/about">About</a> | <a href="/privacy">Privacy</a> | '
        f"Copyright 2024 Example Dictionary</footer></body></html>\n"
    )


def record(kind, uri, date, rid, payload, extra=""):
    head = (
        f"WARC/1.0\r\nWARC-Type: {kind}\r\nWARC-Target-URI: {uri}\r\nWARC-Date: {date}\r\n"
        f"WARC-Record-ID: <urn:uuid:{rid}>\r\n{extra}Content-Length: {len(payload)}\r\n\r\n"
    )
    return gzip.compress(head.encode() + payload + b"\r\n\r\n", compresslevel=6)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, required=True, help="uncompressed WARC bytes, in MB")
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rng = random.Random(a.seed)
    # The documents: curate_corpus.py at about 70% of the size (HTML adds the rest).
    with tempfile.TemporaryDirectory() as tmp:
        docs = os.path.join(tmp, "docs.jsonl")
        subprocess.run(
            [sys.executable, os.path.join(os.path.dirname(__file__), "curate_corpus.py"),
             "--mb", str(a.mb * 0.7), "--out", docs, "--seed", str(a.seed)],
            check=True, stdout=subprocess.DEVNULL)
        per_file = a.mb * 1e6 / a.files
        f, n_file, written, raw, n = None, 0, 0, 0, 0
        for line in open(docs, encoding="utf-8"):
            if f is None or written >= per_file:
                if f:
                    f.close()
                f = open(os.path.join(a.out, f"crawl-{n_file:05d}.warc.gz"), "wb")
                n_file, written = n_file + 1, 0
            d = json.loads(line)
            uri = f"https://dict.example/{d['id']}"
            date = f"2024-0{1 + n % 9}-1{n % 10}T12:00:00Z"
            r = rng.random()
            charset = "windows-1252" if rng.random() < 0.1 else "utf-8"
            meta = f'<meta charset="{charset}">' if 0.8 <= r < 0.9 else ""
            ctype = "text/html" + (f"; charset={charset}" if r < 0.8 else "")
            body = page(d["id"], d["text"], rng).replace("{meta}", meta)
            body = body.encode(charset, errors="xmlcharrefreplace")
            http = (f"HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n").encode() + body
            req = f"GET /{d['id']} HTTP/1.1\r\nHost: dict.example\r\n\r\n".encode()
            for kind, payload, ct in (("request", req, "application/http; msgtype=request"),
                                      ("response", http, "application/http; msgtype=response")):
                rid = f"{n:08x}-0000-4000-8000-{kind[:4].encode().hex():0>12}"
                f.write(record(kind, uri, date, rid, payload, f"Content-Type: {ct}\r\n"))
                written += len(payload) + 200
                raw += len(payload) + 200
            n += 1
        f.close()
    print(json.dumps({"pages": n, "files": n_file, "warc_mb": round(raw / 1e6, 1), "out": a.out}))


if __name__ == "__main__":
    main()
