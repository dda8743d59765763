#!/usr/bin/env python3
"""test_progress.py: what pmap-train prints while it trains, as a terminal and a log file see it.

The bar is drawn on the user's own terminal only: under a pseudo-terminal with an MPI or batch
launcher's variables set (Open MPI gives its processes one, which ends up in a log file) the
output is plain lines, without carriage returns or escape codes; --progress bar still draws it;
the --json line and every error message start a line of their own, also when a run fails with
the bar drawn. And the step numbers agree: progress lines, the bar, traces and their windows,
checkpoints and --inspect, a resumed run (its bar filled as it reads, a trace window it misses
noted, no rate when it takes no step) and the messages of a failed step all count steps from
1. Usage: test_progress.py path/to/pmap-train
"""
import json
import os
import pty
import subprocess
import sys
import tempfile
import threading

TRAIN = sys.argv[1]
LAUNCHER_VARS = {
    "OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_RANK": "0", "PMIX_RANK": "0", "PMI_RANK": "0",
    "PMI_SIZE": "1", "MPI_LOCALNRANKS": "1", "MV2_COMM_WORLD_RANK": "0", "SLURM_PROCID": "0",
    "PALS_RANKID": "0",
}
failures = []


def check(ok, what, detail=""):
    """Records a failure of what (with detail, e.g. the output's end) unless ok."""
    print(("ok: " if ok else "FAIL: ") + what + ("" if ok or not detail else f": {detail}"))
    if not ok:
        failures.append(what)


def base_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    env["PMAP_DIST"] = "none"  # the launcher's variables alone, no MPI
    env.update(extra)
    return env


