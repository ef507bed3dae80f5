"""Memory-allocator settings for CPU processes (glibc tunables, or a preloaded allocator library).

glibc's malloc serves blocks above its mmap threshold with ``mmap`` and returns them with ``munmap``; a
PyTorch step frees and allocates the same large buffers again and again, so on CPU the kernel maps and
zero-fills them on every step. :data:`GLIBC_TUNED` keeps freed memory in the heap for reuse. An allocator is
chosen when a process starts, so these are environment variables given to processes before they start
(bench/allocator.py measures them).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["GLIBC_TUNED", "preload_library"]

#: glibc tunables (legacy ``MALLOC_*_`` variables, read at process start): no mmap for big blocks (threshold
#: 1 TB), never trim the heap top (100 GB), grow the heap 1 GB at a time (virtual: only touched pages count).
GLIBC_TUNED: dict[str, str] = {
    "MALLOC_MMAP_THRESHOLD_": "1000000000000",
    "MALLOC_TRIM_THRESHOLD_": "100000000000",
    "MALLOC_TOP_PAD_": "1000000000",
}

#: Debian's file names of the allocators ``LD_PRELOAD`` can load.
_LIBRARIES = {"jemalloc": "libjemalloc.so.2", "tcmalloc": "libtcmalloc_minimal.so.4"}
_LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib")


def preload_library(name: str) -> str | None:
    """The path of allocator ``name`` (``jemalloc`` or ``tcmalloc``) when installed, else None."""
    file = _LIBRARIES[name]
    for folder in _LIBRARY_DIRS:
        path = Path(folder) / file
        if path.is_file():
            return str(path)
    return None
