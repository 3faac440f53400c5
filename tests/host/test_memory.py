"""Host memory: MemTotal plans the decode batch, MemAvailable cuts it; freed heap goes back."""

import os
from pathlib import Path

import pytest
import torch

from ragen.host import memory


def test_available_memory_is_memavailable_not_memfree(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 24000000 kB\nMemFree: 1000 kB\nMemAvailable: 2500 kB\n")
    assert memory.available_memory(meminfo) == 2500 * 1024


@pytest.mark.parametrize("text", [None, "MemTotal: 24000000 kB\n", "MemAvailable: lots\n"])
def test_without_a_readable_memavailable_free_pages_are_used(tmp_path, text):
    meminfo = tmp_path / "meminfo"
    if text is not None:
        meminfo.write_text(text)
    pages = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert memory.available_memory(meminfo) == pytest.approx(pages, rel=0.2)


def _rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(memory._malloc_trim() is None, reason="not glibc")
def test_trim_heap_returns_freed_tensors_to_the_system():
    # 4,096 tensors of 64 KiB sit in the heap (below glibc's mmap threshold); the last one,
    # kept, pins the heap's top, so freeing the others returns nothing on its own.
    tensors = [torch.ones(16384) for _ in range(4096)]  # 256 MiB
    keep = tensors[-1]
    del tensors
    before = _rss()
    assert memory.trim_heap()
    assert before - _rss() > 200 * 2**20
    assert keep.sum() == 16384


def test_total_memory_is_memtotal(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 24000000 kB\nMemFree: 1000 kB\nMemAvailable: 2500 kB\n")
    assert memory.total_memory(meminfo) == 24000000 * 1024


def test_without_a_readable_memtotal_the_physical_pages_are_used(tmp_path):
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert memory.total_memory(tmp_path / "missing") == pages


@pytest.mark.skipif(not memory.STATUS.is_file(), reason="no /proc")
def test_the_peak_rss_sees_a_passing_allocation_and_starts_over_on_reset():
    assert memory.reset_peak_rss()
    start = memory.peak_rss()
    assert start is not None and start >= _rss() - 2**20
    block = bytearray(300 * 2**20)  # zeroed: every page touched
    del block  # returned to the system at once (mmap): the RSS falls back, the peak stays
    assert memory.peak_rss() - start > 290 * 2**20 and _rss() - start < 50 * 2**20
    assert memory.reset_peak_rss()
    assert memory.peak_rss() - start < 50 * 2**20


def test_without_proc_the_peak_rss_is_unknown(tmp_path):
    assert memory.peak_rss(tmp_path / "missing") is None
    assert not memory.reset_peak_rss(tmp_path / "missing-dir" / "clear_refs")
    (tmp_path / "status").write_text("VmHWM: 2048 kB\n")
    assert memory.peak_rss(tmp_path / "status") == 2 * 2**20
