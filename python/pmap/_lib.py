"""Loading libpmap and declaring the C API for ctypes (see include/pmap.h)."""
import ctypes
import ctypes.util
import os

MAX_RANK = 4

# pmap_status values and their names (include/pmap.h).
STATUS_NAMES = {
    0: "PMAP_SUCCESS",
    1: "PMAP_ERR_INVALID_ARGUMENT",
    2: "PMAP_ERR_OUT_OF_MEMORY",
    3: "PMAP_ERR_UNAVAILABLE",
    4: "PMAP_ERR_DEVICE",
    5: "PMAP_ERR_TIMEOUT",
    6: "PMAP_ERR_ABORTED",
    7: "PMAP_ERR_INTERNAL",
    8: "PMAP_ERR_NUMERIC",
}


class Error(RuntimeError):
    """A pmap call failed: .status is the status name (e.g. "PMAP_ERR_INVALID_ARGUMENT"),
    .code its value, .message the library's message naming the call and the values.
    Errors pickle and copy (for multiprocessing) with their code and message."""

    def __init__(self, code, message):
        self.code = int(code)
        self.status = STATUS_NAMES.get(self.code, f"status {self.code}")
        self.message = message
        super().__init__(f"{self.status}: {message}")

    def __reduce__(self):
        return (_rebuild_error, (type(self), self.code, self.message))


def _rebuild_error(cls, code, message):
    e = cls.__new__(cls)
    Error.__init__(e, code, message)
    return e


class ArgumentError(Error, ValueError):
    """An invalid argument (status PMAP_ERR_INVALID_ARGUMENT), caught by the package or by the
    library: both a pmap.Error and a ValueError."""

    def __init__(self, message):
        super().__init__(1, message)


class ArgumentTypeError(ArgumentError, TypeError):
    """An argument of the wrong type (status PMAP_ERR_INVALID_ARGUMENT): a pmap.ArgumentError
    (so a pmap.Error and a ValueError) and a TypeError."""


class Config(ctypes.Structure):
    _fields_ = [
        ("backend", ctypes.c_int),
        ("num_devices", ctypes.c_int),
        ("device_ids", ctypes.POINTER(ctypes.c_int)),
        ("timeout_s", ctypes.c_double),
        ("numeric_guard", ctypes.c_int),
        ("uneven_batches", ctypes.c_int),
        ("dist", ctypes.c_int),
        ("mpi_comm", ctypes.c_void_p),
        ("shard_optimizer", ctypes.c_int),
        ("cuda_graphs", ctypes.c_int),
        ("cuda_overlap", ctypes.c_int),
        ("cuda_bucket_mb", ctypes.c_int),
        ("caller_waits", ctypes.c_int),
        ("max_memory", ctypes.c_size_t),
        ("recompute", ctypes.c_int),
    ]


class Array(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int),
        ("rank", ctypes.c_int),
        ("shape", ctypes.c_int64 * MAX_RANK),
    ]


class GradArgs(ctypes.Structure):
    """pmap_grad_args: what a gradient function receives for one piece of a device's rows."""
    _fields_ = [
        ("dev", ctypes.c_void_p),
        ("params", ctypes.c_void_p),   # (P) const float
        ("grads", ctypes.c_void_p),    # (P) float: += scale * gradient
        ("loss", ctypes.c_void_p),     # one float: = mean loss
        ("scale", ctypes.c_float),
        ("xs", Array),
        ("ys", Array),
        ("row0", ctypes.c_int64),
        ("step", ctypes.c_int64),
        ("num_params", ctypes.c_size_t),
    ]


# pmap_grad_fn; ctypes takes the GIL for a call from any thread.
GRAD_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(GradArgs), ctypes.c_void_p)


class Optimizer(ctypes.Structure):
    _fields_ = [
        ("kind", ctypes.c_int),
        ("lr", ctypes.c_float),
        ("momentum", ctypes.c_float),
        ("beta1", ctypes.c_float),
        ("beta2", ctypes.c_float),
        ("eps", ctypes.c_float),
        ("clip_norm", ctypes.c_float),
        ("weight_decay", ctypes.c_float),
        ("nesterov", ctypes.c_int),
        ("schedule", ctypes.c_int),
        ("warmup_steps", ctypes.c_int64),
        ("decay_steps", ctypes.c_int64),
        ("final_lr", ctypes.c_float),
    ]


class DeviceWaits(ctypes.Structure):
    _fields_ = [
        ("device", ctypes.c_int),
        ("collectives", ctypes.c_int64),
        ("busy_s", ctypes.c_double),
        ("wait_s", ctypes.c_double),
        ("held_s", ctypes.c_double),
    ]


