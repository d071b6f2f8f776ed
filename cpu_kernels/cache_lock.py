"""numba's on-disk cache made safe for processes that compile at the same time.

numba (0.68) saves a new specialization of a cached function by reading the function's index,
taking the first data-file number the index does not use, writing the index, then the data.
Two processes saving two specializations of one function at once (two test workers, or a
server and a benchmark started together) take the same number: the index written last keeps
one key, the data written last holds the other's code, so every later process loads one
specialization's machine code for the other's signature. Seen in this repository's suite
(Nov 26, 2 workers): packed_moe_kernel ran the K-quant tiles on IQ1_S experts (1e34 outputs)
and a Q5_0 tile returned wrong lanes, until the cache files were deleted.
`install` wraps that read-modify-write in an exclusive lock on a file beside the index, so a
second saver sees the first one's entry and takes the next number.
"""

from __future__ import annotations

from numba.core import caching

try:
    import fcntl
except ImportError:  # not POSIX: numba's own behaviour
    fcntl = None

_numba_save = caching.IndexDataCacheFile.save


def _locked_save(self, key, data) -> None:
    with open(self._index_path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        _numba_save(self, key, data)


def install() -> None:
    """Route numba's cache saves through the lock (idempotent; a no-op without fcntl)."""
    if fcntl is not None:
        caching.IndexDataCacheFile.save = _locked_save
