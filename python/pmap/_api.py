"""The Pythonic layer: Context, Model, Params and CustomParams. Arguments are checked by _convert
before they reach the library; every use of a C object goes through its _handle, whose lock a call
holds with a `with` statement on the lock itself (an interrupt cannot leave it held)."""
import ctypes

import numpy as np

from . import _lib
from . import _convert
from . import _custom
from . import _infer
from ._convert import F32, I32, INT32, INT64, array, choice, flag, integer, real
from ._handle import Handle
from ._lib import ArgumentError, ArgumentTypeError, Config, Error, Optimizer, check, lib

_BACKENDS = {"auto": 0, "cpu": 1, "cuda": 2}
_LOSSES = {"mse": 0, "softmax_xent": 1, "token_xent": 2}
_UINT64 = (0, 2 ** 64 - 1)
_COUNT = (1, 2 ** 31 - 1)  # a positive C int


def _no_copy(obj, how):
    raise TypeError(f"a pmap.{type(obj).__name__} cannot be copied or pickled: {how}")


def _pair(name, v):
    if isinstance(v, (tuple, list)) and len(v) == 2:
        return integer(name, v[0], *INT32), integer(name, v[1], *INT32)
    k = integer(name, v, *INT32)
    return k, k


def _model_from_layers(input_shape, layers):
    """Unpickling and copying: the same layers added again, each checked again."""
    m = Model(input_shape)
    for name, args in layers:
        getattr(m, name)(*args)
    return m


