#!/usr/bin/env python3
"""check_trace.py: checks a pmap trace file (Chrome trace-event JSON) and exits 1 naming the
first thing wrong: usage: check_trace.py FILE DEVICES STEPS [need ...], STEPS the step numbers
kept ("6,7,8"), each `need` a span name (its first word) that must appear on the caller's track
("checkpoint")."""
import json
import os
import sys


def fail(msg):
    print("check_trace: " + msg, file=sys.stderr)
    sys.exit(1)


def main():
    path, devices, steps = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    want_steps = {int(s) for s in steps.split(",")}
    with open(path) as f:
        doc = json.load(f)  # valid JSON, or the exception fails the test
    events = doc["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_name"}
    if sorted(names) != list(range(devices + 1)):
        fail(f"tracks {sorted(names)}, expected 0..{devices} (devices, then the caller)")
    for d in range(devices):
        if not names[d].startswith(f"device {d}"):
            fail(f"track {d} is named {names[d]!r}")
    if not names[devices].startswith("caller"):
        fail(f"the last track is named {names[devices]!r}")
    spans = [e for e in events if e["ph"] == "X"]
    for e in spans:
        for key in ("ts", "dur", "pid", "tid", "name", "cat"):
            if key not in e:
                fail(f"span without {key}: {e}")
        if e["dur"] < 0:
            fail(f"negative duration: {e}")
    got_steps = {e["args"]["step"] for e in spans}
    if got_steps != want_steps:
        fail(f"steps {sorted(got_steps)} kept, expected {sorted(want_steps)}")
    # The file's microseconds have three decimals; spans timed on a device's queue (CUDA) are
    # placed on the host's clock to within the latency of an event's completion: CHECK_TRACE_EPS_US.
    eps = float(os.environ.get("CHECK_TRACE_EPS_US", "0.002"))

    def inside(a, b):
        return b["ts"] - eps <= a["ts"] and a["ts"] + a["dur"] <= b["ts"] + b["dur"] + eps

    for d in range(devices):
        mine = [e for e in spans if e["tid"] == d]
        step_spans = [e for e in mine if e["name"] == "step"]
        if {e["args"]["step"] for e in step_spans} != want_steps:
            fail(f"device {d}: step spans of steps {[e['args']['step'] for e in step_spans]}")
        for kind in ("forward", "backward", "loss", "optimizer", "wait"):
            if not any(e["name"].split(" ")[0] == kind for e in mine):
                fail(f"device {d}: no {kind} span")
        colls = [e for e in mine if e["cat"] == "collective"]
        if not colls or not all(e["args"].get("bytes", 0) > 0 for e in colls
                                if "all-reduce" in e["name"] or "reduce-scatter" in e["name"]):
            fail(f"device {d}: no collective with its bytes")
        for e in mine:
            if e["name"] == "step":
                continue
            owner = [s for s in step_spans if s["args"]["step"] == e["args"]["step"]]
            if not owner or not inside(e, owner[0]):
                fail(f"device {d}: {e['name']} of step {e['args']['step']} is not inside its step")
            if e["cat"] == "wait" and not any(inside(e, c) for c in colls):
                fail(f"device {d}: {e['name']} is not inside a collective")
    caller = [e for e in spans if e["tid"] == devices]
    need = ["pmap_update"] + sys.argv[4:]
    for n in need:
        if not any(e["name"].startswith(n) for e in caller):
            fail(f"the caller's track has no {n} span")
    for e in spans:
        if e["tid"] < devices and e["name"] == "step":
            upd = [c for c in caller if c["name"] == "pmap_update"
                   and c["args"]["step"] == e["args"]["step"]]
            if not upd or not inside(e, upd[0]):
                fail(f"device {e['tid']}: step {e['args']['step']} is not inside its pmap_update")
    print(f"check_trace: {path}: {len(spans)} spans on {devices + 1} tracks, steps "
          f"{sorted(got_steps)}: ok")


main()
