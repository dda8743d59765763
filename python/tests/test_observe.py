"""Seeing a run from Python: Context.trace_start/trace_stop (a timeline file), Context.waits()
(what the collectives cost each device) and Params.memory(batch) (a step's device memory), with
their refusals."""
import json
import os
import stat

import numpy as np
import pytest

import pmap

DEVICES = 3


def model():
    return pmap.Model(input_shape=(6,)).dense(10).gelu().dense(4).loss("softmax_xent")


def residual_model():
    return (pmap.Model(input_shape=(6,)).dense(10).begin_residual().layernorm().dense(10).gelu()
            .dropout(0.2).dense(10).end_residual().begin_residual().dense(10).tanh()
            .end_residual().dense(4).loss("softmax_xent"))


def data(rows=12, seed=1):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((rows, 6)).astype(np.float32), rng.integers(0, 4, rows)


@pytest.fixture
def run():
    with pmap.Context(backend="cpu", devices=DEVICES) as ctx:
        with ctx.params(model(), pmap.adam(1e-2), seed=3) as params:
            yield ctx, params


def test_trace_records_the_steps(run, tmp_path):
    ctx, params = run
    path = tmp_path / "run.json"
    ctx.trace_start(path, steps=2)
    assert path.exists()  # written at once
    xs, ys = data()
    for _ in range(5):
        params.update(xs, ys)
    ctx.trace_stop()
    events = json.loads(path.read_text())["traceEvents"]
    steps = [e for e in events if e.get("name") == "step" and e.get("ph") == "X"]
    assert len(steps) == 2 * DEVICES, steps  # the last 2 steps on every device
    names = {e.get("name") for e in events}
    assert any(n.startswith("forward") for n in names), names
    assert any(n.startswith("backward") for n in names), names
    with pytest.raises(pmap.Error, match="PMAP_ERR_INVALID_ARGUMENT"):
        ctx.trace_stop()  # none on any more


def test_trace_window_and_paths(run, tmp_path):
    ctx, params = run
    xs, ys = data()
    ctx.trace_start(os.fsencode(tmp_path / "a.json"), steps="2..3")
    with pytest.raises(pmap.Error, match="PMAP_ERR_INVALID_ARGUMENT"):
        ctx.trace_start(tmp_path / "b.json")  # one recording at a time
    for _ in range(4):
        params.update(xs, ys)
    ctx.trace_stop()
    events = json.loads((tmp_path / "a.json").read_text())["traceEvents"]
    assert len([e for e in events if e.get("name") == "step"]) == 2 * DEVICES
    ctx.trace_start(str(tmp_path / "c.json"))  # the default window, a str path
    params.update(xs, ys)
    ctx.trace_stop()


@pytest.mark.parametrize("steps", [0, 10001, -1, "0", "abc", "3..2", "1..20000", ""])
def test_trace_refuses_bad_windows(run, tmp_path, steps):
    ctx, _ = run
    path = tmp_path / "t.json"
    if steps == "":  # the empty string is the default window, as NULL
        ctx.trace_start(path, steps)
        ctx.trace_stop()
        return
    with pytest.raises(pmap.Error, match="PMAP_ERR_INVALID_ARGUMENT"):
        ctx.trace_start(path, steps)
    with pytest.raises(pmap.Error, match="PMAP_ERR_INVALID_ARGUMENT"):
        ctx.trace_stop()  # nothing was started


@pytest.mark.parametrize("steps", [True, 2.0, b"3", [3]])
def test_trace_refuses_bad_types(run, tmp_path, steps):
    ctx, _ = run
    with pytest.raises(pmap.ArgumentTypeError):
        ctx.trace_start(tmp_path / "t.json", steps)


