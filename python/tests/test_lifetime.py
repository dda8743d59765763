"""The lifetime of the package's objects under attack: copies and pickles of every class, calls on
closed objects, constructors that fail, close() from another thread during a call, from a signal
handler inside a call, from a callback of the call's own arguments, a forked child using its
parent's objects, and the package's version. Sequences that crashed the interpreter run in a
child interpreter, so that a crash is a failure and not the end of the session."""
import copy
import gc
import os
import pickle
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import numpy as np
import pytest

import pmap
from _threads import library_threads, library_threads_after_close, no_library_threads


def run_python(code, timeout=120):
    """Runs code in a fresh interpreter that imports this same pmap; returns (rc, output)."""
    env = dict(os.environ)
    here = os.path.dirname(os.path.dirname(os.path.abspath(pmap.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([here] + [p for p in [env.get("PYTHONPATH")] if p])
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, timeout=timeout,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return r.returncode, r.stdout


def mlp(ctx, width=16, seed=0):
    model = pmap.Model(input_shape=(8,)).dense(width).relu().dense(3).loss("softmax_xent")
    return ctx.params(model, pmap.adam(1e-3), seed=seed)


def batch(rows=16, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((rows, 8)).astype(np.float32),
            rng.integers(0, 3, rows).astype(np.int32))


def test_copying_models_then_dropping_them_does_not_crash():
    rc, out = run_python("""
        import copy, gc, pickle, numpy as np, pmap
        m = pmap.Model(input_shape=(3,)).dense(4).relu()
        c, d, u = copy.copy(m), copy.deepcopy(m), pickle.loads(pickle.dumps(m))
        del m, c, d, u
        gc.collect()
        with pmap.Context(backend="cpu", devices=2) as ctx:
            p = ctx.params(pmap.Model(input_shape=(1,)).dense(1), pmap.sgd(0.1))
            for f in (copy.copy, copy.deepcopy):
                try:
                    q = f(p)
                except TypeError:
                    q = None
                del q
                gc.collect()
            p.update(np.ones((4, 1), np.float32), np.ones((4, 1), np.float32))
            assert p.step == 1
        print("survived")
    """)
    assert rc == 0 and "survived" in out, out


def test_a_model_copies_and_pickles_as_an_independent_model():
    m = pmap.Model(input_shape=(2, 6, 6)).conv2d(4, (3, 3), stride=1, pad=1).batchnorm(False)
    m.maxpool2d(2, stride=1).flatten().dropout(0.25).dense(3).loss("softmax_xent")
    for other in (copy.copy(m), copy.deepcopy(m), pickle.loads(pickle.dumps(m)),
                  pickle.loads(pickle.dumps(m, protocol=0))):
        assert other._handle is not m._handle
        assert repr(other) == repr(m)
        assert (other.num_params, other.output_shape) == (m.num_params, m.output_shape)
        other.dense(5)  # changes the copy only
        assert other.output_shape == (5,) and m.output_shape == (3,)
        other.close()
    with pmap.Context(backend="cpu", devices=2) as ctx:
        x = np.random.default_rng(0).standard_normal((4, 2, 6, 6)).astype(np.float32)
        y = np.array([0, 1, 2, 1], np.int32)
        a = ctx.params(m, pmap.sgd(0.1), seed=4)
        b = ctx.params(pickle.loads(pickle.dumps(m)), pmap.sgd(0.1), seed=4)
        assert a.update(x, y) == b.update(x, y)  # labels: the copy kept the loss
        assert np.array_equal(a.read(), b.read())
    m.close()
    for f in (copy.copy, copy.deepcopy, pickle.dumps):
        with pytest.raises(pmap.Error, match="closed"):
            f(m)


def test_contexts_and_params_refuse_copies_and_pickles():
    with pmap.Context(backend="cpu", devices=2) as ctx:
        p = mlp(ctx)
        for obj, how in ((ctx, "another pmap.Context"), (p, r"save\(path\) and load\(path\)")):
            for f in (copy.copy, copy.deepcopy, pickle.dumps, lambda o: pickle.dumps(o, 0)):
                with pytest.raises(TypeError, match="cannot be copied or pickled") as e:
                    f(obj)
                assert re.search(how, str(e.value))
        x, y = batch()
        p.update(x, y)  # both still work
        assert p.step == 1 and ctx.devices == 2


def test_errors_and_optimizer_settings_copy_and_pickle():
    for e in (pmap.Error(5, "device 1 stalled"), pmap.ArgumentError("units 0")):
        for other in (copy.copy(e), copy.deepcopy(e), pickle.loads(pickle.dumps(e))):
            assert type(other) is type(e)
            assert (other.code, other.status, other.message, str(other)) == \
                (e.code, e.status, e.message, str(e))
    with pmap.Context(backend="cpu", devices=2) as ctx:
        try:
            ctx.params(pmap.Model(input_shape=(1,)), pmap.sgd(0.1))
        except pmap.Error as e:
            caught = e
        again = pickle.loads(pickle.dumps(caught))
        assert again.status == "PMAP_ERR_INVALID_ARGUMENT" and "0 layers" in again.message
    o = pmap.adamw(3e-3, weight_decay=0.1, schedule="warmup_cosine", warmup_steps=10,
                   decay_steps=100)
    for other in (copy.copy(o), copy.deepcopy(o), pickle.loads(pickle.dumps(o))):
        assert bytes(other) == bytes(o)


def test_closed_objects_raise_on_every_call_and_property(tmp_path):
    ctx = pmap.Context(backend="cpu", devices=2)
    model = pmap.Model(input_shape=(8,)).dense(3)
    p = ctx.params(model, pmap.sgd(0.1))
    model.close()
    assert p.count == 27  # params keep their own copy of the model
    ctx.close()
    x, y = batch()
    calls = {
        "Context.devices": lambda: ctx.devices, "Context.backend": lambda: ctx.backend,
        "Context.params": lambda: ctx.params(pmap.Model(input_shape=(1,)).dense(1),
                                             pmap.sgd(0.1)),
        "Params.count": lambda: p.count, "Params.step": lambda: p.step,
        "Params.sharded": lambda: p.sharded, "Params.optimizer_bytes": lambda: p.optimizer_bytes,
        "Params.update": lambda: p.update(x, y), "Params.predict": lambda: p.predict(x),
        "Params.read": lambda: p.read(), "Params.write": lambda: p.write(np.zeros(27)),
        "Params.save": lambda: p.save(tmp_path / "a"), "Params.load": lambda: p.load("b"),
        "Params.verify": p.verify, "Params.set_micro_batches": lambda: p.set_micro_batches(2),
        "Model.num_params": lambda: model.num_params, "Model.dense": lambda: model.dense(1),
        "Model.output_shape": lambda: model.output_shape, "Model.loss": lambda: model.loss("mse"),
    }
    for name, call in calls.items():
        with pytest.raises(pmap.Error, match="closed") as e:
            call()
        assert e.value.message.startswith(name), e.value.message
    ctx.close(), p.close(), model.close()  # idempotent
    assert list(tmp_path.iterdir()) == []


def test_dropped_objects_are_freed_without_close():
    assert no_library_threads()
    for _ in range(3):
        ctx = pmap.Context(backend="cpu", devices=3)
        p = mlp(ctx)
        p.update(*batch(rows=6))
        del ctx  # p keeps it alive
        assert library_threads() == 3  # one worker a device
        del p
        gc.collect()
        assert library_threads_after_close(0) == 0


def test_failed_constructors_leave_silent_objects():
    seen = []
    old, sys.unraisablehook = sys.unraisablehook, seen.append
    try:
        with pmap.Context(backend="cpu", devices=1) as ctx:
            empty = pmap.Model(input_shape=(1,))
            for make in (lambda: pmap.Model(5), lambda: pmap.Model(input_shape=(0,)),
                         lambda: pmap.Model(input_shape=(1, 2)),
                         lambda: pmap.Context(backend="cpu", devices=0),
                         lambda: pmap.Context(backend="tpu"),
                         lambda: pmap.Params(ctx, "model", pmap.sgd(0.1), 0),
                         lambda: ctx.params(empty, pmap.sgd(0.1)),
                         lambda: ctx.params(empty, pmap.sgd(-1.0))):
                with pytest.raises(pmap.Error):
                    make()
                gc.collect()
            for cls, prop in ((pmap.Model, "num_params"), (pmap.Context, "devices"),
                              (pmap.Params, "count")):
                bare = cls.__new__(cls)  # as a subclass whose __init__ fails first would leave
                bare.close()
                with pytest.raises(pmap.Error, match="closed"):
                    getattr(bare, prop)
                del bare
                gc.collect()
    finally:
        sys.unraisablehook = old
    assert not seen, [f"{u.exc_type.__name__}: {u.exc_value}" for u in seen]


def _race(closer, call, rounds=12):
    """In a child interpreter: a thread runs `call` on params p in a loop while the main thread
    closes `closer` ("p" or "ctx") after a random delay. Every result must be a finite loss or
    pmap.Error saying the object is closed, and the child must not crash."""
    return run_python(f"""
        import random, threading, time, numpy as np, pmap
        rng = np.random.default_rng(0)
        x = rng.standard_normal((256, 64)).astype(np.float32)
        y = rng.integers(0, 10, 256).astype(np.int32)
        closed_errors = 0
        for r in range({rounds}):
            ctx = pmap.Context(backend="cpu", devices=4)
            model = pmap.Model(input_shape=(64,)).dense(512).relu().dense(10).loss("softmax_xent")
            p = ctx.params(model, pmap.adam(1e-3), seed=r)
            bad, started = [], threading.Event()
            def loop():
                while True:
                    started.set()
                    try:
                        {call}
                    except pmap.Error as e:
                        if "closed" not in e.message:
                            bad.append(e.message)
                        return
            t = threading.Thread(target=loop)
            t.start()
            started.wait()
            time.sleep(random.Random(r).uniform(0.0, 0.02))
            {closer}.close()
            t.join(60)
            assert not t.is_alive(), "the call never ended"
            assert not bad, bad
            ctx.close()
        print("survived")
    """)


@pytest.mark.parametrize("closer", ["p", "ctx"])
@pytest.mark.parametrize("call", ["assert np.isfinite(p.update(x, y))", "p.read(3)",
                                  "p.predict(x[:8])", "p.step"],
                         ids=["update", "read", "predict", "step"])
def test_close_from_another_thread_waits_for_the_running_call(closer, call):
    rc, out = _race(closer, call)
    assert rc == 0 and "survived" in out, out


def test_close_from_a_signal_handler_inside_a_call_is_refused():
    with pmap.Context(backend="cpu", devices=2) as ctx:
        p = mlp(ctx, width=1024)
        x, y = batch(rows=2048)
        refusals = []

        def handler(signum, frame):
            for obj in (p, ctx):
                try:
                    obj.close()
                except pmap.Error as e:
                    refusals.append(e.message)

        main = threading.get_ident()

        def send():  # once the main thread holds p for its call
            while not p._handle.busy():  # only the main thread uses p
                time.sleep(0.0005)
            signal.pthread_kill(main, signal.SIGUSR1)

        old = signal.signal(signal.SIGUSR1, handler)
        try:
            t = threading.Thread(target=send)
            t.start()
            while t.is_alive():
                loss = p.update(x, y)
            t.join()
        finally:
            signal.signal(signal.SIGUSR1, old)
        assert len(refusals) == 2 and all("would" in m for m in refusals), refusals
        assert np.isfinite(loss) and p.update(x, y) > 0 and p.step >= 2  # both still open


class CloseWhenConverted:
    """An array-like whose conversion closes an object: user code inside a call's arguments."""

    def __init__(self, obj, value):
        self.obj, self.value = obj, value

    def __array__(self, dtype=None, copy=None):
        self.obj.close()
        return np.asarray(self.value, dtype=dtype)

    def __index__(self):
        self.obj.close()
        return int(self.value)


def test_arguments_that_close_the_object_while_converted():
    x, y = batch()
    with pmap.Context(backend="cpu", devices=2) as ctx:
        for call in ("update", "predict", "read", "write"):
            p = mlp(ctx)
            arg = {"update": x, "predict": x, "read": 1, "write": np.zeros(p.count)}[call]
            args = (CloseWhenConverted(p, arg),) + ((y,) if call == "update" else ())
            with pytest.raises(pmap.Error, match="closed"):
                getattr(p, call)(*args)
    ctx = pmap.Context(backend="cpu", devices=2)
    p = mlp(ctx)
    with pytest.raises(pmap.Error, match="closed"):
        p.update(x, CloseWhenConverted(ctx, y))  # closing the context closes p
    with pytest.raises(pmap.Error, match="closed"):
        ctx.devices


def _forked(body, during_update):
    """Forks (optionally while another thread is inside p.update); the child runs body(p, ctx)
    and exits 0 when it returns True. Fails when the child is not done within 60 s."""
    ctx = pmap.Context(backend="cpu", devices=2, timeout=300)
    p = mlp(ctx, width=512 if during_update else 16)
    x, y = batch(rows=512)
    stop, inside = threading.Event(), threading.Event()

    def train():
        while not stop.is_set():
            inside.set()
            p.update(x, y)

    t = threading.Thread(target=train)
    if during_update:
        t.start()
        inside.wait()
        while not p._handle.busy():
            time.sleep(0.0001)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (3.12+)
        pid = os.fork()
    if pid == 0:
        ok = False
        try:
            ok = body(p, ctx, x, y)
        finally:
            os._exit(0 if ok else 1)
    deadline = time.monotonic() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    if not done:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    stop.set()
    if during_update:
        t.join()
    assert np.isfinite(p.update(x, y))  # the parent's objects are unharmed
    ctx.close()
    assert done, "the forked child hung"
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child status {status}"


def _child_refused(p, ctx, x, y):
    for call in (lambda: p.update(x, y), lambda: p.read(), lambda: p.save("x.ckpt"),
                 lambda: ctx.params(pmap.Model(input_shape=(8,)).dense(1), pmap.sgd(0.1))):
        try:
            call()
            return False
        except pmap.Error as e:
            if not re.search(r"process \d+", e.message):
                return False
    p.close()
    ctx.close()  # only forgets them: their threads are the parent's
    m = pmap.Model(input_shape=(2,)).dense(1)  # new objects work
    with pmap.Context(backend="cpu", devices=2) as mine:
        q = mine.params(m, pmap.sgd(0.1))
        return np.isfinite(q.update(np.ones((2, 2), np.float32), np.ones((2, 1), np.float32)))


@pytest.mark.parametrize("during_update", [False, True])
def test_a_forked_child_cannot_use_its_parents_context(during_update):
    _forked(_child_refused, during_update)


def test_version_is_the_projects():
    assert pmap.__version__ == pmap.version()
    root = os.path.join(os.path.dirname(__file__), "..", "..", "meson.build")
    with open(root) as f:
        project = re.search(r"project\([^)]*?version\s*:\s*'([^']+)'", f.read(), re.S).group(1)
    assert pmap.__version__ == project
    try:
        from importlib import metadata
        dist = metadata.distribution("pmap")
    except Exception:
        dist = None  # run from the source tree (PYTHONPATH): no installed metadata to compare
    if dist is not None and os.path.abspath(pmap.__file__).startswith(
            os.path.abspath(str(dist.locate_file("")))):
        assert dist.version == pmap.__version__