class MemoryPlan(ctypes.Structure):
    _fields_ = [
        ("params", ctypes.c_size_t),
        ("grads", ctypes.c_size_t),
        ("optimizer", ctypes.c_size_t),
        ("state", ctypes.c_size_t),
        ("activations", ctypes.c_size_t),
        ("staging", ctypes.c_size_t),
        ("total", ctypes.c_size_t),
        ("optimizer_sharded", ctypes.c_int),
        ("device_free", ctypes.c_size_t),
        ("recompute", ctypes.c_int),
        ("activations_stored", ctypes.c_size_t),
        ("activations_recomputed", ctypes.c_size_t),
        ("activations_selective", ctypes.c_size_t),
        ("grads_sharded", ctypes.c_int),
    ]


class ParamBlock(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char * 64),  # PMAP_BLOCK_NAME_MAX
        ("kind", ctypes.c_char_p),
        ("block", ctypes.c_char_p),
        ("layer", ctypes.c_int),
        ("trained", ctypes.c_int),
        ("rank", ctypes.c_int),
        ("shape", ctypes.c_int64 * MAX_RANK),
        ("offset", ctypes.c_size_t),
        ("count", ctypes.c_size_t),
    ]


def _find():
    here = os.path.dirname(os.path.abspath(__file__))
    env = os.environ.get("PMAP_LIBRARY")
    candidates = [env] if env else []
    for name in sorted(os.listdir(here)):
        if name.startswith("libpmap.so") or name.startswith("libpmap.") and name.endswith(".dylib"):
            candidates.append(os.path.join(here, name))
    found = ctypes.util.find_library("pmap")
    if found:
        candidates.append(found)
    errors = []
    for path in candidates:
        try:
            return ctypes.CDLL(path)
        except OSError as e:
            errors.append(f"{path}: {e}")
    raise ImportError("pmap: cannot load libpmap (set PMAP_LIBRARY to its path); tried: "
                      + ("; ".join(errors) or "nothing found"))


lib = _find()
_p = ctypes.c_void_p
_status = ctypes.c_int


def _decl(name, res, *args):
    f = getattr(lib, name)
    f.restype = res
    f.argtypes = list(args)
    return f


_decl("pmap_last_error", ctypes.c_char_p)
_decl("pmap_status_string", ctypes.c_char_p, ctypes.c_int)
_decl("pmap_ctx_create", _status, ctypes.POINTER(Config), ctypes.POINTER(_p))
_decl("pmap_ctx_destroy", _status, _p)
_decl("pmap_ctx_num_devices", ctypes.c_int, _p)
_decl("pmap_ctx_process_index", ctypes.c_int, _p)
_decl("pmap_ctx_backend", ctypes.c_int, _p)
_decl("pmap_backend_name", ctypes.c_char_p, ctypes.c_int)
_decl("pmap_backend_parse", _status, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int))
_decl("pmap_model_create", _status, ctypes.c_int, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(_p))
_decl("pmap_model_destroy", None, _p)
_decl("pmap_model_add_dense", _status, _p, ctypes.c_int64)
_decl("pmap_model_add_relu", _status, _p)
_decl("pmap_model_add_conv2d", _status, _p, ctypes.c_int64, ctypes.c_int, ctypes.c_int,
      ctypes.c_int, ctypes.c_int)
_decl("pmap_model_add_flatten", _status, _p)
_decl("pmap_model_set_loss", _status, _p, ctypes.c_int)
for _name in ("tanh", "sigmoid", "gelu", "layernorm", "global_avgpool"):
    _decl("pmap_model_add_" + _name, _status, _p)
_decl("pmap_model_add_maxpool2d", _status, _p, ctypes.c_int, ctypes.c_int, ctypes.c_int)
_decl("pmap_model_add_avgpool2d", _status, _p, ctypes.c_int, ctypes.c_int, ctypes.c_int)
_decl("pmap_model_add_dropout", _status, _p, ctypes.c_float)
_decl("pmap_model_add_batchnorm", _status, _p, ctypes.c_int)
_decl("pmap_model_add_embedding", _status, _p, ctypes.c_int64, ctypes.c_int64)
_decl("pmap_model_add_pos_embedding", _status, _p)
_decl("pmap_model_add_token_dense", _status, _p, ctypes.c_int64)
_decl("pmap_model_add_token_layernorm", _status, _p)
_decl("pmap_model_add_causal_attention", _status, _p, ctypes.c_int, ctypes.c_int)
_decl("pmap_model_add_lm_head", _status, _p, ctypes.c_int)
_decl("pmap_model_begin_residual", _status, _p)
_decl("pmap_model_end_residual", _status, _p)
_decl("pmap_model_num_params", ctypes.c_size_t, _p)
_decl("pmap_model_output_shape", None, _p, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int64))
_decl("pmap_model_num_param_blocks", ctypes.c_size_t, _p)
_decl("pmap_model_param_block", _status, _p, ctypes.c_size_t, ctypes.POINTER(ParamBlock))
_decl("pmap_params_create", _status, _p, _p, ctypes.POINTER(Optimizer), ctypes.c_uint64,
      ctypes.POINTER(_p))
