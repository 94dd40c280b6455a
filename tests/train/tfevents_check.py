"""Independent reader of a TensorBoard event file, checked against metrics.jsonl.

  tfevents_check.py EVENT_FILE METRICS_JSONL

Reads the TFRecord framing from its specification (uint64 length, masked
CRC-32C of the length, data, masked CRC-32C of the data), decodes each record
with Python's protobuf from tests/train/tensorboard_event.proto (compiled here
by protoc), and checks: the first event is file_version "brain.Event:2"; then
one event per metrics.jsonl record, in the same order, with its step, and as
scalars exactly its finite numeric fields (but step) rounded to float32.
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


def main():
    events_path, metrics_path = sys.argv[1], sys.argv[2]
    pb = event_module()
    events = []
    for data in records(events_path):
        e = pb.Event()
        e.ParseFromString(data)
        events.append(e)
    if not events or events[0].WhichOneof("what") != "file_version" or \
            events[0].file_version != "brain.Event:2":
        sys.exit(f"{events_path}: first event is not file_version brain.Event:2")
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
