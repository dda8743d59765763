"""Ctrl-C during training, hundreds of times: a parent process sends SIGINT at random moments to a
child that trains (a built-in model on a context whose caller waits and on one whose caller runs
device 0, then custom params whose gradient is Python), catches every KeyboardInterrupt, and after
each one checks that its params still work: it saves them, loads the file back and verifies the
replicas. Once the storm is over, every checkpoint must equal, bit for bit, params trained from the
same seed for as many steps without interruption, and closing everything must leave no thread
behind. Under AddressSanitizer (LD_PRELOAD of libasan, as tests/meson.build runs it) any leak of
the library's memory fails it too.

    python3 interrupt_storm.py [--interrupts N] [--width W] [--seconds S] [--seed K]

Exits 0 when all holds, 1 on any failure, 77 when numpy is missing."""
import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

try:
    import numpy as np
except ImportError:
    print("interrupt_storm: numpy is not installed: skipped")
    sys.exit(77)

DEVICES = 2
ROWS = 128  # 64 rows a device: oneDNN runs these GEMMs with the JIT kernels a signal broke


class Harness:
    """The child's SIGINT handler raises KeyboardInterrupt only while armed, around a pmap call,
    and disarms itself first: the interrupt lands anywhere inside the call (in the package's
    Python code, or as the C call returns), never in the harness's own bookkeeping."""

    def __init__(self):
        self.armed = False
        self.received = 0
        self.interrupts = 0
        signal.signal(signal.SIGINT, self._on_sigint)

    def _on_sigint(self, signum, frame):
        self.received += 1
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt

    def call(self, fn, *args):
        """fn(*args) armed; (True, result) or (False, None) when interrupted."""
        try:
            self.armed = True
            r = fn(*args)
            self.armed = False
            return True, r
        except KeyboardInterrupt:
            self.armed = False
            self.interrupts += 1
            return False, None

    def until_done(self, fn, *args):
        """fn(*args) armed, again after each interrupt, until one call completes."""
        while True:
            ok, r = self.call(fn, *args)
            if ok:
                return r


def batch(k, width, classes):
    rng = np.random.default_rng(1000 + k % 16)
    x = rng.standard_normal((ROWS, width), dtype=np.float32)
    return x, rng.integers(0, classes, ROWS).astype(np.int32)


def built_in(pmap, ctx, width):
    model = pmap.Model(input_shape=(width,)).dense(width).relu().dense(10).loss("softmax_xent")
    return ctx.params(model, pmap.sgd(0.05, momentum=0.9), seed=3)


def softmax_regression(params, xs, ys):
    """Custom model: a linear softmax classifier (float64 inside), mean loss and its gradient."""
    w = params["w"].astype(np.float64)
    b = params["b"].astype(np.float64)
    z = xs.astype(np.float64) @ w + b
    z -= z.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    n = xs.shape[0]
    loss = -np.log(p[np.arange(n), ys]).mean()
    p[np.arange(n), ys] -= 1.0
    return loss, {"w": xs.T.astype(np.float64) @ p / n, "b": p.sum(axis=0) / n}


def custom(pmap, ctx, width):
    rng = np.random.default_rng(9)
    init = {"w": (0.1 * rng.standard_normal((width, 10))).astype(np.float32),
            "b": np.zeros(10, np.float32)}
    return ctx.params_custom(softmax_regression, init, pmap.adam(1e-2))


def storm_phase(h, p, width, target, deadline, folder, tag):
    """Trains p until `target` of its updates were interrupted: [(step, checkpoint)] taken after
    each (the calls that follow are interrupted too, and done again until they complete)."""
    saved = []
    while len(saved) < target and time.monotonic() < deadline:
        k = h.until_done(lambda: p.step)
        x, y = batch(k, width, 10)
        ok, loss = h.call(p.update, x, y)
        if ok:
            if not np.isfinite(loss):
                raise AssertionError(f"{tag}: step {k}: loss {loss}")
            continue
        # Interrupted: the params must be usable, savable and loadable at once.
        k = h.until_done(lambda: p.step)
        path = os.path.join(folder, f"{tag}-{len(saved)}.ckpt")
        h.until_done(p.save, path)
        h.until_done(p.load, path)
        h.until_done(p.verify)
        if h.until_done(lambda: p.step) != k:
            raise AssertionError(f"{tag}: loading the checkpoint of step {k} changed the step")
        saved.append((k, path))
    return saved


def layers_phase(h, pmap, target, deadline):
    """Adds layers to models, interrupted, until `target` additions were: after each the model
    must still take calls (its lock released). (Whether the interrupted layer was added is the
    library's to say; the package's own record of the layers may miss it: docs/python.md.)"""
    interrupted = 0
    while interrupted < target and time.monotonic() < deadline:
        m = h.until_done(pmap.Model, (16,))
        for _ in range(20):
            ok, _ = h.call(lambda: m.dense(16).relu())
            if ok:
                continue
            interrupted += 1
            h.until_done(lambda: m.parameter_shapes)
            h.until_done(lambda: m.num_params)
            h.until_done(lambda: m.output_shape)
        h.until_done(m.close)
    return interrupted


def check_against_reference(make, saved, width, tag, live):
    """Every checkpoint equals params trained without interruption for as many steps."""
    ref, scratch = make(), make()
    live_step, live_values = live
    todo = sorted(saved + [(live_step, None)], key=lambda s: s[0])
    for k, path in todo:
        while ref.step < k:
            ref.update(*batch(ref.step, width, 10))
        want = ref.read()
        if path is None:
            got = live_values
        else:
            scratch.load(path)
            if scratch.step != k:
                raise AssertionError(f"{tag}: {path} holds step {scratch.step}, not {k}")
            got = scratch.read()
        if not np.array_equal(got, want):
            i = int(np.argmax(got != want))
            raise AssertionError(f"{tag}: step {k} ({path or 'the params after the storm'}) "
                                 f"differs from the uninterrupted run at {i}: {got[i]!r} vs "
                                 f"{want[i]!r}")
    ref.close()
    scratch.close()
    return len(todo)


