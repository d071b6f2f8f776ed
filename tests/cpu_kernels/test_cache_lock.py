"""Two savers of one numba cache index at once each keep their own entry (cache_lock.py)."""

from __future__ import annotations

import threading
import time

import pytest
from numba.core import caching

from cpu_kernels import cache_lock  # importing cpu_kernels installs the lock


@pytest.mark.parametrize("locked", [True, False])
def test_concurrent_saves_keep_each_specialization(tmp_path, monkeypatch, locked: bool) -> None:
    numba_save_index = caching.IndexDataCacheFile._save_index

    def slow_save_index(self, overloads):
        time.sleep(0.2)  # widen the window between reading the index and writing it
        numba_save_index(self, overloads)

    monkeypatch.setattr(caching.IndexDataCacheFile, "_save_index", slow_save_index)
    if not locked:  # numba's own save: the race this module closes
        monkeypatch.setattr(caching.IndexDataCacheFile, "save", cache_lock._numba_save)
    stamp = ("source stamp", 1)
    savers = [caching.IndexDataCacheFile(str(tmp_path), "kernel-1.py311", stamp) for _ in range(2)]
    threads = [threading.Thread(target=s.save, args=(f"signature {i}", f"code {i}"))
               for i, s in enumerate(savers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    reader = caching.IndexDataCacheFile(str(tmp_path), "kernel-1.py311", stamp)
    loaded = [reader.load(f"signature {i}") for i in range(2)]
    if locked:
        assert loaded == ["code 0", "code 1"]
    else:  # one key lost, or both keys naming one data file
        assert loaded != ["code 0", "code 1"]
