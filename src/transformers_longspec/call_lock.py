"""One LongSpec call at a time per target and draft, with truthful statistics on every exit.

A LongSpec call owns mutable state on its models (the target's attention setting during the loop, the draft's static
engine, ring cache and `last_generation_stats`), so two threads sharing a target or a draft are serialised: the second
call waits for the first. A nested call from the running call's own thread (a streamer or logits processor calling
`generate` again) would wait forever and is refused instead.

Reference: `threading.Lock`; transformers `GenerationMixin.generate` (the calls this guards).
"""

from __future__ import annotations

import functools
import threading
import time
import weakref
from contextlib import contextmanager

_CALL_LOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> _CallLock
_CALL_LOCKS_GUARD = threading.Lock()


class _CallLock:
    """One LongSpec call at a time per model: a lock and the thread holding it (to refuse a nested call)."""

    def __init__(self):
        self.lock, self.owner = threading.Lock(), None


def _call_lock(model) -> _CallLock:
    with _CALL_LOCKS_GUARD:
        return _CALL_LOCKS.setdefault(model, _CallLock())


@contextmanager
def _exclusive(*models):
    """Within the block, no other LongSpec call uses any of `models` (target, draft): a call from another thread
    waits for this one. The locks are taken in one global order, so two calls never wait for each other.

    Raises: ValueError for a nested call from the thread already running one (a streamer or logits processor calling
        generate again), which would otherwise wait forever.
    """
    locks = [lock for _, lock in sorted((id(m), _call_lock(m)) for m in {id(m): m for m in models}.values())]
    if any(lock.owner == threading.get_ident() for lock in locks):
        raise ValueError("a LongSpec generate call with this target or draft is already running in this thread "
                         "(called from a streamer, logits processor or stopping criterion?); make the second call "
                         "after the first returns, or give it its own target and draft")
    taken = []
    try:
        for lock in locks:
            lock.lock.acquire()
            lock.owner = threading.get_ident()
            taken.append(lock)
        yield
    finally:
        for lock in reversed(taken):
            lock.owner = None
            lock.lock.release()


def clear_stats_unless_running(draft) -> None:
    """Set `draft.last_generation_stats` to None, unless a call with this draft is running (then it owns them).
    Called where `generate` starts, so that a call refused before the decode loop leaves no stale statistics."""
    lock = _call_lock(draft)
    if lock.lock.acquire(blocking=False):
        try:
            draft.last_generation_stats = None
        finally:
            lock.lock.release()


def one_call_at_a_time(decode):
    """`longspec_tree_decode` under `_exclusive(target, draft)`, with truthful statistics on every exit: None until
    the call is accepted, `finished=True` after a normal return, the seconds spent when it raised or was interrupted.
    (The target's attention implementation is restored by `compat.tree_attention` on every exit.)"""

    @functools.wraps(decode)
    def run(target, draft, *args, **kwargs):
        with _exclusive(target, draft):
            draft.last_generation_stats = None
            start = time.perf_counter()
            try:
                result = decode(target, draft, *args, **kwargs)
            except BaseException:
                if draft.last_generation_stats is not None:
                    draft.last_generation_stats.total_s = time.perf_counter() - start
                raise
            draft.last_generation_stats.finished = True
            return result

    return run


__all__ = ["clear_stats_unless_running", "one_call_at_a_time"]
