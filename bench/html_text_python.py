#!/usr/bin/env python3
"""Reference for the html_to_text benchmark: text extraction with Python's
standard html.parser (drops script/style, joins text), the simplest extractor
Python pipelines use, timed on the same files on one thread.

  python3 bench/html_text_python.py DIR
"""
import json
import os
import sys
import time
from html.parser import HTMLParser


class Text(HTMLParser):
    def __init__(self):
        super().__init__()
        self.skip = 0
        self.out = []

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style"):
            self.skip += 1

    def handle_endtag(self, tag):
        if tag in ("script", "style") and self.skip:
            self.skip -= 1

    def handle_data(self, data):
        if not self.skip:
            self.out.append(data)


files = []
for d, _, names in os.walk(sys.argv[1]):
    files += [os.path.join(d, n) for n in names if n.endswith(".html")]
files.sort()
pages = [open(f, encoding="utf-8", errors="replace").read() for f in files]
total = sum(len(p.encode()) for p in pages)
t0 = time.perf_counter()
for p in pages:
    t = Text()
    t.feed(p)
    " ".join("".join(t.out).split())
dt = time.perf_counter() - t0
print(json.dumps({"impl": "python html.parser", "files": len(files), "mb": total / 1e6,
                  "seconds": dt, "mb_per_s": total / 1e6 / dt}))