def test_trace_refuses_bad_paths(run, tmp_path):
    ctx, _ = run
    with pytest.raises(pmap.Error, match="PMAP_ERR_UNAVAILABLE"):
        ctx.trace_start(tmp_path / "no" / "such" / "dir.json")
    with pytest.raises(pmap.ArgumentError, match="NUL"):
        ctx.trace_start("a\0b.json")
    with pytest.raises(pmap.ArgumentError, match="NUL"):
        ctx.trace_start(tmp_path / "t.json", "1\0")
    with pytest.raises(pmap.ArgumentTypeError):
        ctx.trace_start(None)
    with pytest.raises(pmap.ArgumentError, match="not valid text"):
        ctx.trace_start(tmp_path / "t.json", "\ud800")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(pmap.Error, match="not a regular file"):
        ctx.trace_start(fifo)  # refused, never replaced by a regular file
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    with pytest.raises(pmap.Error, match="PMAP_ERR_INVALID_ARGUMENT"):
        ctx.trace_stop()  # none of these started a recording


def test_waits_count_the_collectives(run):
    ctx, params = run
    before = ctx.waits()
    assert [w["device"] for w in before] == list(range(DEVICES))
    xs, ys = data()
    for _ in range(4):
        params.update(xs, ys)
    after = ctx.waits()
    for b, a in zip(before, after):
        assert set(a) == {"device", "collectives", "busy_s", "wait_s", "held_s"}
        assert a["collectives"] >= b["collectives"] + 4, (b, a)
        for k in ("busy_s", "wait_s", "held_s"):
            assert a[k] >= b[k] >= 0.0, (k, b, a)


def test_memory_plan(run):
    ctx, params = run
    plan = params.memory(12)
    parts = ("params", "grads", "optimizer", "state", "activations", "staging")
    assert plan["total"] == sum(plan[k] for k in parts), plan
    assert plan["params"] >= params.count * 4
    assert plan["activations"] > 0
    assert plan["device_free"] is None  # CPU: not known
    assert isinstance(plan["optimizer_sharded"], bool)
    assert params.memory(24)["activations"] > plan["activations"]
    for bad in (0, -3, 13, 2 ** 62):
        with pytest.raises(pmap.Error, match="PMAP_ERR_INVALID_ARGUMENT"):
            params.memory(bad)
    for bad in (True, 12.0, "12", None):
        with pytest.raises(pmap.ArgumentTypeError):
            params.memory(bad)


def test_memory_limit():
    """max_memory at the plan trains as without a limit, to the bit; a byte under it raises at
    the step, naming the limit, with the parameters unchanged. Under a limit the optimizer is
    sharded at any size (shard_optimizer=None), so the plan is read under one."""
    x, y = data()
    got = {}
    with pmap.Context(backend="cpu", devices=DEVICES) as ctx:
        with ctx.params(model(), pmap.adam(1e-2), seed=3) as params:
            assert not params.sharded
            params.update(x, y)
            got[None] = params.read()
    with pmap.Context(backend="cpu", devices=DEVICES, max_memory=2 ** 40) as ctx:
        with ctx.params(model(), pmap.adam(1e-2), seed=3) as params:
            assert params.sharded == (DEVICES > 1)
            total = params.memory(12)["total"]
    for limit in (total, total - 1):
        with pmap.Context(backend="cpu", devices=DEVICES, max_memory=limit) as ctx:
            with ctx.params(model(), pmap.adam(1e-2), seed=3) as params:
                before = params.read()
                if limit == total:
                    params.update(x, y)
                    assert np.array_equal(params.read(), got[None])
                else:
                    with pytest.raises(pmap.Error, match="max_memory"):
                        params.update(x, y)
                    assert np.array_equal(params.read(), before)
    for bad in (0, -1, 2 ** 63):
        with pytest.raises(pmap.ArgumentError):
            pmap.Context(backend="cpu", devices=1, max_memory=bad)
    for bad in (True, 1.5, "1G"):
        with pytest.raises(pmap.ArgumentTypeError):
            pmap.Context(backend="cpu", devices=1, max_memory=bad)


