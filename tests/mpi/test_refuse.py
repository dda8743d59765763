"""test_refuse.py: a batch one process refuses, through the Python package, across processes; run
by test_mpi_fault.sh under mpirun. For each refusal on process 0 and on the last process, both
the library's (a label or token id out of range, another extent) and the package's own before
the library is called (float labels, complex inputs, a label beyond int32, a rank too high; too few
labels), on
built-in and custom params: every process raises (the refusing one its own message, the others
naming it), the state is bitwise unchanged, and the next step is taken together, ending bitwise
where a run without the bad batch ends. Usage: test_refuse.py [DEVICES [KIND]]. Exits 77 without
numpy; 1 on any mismatch."""
import os
import sys
import tempfile

try:
    import numpy as np
except ImportError:
    print("SKIP: no numpy")
    sys.exit(77)
import pmap

RANK = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "-1")))
P = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("PMI_SIZE", "0")))
failures = 0


def fail(what):
    global failures
    failures += 1
    print(f"FAIL process {RANK}: {what}", file=sys.stderr, flush=True)


def batch(step, d, tokens=False):
    rng = np.random.default_rng(100 * step + RANK)
    rows = 4 * d
    x = (rng.integers(0, 7, (rows, 4)).astype(np.int32) if tokens
         else rng.standard_normal((rows, 5)).astype(np.float32))
    return x, rng.integers(0, 3, rows).astype(np.int32)


def spoil(kind, x, y):
    """The bad batch of `kind`, and what the refusing process's message says."""
    if kind == "label":
        y = y.copy(); y[1] = 5
        return x, y, "label 5 at row 1 is outside [0, 3)"
    if kind == "token":
        x = x.copy(); x[1, 2] = 9
        return x, y, "token id 9 at example 1 position 2 is outside [0, 7)"
    if kind == "extent":
        return x[:, :4], y, "xs axis 1 has extent 4"
    if kind == "float-labels":
        return x, y.astype(np.float64), "labels must be integers"
    if kind == "complex":
        return x.astype(np.complex64), y, "complex values"
    if kind == "int64-label":
        y = y.astype(np.int64); y[0] = 2 ** 40
        return x, y, "does not fit int32"
    if kind == "rank":
        return x.reshape(x.shape + (1,) * 8), y, "rank 10 is outside"
    if kind == "ys-rows":
        return x, y[:-1], "leading extent"
    raise AssertionError(kind)


def model(tokens):
    m = pmap.Model((4,) if tokens else (5,))
    if tokens:
        m.embedding(7, 3).flatten()
    return m.dense(6).relu().dense(3).loss("softmax_xent")


def grad_fn(params, xs, ys):
    """Least squares of a linear model on the labels, in float64."""
    w = params["w"].astype(np.float64)
    e = xs.astype(np.float64) @ w - ys
    return float((e * e).mean()), {"w": 2.0 * xs.T.astype(np.float64) @ e / len(ys)}


def make(ctx, custom, tokens):
    opt = pmap.adam(0.01)
    if custom:
        return ctx.params_custom(grad_fn, {"w": np.linspace(-0.5, 0.5, 5).astype(np.float32)}, opt)
    return ctx.params(model(tokens), opt, seed=3)


def state(p, d, path):
    p.save(path)
    with open(path, "rb") as f:
        data = f.read()
    os.unlink(path)
    w = p.read(RANK * d)
    # The defaults read this process's first device, on every process.
    if not np.array_equal(p.read(), w):
        fail(f"process {RANK}: read() is not read({RANK * d})")
    flat = np.concatenate([v.ravel() for v in p.named().values()])
    if flat.size != w.size or not np.array_equal(np.sort(flat), np.sort(w)):
        fail(f"process {RANK}: named() does not hold read()'s values")
    return w, p.step, data


def case(ctx, d, kind, bad, custom, scratch):
    tokens = kind == "token"
    p, ref = make(ctx, custom, tokens), make(ctx, custom, tokens)
    x, y = batch(1, d, tokens)
    p.update(x, y)
    ref.update(x, y)
    before = state(p, d, scratch)
    x, y = batch(2, d, tokens)
    bx, by, why = spoil(kind, x, y) if RANK == bad else (x, y, None)
    name = f"{kind}{' (custom)' if custom else ''}, process {bad} refusing"
    try:
        p.update(bx, by)
        fail(f"{name}: the step was taken")
    except pmap.ArgumentError as e:
        if RANK == bad and why not in e.message:
            fail(f"{name}: own message {e.message!r} lacks {why!r}")
        if RANK != bad and f"refused on process {bad} (host" not in e.message:
            fail(f"{name}: message {e.message!r} does not name process {bad}")
        if RANK == 0 and bad != 0:
            print(f"process 0: {name}: {e.message}", flush=True)
    after = state(p, d, scratch)
    if not (np.array_equal(before[0], after[0]) and before[1:] == after[1:]):
        fail(f"{name}: the training state changed (step {before[1]} -> {after[1]})")
    la, lb = p.update(x, y), ref.update(x, y)
    p.verify()
    end, ref_end = state(p, d, scratch), state(ref, d, scratch)
    if la != lb or end[1] != 2 or not np.array_equal(end[0], ref_end[0]) or end[2] != ref_end[2]:
        fail(f"{name}: the next step (loss {la!r}, step {end[1]}) is not the run without the bad "
             f"batch (loss {lb!r})")
    p.close()
    ref.close()


def main():
    if RANK < 0 or P < 2:
        print("SKIP: not started by mpirun with 2 or more processes")
        return 77
    d = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    only = sys.argv[2] if len(sys.argv) > 2 else None  # one kind of refusal, for a look by hand
    scratch = os.path.join(tempfile.gettempdir(), f"pmap_refuse_py_{os.getppid()}_{RANK}.ckpt")
    with pmap.Context(backend="cpu", devices=d, timeout=10, caller_waits=True) as ctx:
        for bad in (0, P - 1):
            for kind in ("label", "token", "extent", "ys-rows", "float-labels", "complex",
                         "int64-label", "rank"):
                if only in (None, kind):
                    case(ctx, d, kind, bad, False, scratch)
            for kind in ("ys-rows", "complex", "rank"):
                if only in (None, kind):
                    case(ctx, d, kind, bad, True, scratch)
    print(f"test_refuse.py (process {RANK}): {failures} failed", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