def on_terminal(args, env):
    """Runs pmap-train with stdout and stderr on a new pseudo-terminal; returns (status, text),
    the terminal's \\r\\n turned back into \\n."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([TRAIN] + args, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                            env=env)
    os.close(slave)
    chunks = []

    def drain():
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer closed the terminal
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        rc = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(timeout=30)
    os.close(master)
    return rc, b"".join(chunks).replace(b"\r\n", b"\n").decode(errors="replace")


def json_line(text):
    """The --json line: a whole line of its own that parses (None when there is none)."""
    lines = [line for line in text.split("\n") if '"model"' in line]
    if len(lines) != 1 or not lines[0].startswith("{"):
        return None
    try:
        return json.loads(lines[0])
    except ValueError:
        return None


RUN = ["--backend", "cpu", "--model", "mlp", "--devices", "2", "--steps", "20", "--json"]

# The user's terminal: the bar (its carriage returns and the erase to the end of the line), and
# the --json line on a line of its own after it.
rc, out = on_terminal(RUN, base_env())
check(rc == 0 and "\r[" in out and "\x1b[K" in out, "a terminal gets the bar")
check(rc == 0 and json_line(out) is not None, "after the bar the --json line is a line of its own")

# Under a launcher: plain lines, as into a file, whatever its variables.
for var, value in sorted(LAUNCHER_VARS.items()):
    rc, out = on_terminal(RUN, base_env(**{var: value}))
    plain = "\r" not in out and "\x1b" not in out
    check(rc == 0 and plain and "\nstep " in out and json_line(out) is not None,
          f"{var}={value}: plain lines on the launcher's terminal", repr(out[-300:]))
    rc, out = on_terminal(RUN + ["--progress", "bar"], base_env(**{var: value}))
    check(rc == 0 and "\r[" in out and json_line(out) is not None,
          f"{var}={value}: --progress bar still draws the bar")
rc, out = on_terminal(RUN + ["--progress", "lines"], base_env())
check(rc == 0 and "\r" not in out and "\x1b" not in out, "--progress lines on a terminal")

# A run that fails with the bar drawn: the error message and the --json line each start a line,
# on the terminal and into a file.
FAIL = RUN + ["--progress", "bar", "--log-every", "0"]
rc, out = on_terminal(FAIL, base_env(PMAP_FAULT="nan:device=1:step=3"))
j = json_line(out)
lines = out.split("\n")
message = [line for line in lines if "not finite" in line and not line.startswith("{")]
check(rc == 1 and j is not None and "error" in j, "a failed run's --json line", repr(out[-400:]))
check(len(message) == 1 and message[0].startswith("pmap-train: step "),
      "a failed run's message starts a line", repr(message))
with tempfile.TemporaryFile() as f:
    rc = subprocess.call([TRAIN] + FAIL, stdout=f, stderr=subprocess.DEVNULL,
                         env=base_env(PMAP_FAULT="nan:device=1:step=3"))
    f.seek(0)
    text = f.read().decode()
    last = text.split("\n")[-2] if text.endswith("\n") else ""
    try:
        ok = rc == 1 and "error" in json.loads(last)
    except ValueError:
        ok = False
    check(ok and "\r[" in text, "into a file, the last line of a failed run is its JSON",
          repr(text[-400:]))

# One step-number convention everywhere: steps count from 1, step t being the t-th update, after
# which pmap_params_step (a checkpoint's step, --inspect's) is t.
def plain(args, env=None):
    proc = subprocess.run([TRAIN, "--backend", "cpu", "--model", "mlp", "--devices", "2"] + args,
                          capture_output=True, text=True, env=env or base_env(), timeout=300)
    return proc.returncode, proc.stdout, proc.stderr


def step_lines(out):
    return [int(line.split()[1]) for line in out.split("\n") if line.startswith("step ")]


def trace_steps(path):
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    return sorted({e["args"]["step"] for e in events if e["ph"] == "X"})


with tempfile.TemporaryDirectory() as tmp:
    ck, trace = os.path.join(tmp, "run.ckpt"), os.path.join(tmp, "run.json")
    rc, out, err = plain(["--steps", "5", "--log-every", "1", "--trace", trace, "--save", ck])
    check(rc == 0 and step_lines(out) == [1, 2, 3, 4, 5], "progress lines of 5 steps: 1 to 5",
          out + err)
    check(rc == 0 and trace_steps(trace) == [1, 2, 3, 4, 5], "the trace's steps: 1 to 5")
    rc, out, err = plain(["--steps", "5", "--inspect", ck, "--json"])
    j = json.loads(out.strip().split("\n")[-1])
    check(rc == 0 and j["step"] == 5 and "step 5 of 5" in out, "--inspect: step 5 of 5", out)
    rc, out = on_terminal(["--backend", "cpu", "--model", "mlp", "--devices", "2", "--steps", "5",
                           "--progress", "bar"], base_env())
    bars = [part.split()[2] for part in out.split("\r") if part.startswith("[")]
    check(rc == 0 and bars and bars[-1] == "5/5", "the bar's last step: 5/5", repr(bars))
    # --log-every E: after the run's first step, every E-th and the last.
    rc, out, err = plain(["--steps", "7", "--log-every", "3"])
    check(rc == 0 and step_lines(out) == [1, 3, 6, 7], "--log-every 3 of 7 steps: 1, 3, 6, 7",
          out)
    # A window of steps, and a run resumed after step 3.
    rc, out, err = plain(["--steps", "5", "--trace", trace, "--trace-steps", "2..3"])
    check(rc == 0 and trace_steps(trace) == [2, 3], "--trace-steps 2..3 holds steps 2 and 3")
    rc, out, err = plain(["--steps", "5", "--trace", trace, "--trace-steps", "0..3"])
    check(rc == 2 and "steps count from 1" in err, "--trace-steps 0..3 refused", err)
    rc, out, err = plain(["--steps", "3", "--save", ck, "--log-every", "0"])
    rc, out, err = plain(["--steps", "5", "--resume", ck, "--log-every", "1", "--json"])
    j = json.loads(out.strip().split("\n")[-1])
    check(rc == 0 and step_lines(out) == [4, 5] and j["start_step"] == 3 and
          "after step 3: steps 4 to 5 follow" in out, "resumed after step 3: steps 4 and 5", out)
    # The bar of a resumed run is filled as its label reads: step t of the whole run.
    rc, out = on_terminal(["--backend", "cpu", "--model", "mlp", "--devices", "2", "--steps", "5",
                           "--resume", ck, "--progress", "bar"], base_env())
    drawn = [part.split() for part in out.split("\r") if part.startswith("[")]
    fills = [(d[0].count("#"), d[2]) for d in drawn]
    check(rc == 0 and fills and fills[0][1] == "4/5" and
          all(n == 20 * int(t.split("/")[0]) // 5 for n, t in fills),
          "a resumed run's bar: filled to step t of 5, as it reads", repr(fills))
    # A window of steps the resumed run does not take: a note says so (the trace holds none).
    rc, out, err = plain(["--steps", "5", "--resume", ck, "--trace", trace, "--trace-steps",
                          "1..3", "--log-every", "0"])
    check(rc == 0 and "note: --trace-steps 1..3: this run takes steps 4 to 5 (resumed after "
          "step 3); the trace will hold none of them" in err and trace_steps(trace) == [],
          "--trace-steps 1..3 resumed after step 3: a note, an empty trace", err)
    rc, out, err = plain(["--steps", "5", "--resume", ck, "--trace", trace, "--trace-steps",
                          "2..4", "--log-every", "0"])
    check(rc == 0 and "the trace will hold steps 4 to 4" in err and trace_steps(trace) == [4],
          "--trace-steps 2..4 resumed after step 3: a note, step 4 traced", err)
    # Resumed at its last step: no step, and no rate made of nothing.
    rc, out, err = plain(["--steps", "3", "--resume", ck, "--json"])
    j = json.loads(out.strip().split("\n")[-1])
    check(rc == 0 and "nan" not in out.lower() and "no step follows" in out and
          "after 3 steps (none in this run)" in out and j["samples_per_sec"] is None,
          "resumed at its last step: no step, no nan samples/s", out)
    # A fault at step 3 (PMAP_FAULT counts alike): the lines stop at 2, both messages say 3.
    rc, out, err = plain(["--steps", "5", "--log-every", "1"],
                         base_env(PMAP_FAULT="nan:device=1:step=3"))
    check(rc == 1 and step_lines(out) == [1, 2] and "pmap-train: step 3: " in err and
          "pmap_update: step 3: " in err, "a fault at step 3 is named step 3", out + err)

if failures:
    print(f"test_progress: {len(failures)} failures", file=sys.stderr)
    sys.exit(1)
print("test_progress: ok")