def test_recompute():
    """recompute="full" and "selective" on residual blocks: the same bits as "none", fewer
    activation bytes in the plan, and the plan says which; "auto" takes the first rung that fits
    max_memory; other values are refused."""
    x, y = data()
    got, plans = {}, {}
    for mode in ("none", "full", "selective"):
        with pmap.Context(backend="cpu", devices=DEVICES, recompute=mode,
                          shard_optimizer=False) as ctx:
            with ctx.params(residual_model(), pmap.adam(1e-2), seed=3) as params:
                plans[mode] = params.memory(12)
                for _ in range(3):
                    params.update(x, y)
                got[mode] = params.read()
    assert np.array_equal(got["none"], got["full"])
    assert np.array_equal(got["none"], got["selective"])
    for mode, plan in plans.items():
        assert plan["recompute"] == mode, plan
        assert plan["activations_stored"] == plans["none"]["activations"], plan
        assert plan["activations_recomputed"] == plans["full"]["activations"], plan
        assert plan["activations_selective"] == plans["selective"]["activations"], plan
    assert (plans["full"]["activations"] < plans["selective"]["activations"]
            < plans["none"]["activations"]), plans
    # auto: under a limit only the full plan fits, full; under the selective plan's, selective.
    for mode in ("full", "selective"):
        with pmap.Context(backend="cpu", devices=DEVICES, recompute="auto",
                          shard_optimizer=False, max_memory=plans[mode]["total"]) as ctx:
            with ctx.params(residual_model(), pmap.adam(1e-2), seed=3) as params:
                assert params.memory(12)["recompute"] == mode
                for _ in range(3):
                    params.update(x, y)
                assert np.array_equal(params.read(), got["none"])
    with pytest.raises(pmap.ArgumentError):
        pmap.Context(backend="cpu", devices=1, recompute="partial")
    for bad in (1, True, None):
        with pytest.raises(pmap.ArgumentTypeError):
            pmap.Context(backend="cpu", devices=1, recompute=bad)


def test_sharded_gradients():
    """shard_optimizer="grads": the same bits as "optimizer" and as replicated, with recomputation
    too; the plan holds a part of the gradients; micro-batches are refused; other values too."""
    x, y = data()
    got, plans = {}, {}
    for shard in ("none", "optimizer", "grads", False, True):
        for recompute in ("none", "full"):
            with pmap.Context(backend="cpu", devices=DEVICES, shard_optimizer=shard,
                              recompute=recompute) as ctx:
                with ctx.params(residual_model(), pmap.adam(1e-2), seed=3) as params:
                    plans[shard, recompute] = params.memory(12)
                    losses = [params.update(x, y) for _ in range(3)]
                    got[shard, recompute] = (losses, params.read(), params.sharded)
                    if shard == "grads":
                        with pytest.raises(pmap.ArgumentError, match="2 micro-batches"):
                            params.set_micro_batches(2)
    for key, (losses, w, sharded) in got.items():
        assert losses == got["none", "none"][0], key
        assert np.array_equal(w, got["none", "none"][1]), key
    plan, whole = plans["grads", "none"], plans["optimizer", "none"]
    assert plan["grads_sharded"] and plan["optimizer_sharded"] and got["grads", "none"][2]
    assert not whole["grads_sharded"] and plan["grads"] < whole["grads"], (plan, whole)
    assert plans[True, "none"] == whole and not plans[False, "none"]["optimizer_sharded"]
    with pytest.raises(pmap.ArgumentError):
        pmap.Context(backend="cpu", devices=1, shard_optimizer="params")
    for bad in (2, 0.5, b"grads"):
        with pytest.raises(pmap.ArgumentTypeError, match="'grads'"):
            pmap.Context(backend="cpu", devices=1, shard_optimizer=bad)


def test_closed_objects_raise(tmp_path):
    ctx = pmap.Context(backend="cpu", devices=2)
    params = ctx.params(model(), pmap.sgd(0.1), seed=0)
    ctx.close()
    for call in (lambda: ctx.trace_start(tmp_path / "t.json"), ctx.trace_stop, ctx.waits,
                 lambda: params.memory(4)):
        with pytest.raises(pmap.Error):
            call()