_decl("pmap_params_destroy", None, _p)
_decl("pmap_params_count", ctypes.c_size_t, _p)
_decl("pmap_params_optimizer_bytes", ctypes.c_size_t, _p)
_decl("pmap_params_sharded", ctypes.c_int, _p)
_decl("pmap_params_step", ctypes.c_int64, _p)
_decl("pmap_update", _status, _p, ctypes.POINTER(Array), ctypes.POINTER(Array),
      ctypes.POINTER(ctypes.c_float))
_decl("pmap_predict", _status, _p, ctypes.POINTER(Array), ctypes.POINTER(Array))
_decl("pmap_params_read", _status, _p, ctypes.c_int, ctypes.POINTER(ctypes.c_float), ctypes.c_size_t)
_decl("pmap_params_write", _status, _p, ctypes.POINTER(ctypes.c_float), ctypes.c_size_t)
_decl("pmap_params_set_micro_batches", _status, _p, ctypes.c_int)
_decl("pmap_params_create_custom", _status, _p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_float),
      GRAD_FN, _p, ctypes.POINTER(Optimizer), ctypes.POINTER(_p))
_decl("pmap_axis_index", ctypes.c_int, _p)
_decl("pmap_set_error", _status, ctypes.c_int, ctypes.c_char_p)  # (status, "%s", text)
_decl("pmap_axis_size", ctypes.c_int, _p)
_decl("pmap_params_shrink", _status, _p)
_HAVE_CKPT = hasattr(lib, "pmap_params_save")
if _HAVE_CKPT:
    _decl("pmap_params_save", _status, _p, ctypes.c_char_p)
    _decl("pmap_params_load", _status, _p, ctypes.c_char_p)
_HAVE_VERIFY = hasattr(lib, "pmap_params_verify")
if _HAVE_VERIFY:
    _decl("pmap_params_verify", _status, _p)
_HAVE_OBSERVE = hasattr(lib, "pmap_trace_start")
if _HAVE_OBSERVE:
    _decl("pmap_ctx_num_processes", ctypes.c_int, _p)
    _decl("pmap_trace_start", _status, _p, ctypes.c_char_p, ctypes.c_char_p)
    _decl("pmap_trace_stop", _status, _p)
    _decl("pmap_ctx_waits", _status, _p, ctypes.POINTER(DeviceWaits), ctypes.c_int)
    _decl("pmap_params_memory", _status, _p, ctypes.c_int64, ctypes.POINTER(MemoryPlan))
_HAVE_PRECISION = hasattr(lib, "pmap_params_set_precision")
if _HAVE_PRECISION:
    _decl("pmap_params_set_precision", _status, _p, ctypes.c_int)
    _decl("pmap_params_precision", ctypes.c_int, _p)
    _decl("pmap_precision_name", ctypes.c_char_p, ctypes.c_int)
    _decl("pmap_cpu_bf16", ctypes.c_char_p)
    _decl("pmap_bf16_provider", ctypes.c_char_p)
    _decl("pmap_bf16_reason", ctypes.c_char_p)
_HAVE_ISA = hasattr(lib, "pmap_cpu_isa")
if _HAVE_ISA:
    _decl("pmap_cpu_isa", ctypes.c_char_p)
_HAVE_REFUSE = hasattr(lib, "pmap_update_refuse")
if _HAVE_REFUSE:
    _decl("pmap_update_refuse", _status, _p, ctypes.c_int, ctypes.c_char_p)
_HAVE_VERSION = hasattr(lib, "pmap_version")
if _HAVE_VERSION:
    _decl("pmap_version", ctypes.c_char_p)


def check(status):
    """Raises Error for a failed call, with the library's message of this thread: ArgumentError
    (also a ValueError) for PMAP_ERR_INVALID_ARGUMENT."""
    if status != 0:
        message = lib.pmap_last_error().decode("utf-8", "replace")
        raise ArgumentError(message) if status == 1 else Error(status, message)


def version():
    """The C library's version string."""
    return lib.pmap_version().decode() if _HAVE_VERSION else "unknown"
