"""Lifetime of the C objects behind Model, Context and Params: a call holds its object's lock while
it uses the pointer, so close() from another thread waits for the call instead of freeing what it
uses, and a closed object refuses calls with pmap.Error instead of passing the library a freed
pointer. Also what a forked child may do with its parent's objects.

Ctrl-C. Python raises KeyboardInterrupt after any call returns and at the start of any Python
function, so a lock released by a context manager's Python __exit__ is left held when the
exception lands there. The lock here is the interpreter's own RLock, taken by a `with` statement
on the lock itself (hold()) or on use()'s manager, whose __exit__ is the lock's C method: since
Python 3.10 a C __exit__ runs whenever __enter__ returned, so no interrupt leaves the lock held
(python/tests/interrupt_storm.py sends hundreds)."""
import ctypes
import os
import threading
import weakref

from ._lib import ArgumentError, check

_REFUSED = 1  # PMAP_ERR_INVALID_ARGUMENT: a destroy that changed nothing

# Every live handle, so that a forked child can replace locks that threads of the parent held.
_ALL = weakref.WeakSet()


class Handle:
    """One C object. A call is

        with h.hold("Params.update"):
            check(lib.pmap_update(h.get("Params.update"), ...))

    or h.call("Params.update", fn, *args) for fn(pointer, *args). close() takes the same lock, so
    it waits for a running call, destroys the object once and leaves the handle closed. A call on
    the thread that already holds the lock (a signal handler or a finaliser that runs inside a
    call) is refused rather than left waiting for itself."""

    __slots__ = ("what", "ptr", "keep", "_destroy", "_lock", "_use", "_pid", "_bound", "_torn",
                 "__weakref__")

    def __init__(self, what, ptr, destroy, process_bound, keep=None):
        """The handle of the C object in ptr (a ctypes.c_void_p, kept as it is): one a create call
        wrote already, or an empty one that the create call is about to write (pass
        ctypes.byref(ptr), then created(status)), so that no interrupt after the call can lose
        the object. keep: what the C object uses (a callback) and must outlive it."""
        self.what = what            # "model", "context", "params": for messages
        self.ptr = ptr              # None once closed or never created
        self.keep = keep
        self._destroy = destroy     # the C destroy function itself (a Python wrapper would give
        #                             an interrupt a place between forgetting and destroying)
        self._set_lock(threading.RLock())
        self._pid = os.getpid()
        self._bound = process_bound  # the object's threads live in the creating process only
        self._torn = False          # a call was running in another thread when this process forked
        _ALL.add(self)

    def created(self, status):
        """After the create call: a handle whose call failed (or wrote no object) is closed."""
        if status != 0 or not self.ptr.value:
            self.ptr = self.keep = None

    @classmethod
    def never(cls, what):
        """The handle of an object whose constructor failed (or never ran): always closed."""
        h = cls.__new__(cls)
        h.what, h.ptr, h.keep, h._destroy = what, None, None, None
        h._set_lock(threading.RLock())
        h._pid, h._bound, h._torn = os.getpid(), False, False
        return h

    def _set_lock(self, lock):
        self._lock = lock
        # use()'s context manager: its __exit__ is the lock's own (C) method, so that no
        # interrupt can come between leaving the block and releasing the lock.
        self._use = type("_Use", (_Use,), {"__slots__": (), "__exit__": lock.__exit__})

    def _refuse_reentry(self, call, action):
        if self._lock._is_owned():
            raise ArgumentError(f"{call}: a call on this {self.what} is already running on this "
                                "thread (the call comes from a signal handler or a finaliser "
                                f"inside it) and {action}")

    def hold(self, call):
        """The lock to hold, as `with h.hold(call):`, for the whole use of the pointer. Refuses a
        closed object at once, and a call from the thread that holds the lock already."""
        if not self.ptr:
            raise ArgumentError(f"{call}: the {self.what} is closed")
        self._refuse_reentry(call, "would wait for itself; nothing was done")
        return self._lock

    def get(self, call):
        """Inside hold(): the pointer, or pmap.Error when the object was closed meanwhile or its
        state is unknown in this forked process."""
        if not self.ptr:
            raise ArgumentError(f"{call}: the {self.what} is closed")
        if self._torn:
            raise ArgumentError(f"{call}: this process was forked from process {self._pid} while "
                           f"another thread was inside a call on this {self.what}: its state "
                           "here is undefined")
        return self.ptr

    def call(self, call, fn, *args):
        """fn(pointer, *args) under the lock."""
        with self.hold(call):
            return fn(self.get(call), *args)

    def busy(self):
        """Whether another thread holds the lock now (a probe: it may change at once)."""
        if self._lock._is_owned():
            return False
        if self._lock.acquire(blocking=False):
            self._lock.release()
            return False
        return True

    @property
    def closed(self):
        return not self.ptr

    def close(self, before=None):
        """Waits for a running call, runs before() (closing what depends on this object), then
        destroys it. Idempotent. In a process other than the creating one the C object of a
        process-bound handle is only forgotten: its threads and memory belong to the parent."""
        if not self.ptr:
            return
        self._refuse_reentry("close", "would be left with a freed object; the "
                                      f"{self.what} stays open")
        with self._lock:
            if not self.ptr:
                return
            if before is not None:
                before()
            self._close_locked()

    def _close_locked(self):
        forget = self._pid != os.getpid() and (self._bound or self._torn)
        destroy = self._destroy
        # From forgetting the pointer to the C call nothing here calls out, so Python has no
        # point to raise a KeyboardInterrupt at: it lands after the object is destroyed.
        ptr, self.ptr = self.ptr, None
        if forget:
            return
        status = destroy(ptr)
        if status == _REFUSED:
            self.ptr = ptr  # the library refused (a context with live params): still open
            check(status)
        self.keep = None
        # Any other failure destroyed the object all the same (across processes: another
        # process did not destroy its context in time, which the message names).
        if status:
            check(status)

    def use(self, call):
        """`with h.use(call) as ptr:`, hold() and get() in one: the lock is released by its own
        __exit__, and an interrupt just after __enter__ took it gives it back there."""
        return self._use(self, call)


class _Use:
    """The base of each handle's use() class, which adds the lock's __exit__."""
    __slots__ = ("_h", "_call")

    def __init__(self, h, call):
        self._h, self._call = h, call

    def __enter__(self):
        h = self._h
        lock = h.hold(self._call)  # refuses a closed object and a call from the holding thread
        try:
            lock.acquire()
            return h.get(self._call)
        except BaseException:
            if lock._is_owned():  # taken here: hold() refused a thread that held it before
                lock.release()
            raise


def _after_fork_in_child():
    # Only the forking thread exists here: a lock another thread held would never be released.
    for h in list(_ALL):
        lock = h._lock
        if lock._is_owned():
            continue  # held by the forking thread itself, which will release it
        if lock.acquire(blocking=False):
            lock.release()
            continue
        h._torn = True  # another thread was inside a call on it (or entering or leaving one)
        h._set_lock(threading.RLock())


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
