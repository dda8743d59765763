#!/usr/bin/env python3
"""test_progress.py: what pmap-train prints while it trains, as a terminal and a log file see it.

The bar is drawn on the user's own terminal only: under a pseudo-terminal with an MPI or batch
launcher's variables set (Open MPI gives its processes one, which ends up in a log file) the
output is plain lines, without carriage returns or escape codes; --progress bar still draws it;
the --json line and every error message start a line of their own, also when a run fails with
the bar drawn. Usage: test_progress.py path/to/pmap-train
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

if failures:
    print(f"test_progress: {len(failures)} failures", file=sys.stderr)
    sys.exit(1)
print("test_progress: ok")
