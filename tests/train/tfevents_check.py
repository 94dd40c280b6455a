"""Independent reader of a TensorBoard event file, checked against metrics.jsonl.

  tfevents_check.py EVENT_FILE METRICS_JSONL
  tfevents_check.py --curate EVENT_FILE REPORT_JSON

Reads the TFRecord framing from its specification (uint64 length, masked
CRC-32C of the length, data, masked CRC-32C of the data), decodes each record
with Python's protobuf from tests/train/tensorboard_event.proto (compiled here
by protoc), and checks: the first event is file_version "brain.Event:2"; then
one event per metrics.jsonl record, in the same order, with its step, and as
scalars exactly its finite numeric fields (but step) rounded to float32.
With --curate, against `nekton curate`'s report.json instead: after the
file_version event, step 0 holds exactly the run's totals (input_docs,
output_docs, removed_docs, input_bytes, bad_records, empty_docs,
utf8_repaired, shards, and input/NAME for each of input_counts), and step s
(1..) exactly stage s's docs_in, kept, removed, bytes_in, seconds and
counts/NAME for each of its counts, all rounded to float32.
Prints "ok: N events" or the first mismatch (exit 1).
"""
import importlib
import json
import math
import os
import struct
import subprocess
import sys
import tempfile


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def records(path):
    raw = open(path, "rb").read()
    at = 0
    while at < len(raw):
        if len(raw) - at < 12:
            sys.exit(f"{path}: torn header at byte {at}")
        head = raw[at:at + 8]
        (n,) = struct.unpack("<Q", head)
        (hcrc,) = struct.unpack("<I", raw[at + 8:at + 12])
        if hcrc != masked(head):
            sys.exit(f"{path}: bad length CRC at byte {at}")
        data = raw[at + 12:at + 12 + n]
        if len(data) != n or len(raw) < at + 16 + n:
            sys.exit(f"{path}: torn record at byte {at}")
        (dcrc,) = struct.unpack("<I", raw[at + 12 + n:at + 16 + n])
        if dcrc != masked(data):
            sys.exit(f"{path}: bad data CRC at byte {at}")
        yield data
        at += 16 + n


def event_module():
    here = os.path.dirname(os.path.abspath(__file__))
    out = tempfile.mkdtemp(prefix="tfevents_pb_")
    subprocess.run(["protoc", f"--proto_path={here}", f"--python_out={out}",
                    os.path.join(here, "tensorboard_event.proto")], check=True)
    sys.path.insert(0, out)
    return importlib.import_module("tensorboard_event_pb2")


def f32(v):
    return struct.unpack("<f", struct.pack("<f", v))[0]


def read_events(events_path):
    pb = event_module()
    events = []
    for data in records(events_path):
        e = pb.Event()
        e.ParseFromString(data)
        events.append(e)
    if not events or events[0].WhichOneof("what") != "file_version" or \
            events[0].file_version != "brain.Event:2":
        sys.exit(f"{events_path}: first event is not file_version brain.Event:2")
    return events


def curate_steps(report):
    """The scalars report.json gives each step (index = step)."""
    totals = {k: report[k] for k in ("input_docs", "output_docs", "removed_docs", "input_bytes",
                                     "bad_records", "empty_docs", "utf8_repaired", "shards")}
    totals.update({"input/" + k: v for k, v in report["input_counts"].items()})
    steps = [totals]
    for st in report["stages"]:
        s = {k: st[k] for k in ("docs_in", "kept", "removed", "bytes_in", "seconds")}
        s.update({"counts/" + k: v for k, v in st["counts"].items()})
        steps.append(s)
    return steps


def check_curate(events_path, report_path):
    events = read_events(events_path)
    want_steps = curate_steps(json.load(open(report_path)))
    scalars = events[1:]
    if len(scalars) != len(want_steps):
        sys.exit(f"{len(scalars)} scalar events for {len(want_steps)} steps of report.json "
                 f"(the totals and {len(want_steps) - 1} stages)")
    for s, (e, want) in enumerate(zip(scalars, want_steps)):
        if e.step != s:
            sys.exit(f"event {s + 1} has step {e.step}, expected {s}")
        got = {v.tag: v.simple_value for v in e.summary.value}
        want = {k: f32(v) for k, v in want.items()}
        if got.keys() != want.keys():
            sys.exit(f"step {s}: tags {sorted(got)} but report.json has {sorted(want)}")
        for k in want:
            if got[k] != want[k]:
                sys.exit(f"step {s}: {k} = {got[k]} but report.json has {want[k]}")
    print(f"ok: {len(events)} events, steps {[e.step for e in scalars]}")


def main():
    if sys.argv[1] == "--curate":
        return check_curate(sys.argv[2], sys.argv[3])
    events_path, metrics_path = sys.argv[1], sys.argv[2]
    events = read_events(events_path)
    rows = [json.loads(l) for l in open(metrics_path) if l.strip()]
    scalars = events[1:]
    if len(scalars) != len(rows):
        sys.exit(f"{len(scalars)} scalar events for {len(rows)} metrics records; steps "
                 f"{[e.step for e in scalars]} vs {[r['step'] for r in rows]}")
    for e, r in zip(scalars, rows):
        if e.step != r["step"]:
            sys.exit(f"event step {e.step} where metrics.jsonl has step {r['step']}")
        got = {v.tag: v.simple_value for v in e.summary.value}
        want = {k: f32(v) for k, v in r.items()
                if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
                and math.isfinite(v)}
        if got.keys() != want.keys():
            sys.exit(f"step {e.step}: tags {sorted(got)} but metrics.jsonl has {sorted(want)}")
        for k in want:
            if got[k] != want[k]:
                sys.exit(f"step {e.step}: {k} = {got[k]} but metrics.jsonl has {want[k]}")
        if e.wall_time < events[0].wall_time - 1:
            sys.exit(f"step {e.step}: wall_time {e.wall_time} before the file's start")
    print(f"ok: {len(events)} events, steps {[e.step for e in scalars]}")


main()