class Model:
    """A sequential model: Model(input_shape=(10,)).dense(32).relu().dense(1).loss("mse").
    Each layer is checked when added (pmap.Error with the C message). A Model remembers its
    layers: copy.copy, copy.deepcopy and pickle give an independent model with the same layers.
    Calls from several threads run one after the other."""

    _handle = Handle.never("model")

    def __init__(self, input_shape):
        try:
            dims = list(input_shape)
        except TypeError:
            raise ArgumentTypeError(f"input_shape must be a sequence of extents, got "
                                    f"{type(input_shape).__name__} {input_shape!r}") from None
        shape = tuple(integer("input_shape extent", n, *INT64) for n in dims)
        raw = ctypes.c_void_p()
        c = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        self.input_shape = shape
        self._layers = []  # (method, arguments): what copying and pickling replay
        self._loss = "mse"
        self._tokens = False  # the first layer is an embedding: xs are int32 token ids
        self._handle = Handle("model", raw, lib.pmap_model_destroy, process_bound=False)
        st = lib.pmap_model_create(len(shape), c, ctypes.byref(raw))
        self._handle.created(st)
        check(st)

    def _add(self, method, fn, *args, record=None):
        with self._handle.use(f"Model.{method}") as h:
            check(fn(h, *args))
            self._layers.append((method, args if record is None else record))
        return self

    @staticmethod
    def _shape_of(h):
        rank = ctypes.c_int()
        shape = (ctypes.c_int64 * _lib.MAX_RANK)()
        lib.pmap_model_output_shape(h, ctypes.byref(rank), shape)
        return tuple(shape[i] for i in range(rank.value))

    def dense(self, units):
        return self._add("dense", lib.pmap_model_add_dense, integer("units", units, *INT64))

    def relu(self):
        return self._add("relu", lib.pmap_model_add_relu)

    def conv2d(self, out_channels, kernel=3, stride=1, pad=0):
        oc = integer("out_channels", out_channels, *INT64)
        kh, kw = _pair("kernel", kernel)
        stride, pad = integer("stride", stride, *INT32), integer("pad", pad, *INT32)
        return self._add("conv2d", lib.pmap_model_add_conv2d, oc, kh, kw, stride, pad,
                         record=(oc, (kh, kw), stride, pad))

    def flatten(self):
        return self._add("flatten", lib.pmap_model_add_flatten)

    # The layers of docs/models.md, "Layers".
    def tanh(self):
        return self._add("tanh", lib.pmap_model_add_tanh)

    def sigmoid(self):
        return self._add("sigmoid", lib.pmap_model_add_sigmoid)

    def gelu(self):
        return self._add("gelu", lib.pmap_model_add_gelu)

    def layernorm(self):
        return self._add("layernorm", lib.pmap_model_add_layernorm)

    def _pool(self, method, fn, kernel, stride):
        kh, kw = _pair("kernel", kernel)
        s = kh if stride is None else integer("stride", stride, *INT32)
        return self._add(method, fn, kh, kw, s, record=((kh, kw), s))

    def maxpool2d(self, kernel=2, stride=None):
        """stride None: the kernel's height."""
        return self._pool("maxpool2d", lib.pmap_model_add_maxpool2d, kernel, stride)

    def avgpool2d(self, kernel=2, stride=None):
        """stride None: the kernel's height."""
        return self._pool("avgpool2d", lib.pmap_model_add_avgpool2d, kernel, stride)

    def global_avgpool(self):
        return self._add("global_avgpool", lib.pmap_model_add_global_avgpool)

    def dropout(self, rate):
        return self._add("dropout", lib.pmap_model_add_dropout, real("rate", rate))

    def batchnorm(self, cross_replica=True):
        """Batch norm; cross_replica: statistics of the global batch across devices."""
        return self._add("batchnorm", lib.pmap_model_add_batchnorm,
                         flag("cross_replica", cross_replica))

    # Transformers (docs/models.md, "Transformers").
    def embedding(self, vocab, dim):
        """The first layer of a model of input_shape=(T,): int32 token ids in [0, vocab) ->
        (T, dim) rows of a table (vocab, dim). The model then takes integer xs."""
        self._add("embedding", lib.pmap_model_add_embedding, integer("vocab", vocab, *INT64),
                  integer("dim", dim, *INT64))
        self._tokens = True
        return self

    def pos_embedding(self):
        """(T, D) + a learned (T, D) table."""
        return self._add("pos_embedding", lib.pmap_model_add_pos_embedding)

    def token_dense(self, units):
        """(T, F) -> (T, units): the same dense layer on every token."""
        return self._add("token_dense", lib.pmap_model_add_token_dense,
                         integer("units", units, *INT64))

    def token_layernorm(self):
        """(T, F): each token normalised over its F features."""
        return self._add("token_layernorm", lib.pmap_model_add_token_layernorm)

    def causal_attention(self, heads, head_size):
        """(T, D) -> (T, D): causal multi-head self-attention."""
        return self._add("causal_attention", lib.pmap_model_add_causal_attention,
                         integer("heads", heads, *INT32), integer("head_size", head_size, *INT32))

    def lm_head(self, tied=True):
        """(T, D) -> (T, vocab) logits, with the token embedding's table (tied) or weights of
        its own; sets the loss to "token_xent" (ys: int32 (rows, T) next tokens)."""
        self._add("lm_head", lib.pmap_model_add_lm_head, flag("tied", tied))
        self._loss = "token_xent"
        return self

    @staticmethod
    def _blocks(h):
        """[(name, shape, offset)] of the flat parameter vector, in order, as the layers declare
        them (pmap_model_param_block; docs/models.md, "Parameter blocks"); a tied head has none
        of its own."""
        out, b = [], _lib.ParamBlock()
        for k in range(lib.pmap_model_num_param_blocks(h)):
            check(lib.pmap_model_param_block(h, k, ctypes.byref(b)))
            out.append((b.name.decode(), tuple(b.shape[a] for a in range(b.rank)), b.offset))
        return out

    def begin_residual(self):
        """The layers until end_residual() form f; the block computes x + f(x)."""
        return self._add("begin_residual", lib.pmap_model_begin_residual)

    def end_residual(self):
        return self._add("end_residual", lib.pmap_model_end_residual)

    def loss(self, name):
        """"mse" (float targets) or "softmax_xent" (integer labels)."""
        code = choice("loss", name, _LOSSES)
        with self._handle.hold("Model.loss"):
            check(lib.pmap_model_set_loss(self._handle.get("Model.loss"), code))
            self._layers.append(("loss", (name,)))
            self._loss = name
        return self

    @property
    def num_params(self):
        return self._handle.call("Model.num_params", lib.pmap_model_num_params)

    @property
    def output_shape(self):
        rank = ctypes.c_int()
        shape = (ctypes.c_int64 * _lib.MAX_RANK)()
        self._handle.call("Model.output_shape", lib.pmap_model_output_shape, ctypes.byref(rank),
                          shape)
        return tuple(shape[i] for i in range(rank.value))

    def _recipe(self, call):
        with self._handle.hold(call):
            self._handle.get(call)
            return self.input_shape, tuple(self._layers)

    def __copy__(self):
        return _model_from_layers(*self._recipe("copy.copy(Model)"))

    def __deepcopy__(self, memo):
        return _model_from_layers(*self._recipe("copy.deepcopy(Model)"))

    def __reduce__(self):
        return (_model_from_layers, self._recipe("pickle(Model)"))

    @property
    def parameter_shapes(self):
        """{name: shape} of every parameter block, in the flat vector's order."""
        with self._handle.use("Model.parameter_shapes") as h:
            return {name: shape for name, shape, _ in self._blocks(h)}

    def __repr__(self):
        calls = "".join(f".{m}({', '.join(map(repr, a))})" for m, a in self._layers)
        state = " (closed)" if self._handle.closed else ""
        return f"pmap.Model(input_shape={self.input_shape!r}){calls}{state}"

    def close(self):
        """Frees the model (params made from it keep their own copy). Idempotent."""
        self._handle.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class Context:
    """The device mesh: Context(backend="cpu", devices=4, timeout=0.0, numeric_guard=True,
    uneven_batches=False, shard_optimizer=None, caller_waits=True, max_memory=None,
    recompute="none"). devices: a positive int, or
    None for the backend's default (the C library's PMAP_DEVICES_DEFAULT). shard_optimizer: True
    or "optimizer" shards the optimizer over the devices (ZeRO-1), "grads" the averaged gradient
    too (ZeRO-2: each layer's reduced into the devices' parts as its backward ends; the same
    results; one micro-batch; a model of mostly one layer keeps its gradient whole), False or
    "none" replicates them, None or "auto" leaves it to the library (the PMAP_SHARD_OPTIMIZER
    variable, else the optimizer sharded from 65536 parameters on, or at any size under
    max_memory).
    caller_waits: True gives device 0 a worker thread of its own, so that the calling thread (the
    one Python runs signal handlers on) never runs device work; False runs device 0 on it, one
    thread fewer (params_custom then refuses). max_memory: None for no limit, or the bytes each
    CPU device may hold of what pmap allocates for it (pmap_config.max_memory: the memory plan's
    parts); an allocation past it raises pmap.Error (out of memory) naming the limit.
    recompute: "none" keeps every layer's activations from forward to backward; "full" keeps
    only each residual block's input and computes the block again before its backward (the
    same results, about one block's activations, about one more forward pass:
    pmap_config.recompute); "selective" keeps the GEMMs' outputs of those blocks and computes
    only their element-wise results (layer norms, activation functions) again (the same
    results); "auto" takes the first of "none", "selective" and "full" whose plan fits
    max_memory (on CUDA the device's free memory).

    Close it with close() or a with block; closing it closes its params (each after the call
    running on it, if any). Any thread may use it. It belongs to the process that created it:
    in a forked child every call on it or its params raises pmap.Error at once, and close() only
    forgets it. It cannot be copied or pickled."""

    _handle = Handle.never("context")

    def __init__(self, backend="auto", devices=None, timeout=0.0, numeric_guard=True,
                 uneven_batches=False, shard_optimizer=None, caller_waits=True,
                 max_memory=None, recompute="none"):
        cfg = Config()
        cfg.backend = choice("backend", backend, _BACKENDS)
        cfg.num_devices = -1 if devices is None else integer("devices", devices, *_COUNT)
        cfg.timeout_s = real("timeout", timeout)
        cfg.numeric_guard = 1 - flag("numeric_guard", numeric_guard)
        cfg.uneven_batches = flag("uneven_batches", uneven_batches)
        if shard_optimizer is None or isinstance(shard_optimizer, str):
            cfg.shard_optimizer = choice("shard_optimizer",
                                         "auto" if shard_optimizer is None else shard_optimizer,
                                         {"auto": 0, "none": 1, "optimizer": 2, "grads": 3})
        elif isinstance(shard_optimizer, (bool, np.bool_, int, np.integer)) and \
                int(shard_optimizer) in (0, 1):
            cfg.shard_optimizer = 1 + flag("shard_optimizer", shard_optimizer)
        else:
            raise ArgumentTypeError("shard_optimizer must be None, True, False or one of "
                                    "'auto', 'none', 'optimizer', 'grads'; got "
                                    f"{type(shard_optimizer).__name__} {shard_optimizer!r}")
        cfg.caller_waits = flag("caller_waits", caller_waits)
        cfg.max_memory = 0 if max_memory is None else integer("max_memory", max_memory, 1,
                                                                2 ** 63 - 1)
        cfg.recompute = choice("recompute", recompute,
                               {"none": 0, "full": 1, "auto": 2, "selective": 3})
        self.caller_waits = bool(cfg.caller_waits)
        self._uneven = bool(cfg.uneven_batches)
        self._children = set()  # the handles of its params, closed before it
        raw = ctypes.c_void_p()
        self._handle = Handle("context", raw, lib.pmap_ctx_destroy, process_bound=True)
        st = lib.pmap_ctx_create(ctypes.byref(cfg), ctypes.byref(raw))
        self._handle.created(st)
        check(st)

    @property
    def devices(self):
        return self._handle.call("Context.devices", lib.pmap_ctx_num_devices)

    @property
    def backend(self):
        kind = self._handle.call("Context.backend", lib.pmap_ctx_backend)
        return lib.pmap_backend_name(kind).decode()

    def trace_start(self, path, steps=None):
        """Records a timeline of the context's steps into path (str, bytes or os.PathLike;
        Chrome trace-event JSON, docs/tracing.md): steps None for the last 10, an int K for the
        last K (1 .. 10000), or "A..B" for steps A to B. Written at once (a path that cannot be
        written raises here), again by trace_stop() and when the context closes."""
        p = _convert.path("path", path)
        if steps is None:
            s = None
        elif isinstance(steps, str):
            if "\0" in steps:
                raise ArgumentError(f"steps {steps!r} contains a NUL byte")
            try:
                s = steps.encode("utf-8")
            except UnicodeEncodeError:
                raise ArgumentError(f"steps {steps!r} is not valid text") from None
        else:
            s = str(integer("steps", steps, 1, 10000)).encode()
        check(self._handle.call("Context.trace_start", lib.pmap_trace_start, p, s))

    def trace_stop(self):
        """Writes the recording to its file and ends it (pmap.Error when none is on)."""
        check(self._handle.call("Context.trace_stop", lib.pmap_trace_stop))

    def waits(self):
        """What the collectives cost each device since the context was created: a list, by
        global device, of dicts with device, collectives, busy_s, wait_s and held_s
        (include/pmap.h, pmap_device_waits; the largest held_s is the straggler)."""
        with self._handle.hold("Context.waits"):
            h = self._handle.get("Context.waits")
            n = lib.pmap_ctx_num_devices(h) * lib.pmap_ctx_num_processes(h)
            out = (_lib.DeviceWaits * n)()
            check(lib.pmap_ctx_waits(h, out, n))
        return [{k: getattr(w, k) for k, _ in _lib.DeviceWaits._fields_} for w in out]

    def params(self, model, optimizer, seed=0):
        """Training state of model (copied: the model may be closed after) on every device,
        drawn from seed (0 .. 2**64 - 1)."""
        return Params(self, model, optimizer, seed)

    def params_custom(self, fn, init, optimizer, info=False):
        """Training state of a model given by fn(params, xs, ys) -> (loss, gradient), called on
        every device at once with its rows (pmap_params_create_custom); init: the initial
        parameters, a flat array or a dict of arrays (then fn gets and returns dicts). See
        pmap.CustomParams."""
        return CustomParams(self, fn, init, optimizer, info)

    def _close_children(self):
        for h in list(self._children):
            h.close()
            self._children.discard(h)

    def close(self):
        """Closes every params of the context, then stops its threads. Idempotent."""
        self._handle.close(before=self._close_children)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __copy__(self):
        _no_copy(self, "it owns worker threads and devices; create another pmap.Context")

    def __deepcopy__(self, memo):
        self.__copy__()

    def __reduce_ex__(self, protocol):
        self.__copy__()


