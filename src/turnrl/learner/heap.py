"""The C heap under the learner: what glibc keeps of freed memory, and when the learner gives it back.

An update allocates and frees the same shapes once per micro-batch (every layer's activations and their gradients).
glibc keeps freed blocks below its mmap threshold in the heap, and that threshold rises to the size of the largest
mapped block freed (up to 32 MB), so after the first micro-batch most of them come from the heap, where freed space
stays resident and fragments. The learner therefore trims the heap (:func:`release_free_memory`) before each update
and after each micro-batch, and under activation checkpointing fixes the threshold (:func:`limit_heap_retention`),
so that larger blocks are mapped on their own and returned when freed.

Both cost page faults: a returned page is faulted in anew when the next micro-batch touches it. On a 39,345-token
batch of the default recipe an update takes 4.5 million minor faults (18 GB of fresh pages). Keeping the freed blocks
for the next micro-batch instead (no block mapped on its own, the heap trimmed only before and after the update) cut
that to 0.35 million for 0.07 GB more peak, but the update's time did not move beyond its run-to-run spread (three
pairs: 1.13x, 1.19x, 0.98x; bench/RESULTS.md, 2026-12-06 21:20-22:02), so it is not the default. Other C libraries:
nothing here does anything.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

AUTO_HEAP_MMAP_THRESHOLD_KB = 4096  # train.heap_mmap_threshold_kb=auto under activation checkpointing


def release_free_memory() -> None:
    """Give the C heap's free pages back to the OS (glibc's ``malloc_trim``; a no-op on other C libraries).

    After one micro-batch of the default recipe (2048 tokens, 2026-12-06) 1.45 GB of the resident set was such free
    memory.
    """
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def heap_mmap_threshold_kb(setting: int | str, checkpointed: bool) -> int:
    """``train.heap_mmap_threshold_kb`` resolved: "auto" is :data:`AUTO_HEAP_MMAP_THRESHOLD_KB` when the model's layers
    are checkpointed (the run is saving memory), else 0 (glibc's own threshold)."""
    if setting == "auto":
        return AUTO_HEAP_MMAP_THRESHOLD_KB if checkpointed else 0
    return int(setting)


def limit_heap_retention(threshold_kb: int) -> None:
    """Fix glibc's mmap threshold at ``threshold_kb`` KiB (0: leave glibc's own), process-wide and for good: every block
    above it is mapped on its own and returned to the OS when freed.

    Measured on the default recipe with activation checkpointing (bench/RESULTS.md, 2026-12-06): the first update's
    peak 3.8-4.0 GB at glibc's threshold, 2.75 GB at 4096 KiB.
    """
    libc = _glibc()
    if threshold_kb and libc is not None:
        libc.mallopt(-3, threshold_kb * 1024)  # M_MMAP_THRESHOLD


@functools.cache
def _glibc():
    """The C library when it is glibc (it has ``malloc_trim`` and ``mallopt``), else None."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim, libc.mallopt  # noqa: B018 (AttributeError on other C libraries)
    except (OSError, AttributeError):
        return None
    return libc
