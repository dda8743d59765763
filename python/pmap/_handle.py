"""Lifetime of the C objects behind Model, Context and Params: a call holds its object's lock while
it uses the pointer, so close() from another thread waits for the call instead of freeing what it
uses, and a closed object refuses calls with pmap.Error instead of passing the library a freed
pointer. Also what a forked child may do with its parent's objects."""
import os
import threading
import weakref

from ._lib import Error

# Every live handle, so that a forked child can replace locks that threads of the parent held.
_ALL = weakref.WeakSet()


class Handle:
    """One C object. `with h.use("Params.update") as ptr:` holds the lock for the call; close()
    takes the same lock, so it waits for a running call, destroys the object once and leaves the
    handle closed. A call on the thread that already holds the lock (a signal handler or a
    finaliser that runs inside a call) is refused rather than left waiting for itself."""

    __slots__ = ("what", "ptr", "_destroy", "_lock", "_owner", "_pid", "_bound", "_torn",
                 "__weakref__")

    def __init__(self, what, ptr, destroy, process_bound):
        self.what = what            # "model", "context", "params": for messages
        self.ptr = ptr              # ctypes.c_void_p, None once closed
        self._destroy = destroy     # frees ptr; may raise pmap.Error (then the handle stays open)
        self._lock = threading.Lock()
        self._owner = None          # ident of the thread inside a call
        self._pid = os.getpid()
        self._bound = process_bound  # the object's threads live in the creating process only
        self._torn = False          # a call was running in another thread when this process forked
        _ALL.add(self)

    @classmethod
    def never(cls, what):
        """The handle of an object whose constructor failed (or never ran): always closed."""
        h = cls.__new__(cls)
        h.what, h.ptr, h._destroy, h._lock = what, None, None, threading.Lock()
        h._owner, h._pid, h._bound, h._torn = None, os.getpid(), False, False
        return h

    def use(self, call):
        return _Use(self, call)

    def _acquire(self, call):
        if self.ptr is None:  # closed (checked again under the lock): no lock taken
            raise Error(1, f"{call}: the {self.what} is closed")
        if self._owner == threading.get_ident():
            raise Error(1, f"{call}: a call on this {self.what} is already running on this thread "
                           "(the call comes from a signal handler or a finaliser inside it) and "
                           "would wait for itself; nothing was done")
        self._lock.acquire()
        try:
            if self.ptr is None:
                raise Error(1, f"{call}: the {self.what} is closed")
            if self._torn:
                raise Error(1, f"{call}: this process was forked from process {self._pid} while "
                               f"another thread was inside a call on this {self.what}: its state "
                               "here is undefined")
            self._owner = threading.get_ident()
        except BaseException:
            self._lock.release()
            raise

    def _release(self):
        self._owner = None
        self._lock.release()

    @property
    def closed(self):
        return self.ptr is None

    def close(self, before=None):
        """Waits for a running call, runs before() (closing what depends on this object), then
        destroys it. Idempotent. In a process other than the creating one the C object of a
        process-bound handle is only forgotten: its threads and memory belong to the parent."""
        if self.ptr is None:
            return
        if self._owner == threading.get_ident():
            raise Error(1, f"close: a call on this {self.what} is running on this thread (close "
                           "comes from a signal handler or a finaliser inside it) and would be "
                           f"left with a freed object; the {self.what} stays open")
        with self._lock:
            if self.ptr is None:
                return
            self._owner = threading.get_ident()
            try:
                self._close_locked(before)
            finally:
                self._owner = None

    def _close_locked(self, before):
        if before is not None:
            before()
        ptr, self.ptr = self.ptr, None
        if self._pid != os.getpid() and (self._bound or self._torn):
            return
        try:
            self._destroy(ptr)
        except BaseException:
            self.ptr = ptr
            raise


class _Use:
    __slots__ = ("_h", "_call")

    def __init__(self, h, call):
        self._h, self._call = h, call

    def __enter__(self):
        self._h._acquire(self._call)
        return self._h.ptr

    def __exit__(self, *exc):
        self._h._release()


def _after_fork_in_child():
    # Only the forking thread exists here: a lock another thread held would never be released.
    me = threading.get_ident()
    for h in list(_ALL):
        if not h._lock.locked() or h._owner == me:
            continue  # free, or held by the forking thread itself, which will release it
        h._torn = True  # another thread was inside a call on it (or entering or leaving one)
        h._lock = threading.Lock()
        h._owner = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
