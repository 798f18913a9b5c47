"""Count into prometheus_client's multiprocess files at a fraction of its own cost per write.

prometheus_client's ``inc``/``observe`` cost about 1.3 µs a value: four Python calls, its lock
and a ``getpid`` system call per write (BENCHMARKS.md, "Metrics cost"). A ``Writer`` keeps the
same value objects (``MmapedValue``) and writes the same 16 bytes (value, timestamp 0) at the
same place of the same file, so the exposition (``MultiProcessCollector``) and the files are
exactly as prometheus_client's own writes leave them; nothing is held back in the worker, so a
killed worker loses nothing. What it saves: the Python layers, and the ``getpid`` per write,
replaced by a flag set after a fork (``os.register_at_fork``); after one, the first write lets
prometheus_client itself move every value to the child's files. Every write is under
prometheus_client's own lock, so gthread workers and its other writers stay serialised.

It relies on prometheus_client internals: ``Writer.of`` returns None when they are not as
expected, and the caller then uses the public API (correct, slower). tests/test_metrics_values.py.
"""

from __future__ import annotations

import bisect
import os
import struct
import weakref

_PACK = struct.Struct("dd").pack


class Writer:
    """Increments of ``MmapedValue`` objects of one prometheus_client value class (one per process)."""

    def __init__(self, lock):
        self.lock = lock
        self.forked = True  # so the first write checks, in case the values were made before a fork
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _mark_forked(ref))

    @classmethod
    def of(cls, value_class, sample) -> Writer | None:
        """A Writer for ``value_class`` when it is the multiprocess one this module knows
        (``sample``: one of its values), else None."""
        if not getattr(value_class, "_multiprocess", False):
            return None
        try:
            lock = dict(zip(value_class.inc.__code__.co_freevars, value_class.inc.__closure__,
                            strict=True))["lock"].cell_contents
            file, key = sample._file, sample._key
            ok = (isinstance(sample._value, float) and hasattr(lock, "acquire") and hasattr(sample, "get")
                  and isinstance(file._positions[key], int) and file._m is not None)
        except (AttributeError, KeyError, TypeError, ValueError):
            return None
        return cls(lock) if ok else None

    def refresh(self, value) -> None:
        """After a fork: prometheus_client's own check (under its lock) moves every value to this
        process's files, with this process's counts (none yet)."""
        value.get()
        self.forked = False

    def inc(self, value, amount: float = 1.0) -> None:
        """``value.inc(amount)`` of prometheus_client, without its Python layers and getpid."""
        if self.forked:
            self.refresh(value)
        lock = self.lock
        lock.acquire()  # not "with": its special-method lookups cost as much again as the lock
        try:
            value._value += amount
            file = value._file
            pos = file._positions[value._key]
            file._m[pos:pos + 16] = _PACK(value._value, 0.0)
        finally:
            lock.release()

    def observe(self, histogram_sum, buckets, bounds, amount: float) -> None:
        """``Histogram.observe(amount)`` of prometheus_client: its sum and the one bucket
        (cumulated at scrape) that holds ``amount``, under one lock."""
        if self.forked:
            self.refresh(histogram_sum)
        bucket = buckets[bisect.bisect_left(bounds, amount)]
        lock = self.lock
        lock.acquire()
        try:
            histogram_sum._value += amount
            file = histogram_sum._file
            pos = file._positions[histogram_sum._key]
            file._m[pos:pos + 16] = _PACK(histogram_sum._value, 0.0)
            bucket._value += 1.0
            file = bucket._file
            pos = file._positions[bucket._key]
            file._m[pos:pos + 16] = _PACK(bucket._value, 0.0)
        finally:
            lock.release()


def _mark_forked(ref: weakref.ref) -> None:
    writer = ref()
    if writer is not None:
        writer.forked = True