_destroy_params = lib.pmap_params_destroy  # the C call itself (Handle._close_locked says why)


_PRECISIONS = ("fp32", "bf16")  # pmap_precision's order


def bf16_support():
    """The CPU's bfloat16 support: a dict of cpu (its instructions: "amx_bf16", "avx512_bf16" or
    "none"), gemm (the CPU GEMM of the bf16 policy: "onednn" or "portable"), reason, and isa
    (the instruction set pmap uses: the CPU's, capped by PMAP_CPU_ISA)."""
    return {"cpu": lib.pmap_cpu_bf16().decode(), "gemm": lib.pmap_bf16_provider().decode(),
            "reason": lib.pmap_bf16_reason().decode(),
            "isa": lib.pmap_cpu_isa().decode() if _lib._HAVE_ISA else "unknown"}


class Params:
    """Replicated training state, made by Context.params(model, optimizer, seed). Any thread may
    use it; calls run one after the other, and close() (or closing its context) waits for a
    running call. A closed params raises pmap.Error on every call and property. It cannot be
    copied or pickled: copy the training state with save()/load() (all of it) or read()/write()
    (the parameters)."""

    _handle = Handle.never("params")

    def __init__(self, ctx, model, optimizer, seed=0):
        if not isinstance(ctx, Context):
            raise ArgumentTypeError(f"ctx must be a pmap.Context, got {type(ctx).__name__}")
        if not isinstance(model, Model):
            raise ArgumentTypeError(f"model must be a pmap.Model, got {type(model).__name__}")
        _check_optimizer(optimizer)
        seed = integer("seed", seed, *_UINT64)
        raw = ctypes.c_void_p()
        with ctx._handle.hold("Context.params"), model._handle.hold("Context.params"):
            c, m = ctx._handle.get("Context.params"), model._handle.get("Context.params")
            out = ctypes.c_int()
            shape = (ctypes.c_int64 * _lib.MAX_RANK)()
            lib.pmap_model_output_shape(m, ctypes.byref(out), shape)
            self._ctx = ctx
            self._classify = model._loss in ("softmax_xent", "token_xent")
            self._next_tokens = model._loss == "token_xent"  # ys: token ids, not class labels
            self._tokens = model._tokens
            self._out = tuple(shape[i] for i in range(out.value))
            self._blocks = model._blocks(m)
            self._handle = Handle("params", raw, _destroy_params, process_bound=True)
            ctx._children.add(self._handle)
            # The handle is the context's before the create call fills raw: no interrupt after
            # the call can leave the params unclosed.
            self._loss, self._uneven = model._loss, ctx._uneven
            self._local_devices = lib.pmap_ctx_num_devices(c)
            self._first_device = lib.pmap_ctx_process_index(c) * self._local_devices
            st = lib.pmap_params_create(c, m, ctypes.byref(optimizer), seed, ctypes.byref(raw))
            self._handle.created(st)
            if st:
                ctx._children.discard(self._handle)
            check(st)

    def _call(self, call, fn, *args):
        return self._handle.call(call, fn, *args)

    @property
    def count(self):
        return self._call("Params.count", lib.pmap_params_count)

    @property
    def sharded(self):
        """Whether the optimizer is sharded over the devices."""
        return bool(self._call("Params.sharded", lib.pmap_params_sharded))

    @property
    def optimizer_bytes(self):
        """Bytes of optimizer state each device holds."""
        return self._call("Params.optimizer_bytes", lib.pmap_params_optimizer_bytes)

    @property
    def step(self):
        """Steps taken (pmap_params_step): after an interrupted update, whether it was."""
        return self._call("Params.step", lib.pmap_params_step)

    def _xs(self, xs, keep):
        if self._tokens:  # token ids: integers, range-checked by the library
            return array(xs, I32, "xs", keep, classes=self._out[-1], kind="token ids")
        return array(xs, F32, "xs", keep)

    def _ys(self, ys, keep):
        if self._classify:
            return array(ys, I32, "ys", keep, classes=self._out[-1],
                         kind="token ids" if self._next_tokens else "labels")
        return array(ys, F32, "ys", keep)

    def update(self, xs, ys):
        """One data-parallel step on the global batch (xs, ys); returns the mean loss.
        xs, and ys for MSE, hold real numbers (converted to float32; a finite value beyond its
        range is refused); labels (softmax_xent) are integers in [0, K). Complex, object or
        string arrays are refused."""
        keep = []
        try:
            x = self._xs(xs, keep)
            y = self._ys(ys, keep)
        except ArgumentError as e:
            self._refuse_step("Params.update", e)
            raise
        loss = ctypes.c_float()
        check(self._call("Params.update", lib.pmap_update, ctypes.byref(x), ctypes.byref(y),
                         ctypes.byref(loss)))
        return float(loss.value)

    def _refuse_step(self, call, e):
        """Across processes, a batch refused here still takes part in the step (the library's
        pmap_update_refuse), so that every process refuses it and they stay in step; the
        caller raises e. A failure of that call shows in the next one."""
        if not _lib._HAVE_REFUSE or not self._handle.ptr:
            return
        try:
            if self._ctx._handle.call(call, lib.pmap_ctx_num_processes) > 1:
                self._call(call, lib.pmap_update_refuse, 1, e.message.encode("utf-8", "replace"))
        except Error:
            pass

    def predict(self, xs, batch_size=None):
        """The model's outputs for xs, an ndarray (rows, outputs...) float32, for any number of
        rows (not only a multiple of the devices), in pieces of at most batch_size rows (None:
        all at once; a smaller piece bounds the activation memory)."""
        return _infer.predict(self, xs, batch_size, "Params.predict")

    def evaluate(self, xs, ys, batch_size=None):
        """The loss on held-out (xs, ys), as update() would report it but nothing trained:
        {"loss": float, "accuracy": float or None (MSE), "rows": int}; accuracy is the share of
        rows (tokens, for a language model) whose largest output is the label. Computed in
        float64 from predict()'s outputs."""
        return _infer.evaluate(self, xs, ys, batch_size, "Params.evaluate")

    def generate(self, prompt, steps, temperature=0.0, seed=0):
        """A language model's continuation of prompt (token ids: a 1-D sequence or bytes, or a
        2-D (rows, length) array): steps new tokens, int32 (steps,) or (rows, steps); greedy at
        temperature 0, else drawn from softmax(logits / temperature) by numpy's generator from
        seed. The model sees the last T tokens of each row."""
        return _infer.generate(self, prompt, steps, temperature, seed, "Params.generate")

    def read(self, device=None):
        """A copy of device `device`'s replica of the parameters (float32, flat): a global device
        index, one of this process's; None for this process's first device (0 in one
        process)."""
        if device is None:
            device = self._first_device
        device = integer("device", device, *INT32)
        with self._handle.hold("Params.read"):
            h = self._handle.get("Params.read")
            out = np.empty(lib.pmap_params_count(h), dtype=np.float32)
            check(lib.pmap_params_read(h, device, out.ctypes.data_as(
                ctypes.POINTER(ctypes.c_float)), out.size))
        return out

    def write(self, values):
        """Sets every replica's parameters to values (count real numbers, any shape)."""
        a = _convert.values(values, "values")
        check(self._call("Params.write", lib.pmap_params_write,
                         a.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), a.size))

    def named(self, device=None):
        """{name: ndarray} of device `device`'s parameters (as read()), each block with its shape
        ("3.causal_attention.wqkv": (D, 3E), ...; Model.parameter_shapes); copies."""
        flat = self.read(device)
        return {name: flat[at:at + int(np.prod(shape))].reshape(shape).copy()
                for name, shape, at in self._blocks}

    def set_named(self, values):
        """Sets the blocks named in values (a dict as named() gives, any subset) on every
        replica, the rest unchanged; a name or shape that does not match is refused before
        anything changes."""
        where = {name: (at, shape) for name, shape, at in self._blocks}
        self.write(_convert.assign_named(self.read(), where, values, "Params.set_named"))

    def memory(self, batch):
        """The device memory a step of update() at this global batch needs on each device, in
        bytes: a dict of params, grads, optimizer, state, activations, staging, total,
        optimizer_sharded and grads_sharded (bools), device_free (None where the backend does not
        know: CPU),
        recompute ("full" when some residual block is computed again, "selective" when the
        element-wise results of some are, else "none"), and the activations of every rung,
        activations_stored, activations_selective and activations_recomputed."""
        batch = integer("batch", batch, *INT64)
        plan = _lib.MemoryPlan()
        check(self._call("Params.memory", lib.pmap_params_memory, batch, ctypes.byref(plan)))
        out = {k: getattr(plan, k) for k, _ in _lib.MemoryPlan._fields_}
        out["optimizer_sharded"] = bool(out["optimizer_sharded"])
        out["grads_sharded"] = bool(out["grads_sharded"])
        if out["device_free"] == ctypes.c_size_t(-1).value:
            out["device_free"] = None
        out["recompute"] = {1: "full", 3: "selective"}.get(out["recompute"], "none")
        return out

    def set_micro_batches(self, k):
        k = integer("micro-batches", k, *INT32)
        check(self._call("Params.set_micro_batches", lib.pmap_params_set_micro_batches, k))

    def set_precision(self, precision):
        """The numeric policy of the following steps and predictions: "fp32" (the default) or
        "bf16" (GEMM operands in bfloat16; float master weights, sums, optimizer and all-reduce:
        docs/precision.md). A checkpoint records it and load() restores it."""
        code = choice("precision", precision, {"fp32": 0, "bf16": 1})
        check(self._call("Params.set_precision", lib.pmap_params_set_precision, code))

    @property
    def precision(self):
        """The numeric policy: "fp32" or "bf16"."""
        return _PRECISIONS[self._call("Params.precision", lib.pmap_params_precision)]

    def save(self, path):
        """Checkpoints the whole training state to path (str, bytes or os.PathLike; atomic)."""
        p = _convert.path("path", path)
        check(self._call("Params.save", lib.pmap_params_save, p))

    def load(self, path):
        """Restores a checkpoint written by save (validated first; nothing changes on error)."""
        p = _convert.path("path", path)
        check(self._call("Params.load", lib.pmap_params_load, p))

    def verify(self):
        """Raises pmap.Error when the replicas differ."""
        check(self._call("Params.verify", lib.pmap_params_verify))

    def close(self):
        """Frees the state on every device, after the call running on it, if any. Idempotent."""
        h = self._handle
        h.close()
        ctx = getattr(self, "_ctx", None)
        if ctx is not None:
            ctx._children.discard(h)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __copy__(self):
        _no_copy(self, "it is training state on the devices of its context; copy the state with "
                       "save(path) and load(path) into params of the same model (everything), "
                       "or read() and write() (the parameters only)")

    def __deepcopy__(self, memo):
        self.__copy__()

    def __reduce_ex__(self, protocol):
        self.__copy__()


