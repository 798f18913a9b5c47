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
from collections.abc import Callable
from typing import Any

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

    def counter(self, value_of: Callable[[tuple], Any]) -> Callable[..., None]:
        """``inc(*labels)``: prometheus_client's ``counter.labels(*labels).inc()``, without its
        Python layers and getpid. ``value_of(labels)``: the child's value, for labels not seen before."""
        values: dict[tuple, Any] = {}
        lock = self.lock

        def inc(*labels) -> None:
            value = values.get(labels)
            if value is None:
                value = values[labels] = value_of(labels)
            if self.forked:
                self.refresh(value)
            lock.acquire()  # not "with": its special-method lookups cost as much again as the lock
            try:
                value._value += 1.0
                file = value._file
                pos = file._positions[value._key]
                file._m[pos:pos + 16] = _PACK(value._value, 0.0)
            finally:
                lock.release()

        return inc

    def histogram(self, child_of: Callable[[str], Any]) -> Callable[[str, float], None]:
        """``observe(label, amount)``: prometheus_client's ``histogram.labels(label).observe(amount)``:
        its sum and the one bucket (cumulated at scrape) that holds ``amount``, under one lock."""
        children: dict[str, tuple] = {}
        lock = self.lock

        def observe(label: str, amount: float) -> None:
            values = children.get(label)
            if values is None:
                values = children[label] = _histogram_values(child_of(label))
            total, buckets, bounds = values
            if total is None:  # a histogram child not as this module knows it: prometheus_client's observe
                buckets.observe(amount)
                return
            bucket = buckets[bisect.bisect_left(bounds, amount)]
            if self.forked:
                self.refresh(total)
            lock.acquire()
            try:
                total._value += amount
                file = total._file
                pos = file._positions[total._key]
                file._m[pos:pos + 16] = _PACK(total._value, 0.0)
                bucket._value += 1.0
                file = bucket._file
                pos = file._positions[bucket._key]
                file._m[pos:pos + 16] = _PACK(bucket._value, 0.0)
            finally:
                lock.release()

        return observe


def _mark_forked(ref: weakref.ref) -> None:
    writer = ref()
    if writer is not None:
        writer.forked = True


def _histogram_values(child) -> tuple:
    """A histogram child's (sum, buckets, upper bounds) as ``observe`` writes them, or (None, the
    child, None) when a prometheus_client release has made them something else (Writer.of checks
    the counters' values only)."""
    try:
        total, buckets, bounds = child._sum, child._buckets, child._upper_bounds
        if (len(buckets) == len(bounds) and bounds[-1] == float("inf")
                and all(isinstance(v._value, float) and v._key in v._file._positions for v in (total, *buckets))):
            return total, buckets, bounds
    except (AttributeError, KeyError, TypeError):
        pass
    return None, child, None