def child(args):
    import pmap
    h = Harness()
    from _threads import library_threads_after_close
    folder = args.folder
    deadline = time.monotonic() + args.seconds
    phases = [("waits", True, built_in), ("runs-device-0", False, built_in),
              ("custom", True, custom)]
    results = []
    share = max(1, args.interrupts // len(phases))
    print("ready", flush=True)
    for tag, caller_waits, make in phases:
        ctx = pmap.Context(backend="cpu", devices=DEVICES, caller_waits=caller_waits)
        p = make(pmap, ctx, args.width)
        saved = storm_phase(h, p, args.width, share, deadline, folder, tag)
        results.append((tag, caller_waits, make, saved, h.until_done(lambda: p.step),
                        h.until_done(p.read)))
        h.until_done(ctx.close)
    layers = layers_phase(h, pmap, share // 2, deadline)
    h.armed = False
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    print(f"storm over: {h.received} signals, {h.interrupts} interrupts", flush=True)

    for tag, caller_waits, make, saved, step, values in results:
        if len(saved) < share:
            raise AssertionError(f"{tag}: only {len(saved)} of {share} updates were interrupted "
                                 f"within {args.seconds} s")
        with pmap.Context(backend="cpu", devices=DEVICES, caller_waits=caller_waits) as ctx:
            n = check_against_reference(lambda: make(pmap, ctx, args.width), saved, args.width,
                                        tag, (step, values))
        print(f"{tag}: {len(saved)} interrupted steps, {n} states equal to the uninterrupted "
              f"run (last step {step})", flush=True)
    if layers < share // 2:
        raise AssertionError(f"layers: only {layers} of {share // 2} additions were interrupted")
    print(f"layers: {layers} interrupted additions, each model usable after", flush=True)
    left = library_threads_after_close(0)
    if left:
        raise AssertionError(f"{left} of the library's threads left after closing every context")
    print("ok", flush=True)


# A frame of the library in a sanitizer's stack: "in pmap_model_create ../models/model.c:31".
_LIBRARY_FRAME = re.compile(r" in \S+ (\S*/)?(base|runtime|ops|models)/[\w/]+\.c:\d+")


def parent(args):
    env = dict(os.environ)
    sanitizer = env.get("PMAP_STORM_PRELOAD")
    if sanitizer:
        env["LD_PRELOAD"] = sanitizer
        # Leaks end the child with 0 here: only those with a frame in the library fail the test
        # (the interpreter's own allocations at exit are not its to free).
        env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":detect_leaks=1"
        env["LSAN_OPTIONS"] = env.get("LSAN_OPTIONS", "") + ":exitcode=0"
    # The checkpoints in memory where there is a tmpfs (a storm of saves would wait on the disk),
    # in a folder removed however the child ends.
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    folder = tempfile.mkdtemp(prefix="pmap-storm-", dir=shm)
    try:
        return _run_child(args, env, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run_child(args, env, folder):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--interrupts",
           str(args.interrupts), "--width", str(args.width), "--seconds", str(args.seconds),
           "--folder", folder]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, errors="replace",
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines, err = [], []
    ready, over = threading.Event(), threading.Event()

    def read_out():
        for line in p.stdout:
            lines.append(line)
            if line.startswith("ready"):
                ready.set()
            if line.startswith("storm over"):
                over.set()
        ready.set()
        over.set()

    def read_err():
        err.append(p.stderr.read())

    readers = [threading.Thread(target=read_out), threading.Thread(target=read_err)]
    for t in readers:
        t.start()
    sent = 0
    rng = random.Random(args.seed)
    ready.wait(args.seconds + 120)
    while not over.is_set() and p.poll() is None:
        try:
            p.send_signal(signal.SIGINT)
            sent += 1
        except ProcessLookupError:
            break
        time.sleep(rng.uniform(0.0, 0.004))
    try:
        rc = p.wait(timeout=args.seconds + 240)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = p.wait()
        lines.append("interrupt_storm: the child did not end in time\n")
    for t in readers:
        t.join()
    out, stderr = "".join(lines), "".join(err)
    leaks = [b for b in re.split(r"\n(?=(?:Direct|Indirect) leak)", stderr)
             if re.match(r"(Direct|Indirect) leak", b) and _LIBRARY_FRAME.search(b)]
    sanitizer_error = re.search(r"ERROR: AddressSanitizer|runtime error:|WARNING: ThreadSanitizer",
                                stderr)
    print(out, end="")
    print(f"interrupt_storm: {sent} signals sent, child exit status {rc}")
    if rc != 0 or "\nok\n" not in "\n" + out or leaks or sanitizer_error:
        sys.stdout.write(stderr[-20000:])
        for b in leaks[:5]:
            print("a leak of the library:\n" + b[:3000])
        print("interrupt_storm: FAILED")
        return 1
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--interrupts", type=int, default=300,
                    help="interrupted updates in all phases (300)")
    ap.add_argument("--width", type=int, default=256, help="the dense layers' width (256)")
    ap.add_argument("--seconds", type=float, default=180.0,
                    help="most time the storm may take, a guard against a hang (180); it takes "
                         "seconds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return 0
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