def _check_optimizer(optimizer):
    if not isinstance(optimizer, Optimizer):
        raise ArgumentTypeError("optimizer must come from pmap.sgd, pmap.adam or pmap.adamw, "
                                f"got {type(optimizer).__name__}")


class CustomParams(Params):
    """Training state of a model only a Python function knows: ctx.params_custom(fn, init,
    optimizer, info=False). update(xs, ys) runs fn(params, xs, ys) on every device at once, on
    the device's worker thread, with read-only numpy views of the parameters (a flat float32
    array, or a dict of arrays when init was a dict) and of the device's rows of xs (float32) and
    ys (int32 when integers were given, else float32), valid only during the call; fn returns
    (loss, gradient): the mean loss over these rows and its gradient, an array (or dict of
    arrays) of the parameters' shapes, any real dtype (converted to float32). With info=True fn
    also gets a pmap.StepInfo. pmap averages loss and gradient over the devices, and the
    optimizer, the numeric guard (a NaN loss or gradient skips the step: pmap.Error with
    PMAP_ERR_NUMERIC), clipping, micro-batches, save/load work as for any model. An exception in
    fn, or a wrong return value, fails the step on every device with nothing changed: pmap.Error
    naming the device with the exception as __cause__ (pmap.ArgumentError for a wrong return
    value). fn runs under the GIL: devices overlap only where it releases the GIL (numpy's large
    operations, JAX, PyTorch). There is no forward pass pmap knows: predict, evaluate and
    generate refuse."""

    def __init__(self, ctx, fn, init, optimizer, info=False):
        call = "Context.params_custom"
        if not isinstance(ctx, Context):
            raise ArgumentTypeError(f"ctx must be a pmap.Context, got {type(ctx).__name__}")
        if not callable(fn):
            raise ArgumentTypeError(f"{call}: fn must be callable, got {type(fn).__name__}")
        _check_optimizer(optimizer)
        info = bool(flag("info", info))
        flat, layout = _custom.layout_of(init, call)
        if not ctx.caller_waits:
            raise ArgumentError(f"{call}: the context runs device 0 on the calling thread "
                                "(caller_waits=False), where Python may raise a KeyboardInterrupt "
                                "inside fn; create it with caller_waits=True")
        if ctx.backend != "cpu":
            raise ArgumentError(f"{call}: fn gets numpy arrays of host memory, so it needs a CPU "
                                f"context, not {ctx.backend}")
        grad = _custom._Gradient(fn, layout, flat.size, info)
        self._ctx = ctx
        self._loss, self._classify, self._tokens, self._out = None, False, False, ()
        self._next_tokens = False
        self._layout = layout if layout is not None else [("params", (flat.size,))]
        raw = ctypes.c_void_p()
        self._handle = Handle("params", raw, _destroy_params, process_bound=True, keep=grad)
        init_p = flat.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        with ctx._handle.hold(call):
            c = ctx._handle.get(call)
            self._local_devices, self._uneven = lib.pmap_ctx_num_devices(c), ctx._uneven
            self._first_device = lib.pmap_ctx_process_index(c) * self._local_devices
            ctx._children.add(self._handle)
            st = lib.pmap_params_create_custom(c, flat.size, init_p, grad.c, None,
                                               ctypes.byref(optimizer), ctypes.byref(raw))
            self._handle.created(st)
            if st:
                ctx._children.discard(self._handle)
            check(st)

    def update(self, xs, ys):
        """One data-parallel step of fn on the global batch (xs, ys); returns the mean loss."""
        return _custom.update(self, xs, ys, "Params.update")

    def named(self, device=None):
        """{name: ndarray} of device `device`'s parameters (as read()) by init's blocks ({"params": flat} for a flat
        init); copies."""
        return _custom.named(self.read(device), self._layout)

    def set_named(self, values):
        """Sets the blocks named in values on every replica, the rest unchanged; a name or shape
        that does not match is refused before anything changes."""
        self.write(_custom.set_named(self.read(), self._layout, values))

    def _no_forward(self, call):
        raise ArgumentError(f"{call}: custom params have no forward pass pmap knows; compute "
                            "predictions with your own function of read() or named()")

    def predict(self, xs, batch_size=None):
        self._no_forward("Params.predict")

    def evaluate(self, xs, ys, batch_size=None):
        self._no_forward("Params.evaluate")

    def generate(self, prompt, steps, temperature=0.0, seed=0):
        self._no_forward("Params.generate")
