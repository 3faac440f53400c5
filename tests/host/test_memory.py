"""Host memory: MemTotal plans the decode batch, MemAvailable cuts it; freed heap goes back."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.update_memory import new_cgroup
from ragen.host import memory


def test_available_memory_is_memavailable_not_memfree(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 24000000 kB\nMemFree: 1000 kB\nMemAvailable: 2500 kB\n")
    assert memory.available_memory(meminfo, tmp_path / "no-cgroups") == 2500 * 1024


@pytest.mark.parametrize("text", [None, "MemTotal: 24000000 kB\n", "MemAvailable: lots\n"])
def test_without_a_readable_memavailable_free_pages_are_used(tmp_path, text):
    meminfo = tmp_path / "meminfo"
    if text is not None:
        meminfo.write_text(text)
    pages = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert memory.available_memory(meminfo, tmp_path / "no-cgroups") == pytest.approx(
        pages, rel=0.2
    )


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
    assert memory.total_memory(meminfo, tmp_path / "no-cgroups") == 24000000 * 1024


def test_without_a_readable_memtotal_the_physical_pages_are_used(tmp_path):
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert memory.total_memory(tmp_path / "missing", tmp_path / "no-cgroups") == pages


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


def _files(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_a_cgroup_v2_limit_bounds_total_and_available_memory(tmp_path):
    # a container's cgroup (8 GiB, 5 GiB used of which 1 GiB inactive file pages) under a
    # parent limited to 16 GiB, and a grandparent without a limit
    gib = 2**30
    _files(
        tmp_path / "sys",
        {
            "memory.max": "max\n",
            "memory.current": f"{20 * gib}\n",
            "jobs/memory.max": f"{16 * gib}\n",
            "jobs/memory.current": f"{15 * gib}\n",
            "jobs/memory.stat": "anon 1\ninactive_file 0\n",
            "jobs/run/memory.max": f"{8 * gib}\n",
            "jobs/run/memory.current": f"{5 * gib}\n",
            "jobs/run/memory.stat": f"anon 1\ninactive_file {gib}\nactive_file 7\n",
        },
    )
    _files(tmp_path, {"cgroup": "0::/jobs/run\n"})
    # the tightest limit (8 GiB) and the least left: the parent's 1 GiB, not the run's 4
    assert memory.cgroup_memory(tmp_path / "sys", tmp_path / "cgroup") == (8 * gib, gib)
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal: {64 * 2**20} kB\nMemAvailable: {40 * 2**20} kB\n")
    where = (meminfo, tmp_path / "sys", tmp_path / "cgroup")
    assert memory.total_memory(*where) == 8 * gib
    assert memory.available_memory(*where) == gib


def test_a_cgroup_v1_limit_is_read_at_the_root_a_container_sees(tmp_path):
    # the host's path of the cgroup is not under the container's mount: its root is read
    mib = 2**20
    _files(
        tmp_path / "sys" / "memory",
        {
            "memory.limit_in_bytes": f"{512 * mib}\n",
            "memory.usage_in_bytes": f"{300 * mib}\n",
            "memory.stat": f"cache 5\ntotal_inactive_file {20 * mib}\n",
        },
    )
    _files(tmp_path, {"cgroup": "4:memory:/docker/0123abc\n1:cpu:/\n0::/\n"})
    found = memory.cgroup_memory(tmp_path / "sys", tmp_path / "cgroup")
    assert found == (512 * mib, 232 * mib)


@pytest.mark.parametrize(
    "limit", ["9223372036854771712\n", "max\n", "lots\n"], ids=["v1-none", "v2-max", "junk"]
)
def test_no_limit_or_an_unreadable_one_leaves_the_machine_s_figures(tmp_path, limit):
    _files(tmp_path / "sys", {"memory.max": limit, "memory.current": "100\n"})
    _files(tmp_path, {"cgroup": "0::/\n"})
    assert memory.cgroup_memory(tmp_path / "sys", tmp_path / "cgroup") is None
    assert memory.cgroup_memory(tmp_path / "sys", tmp_path / "missing") is None


def test_a_process_in_a_limited_cgroup_plans_from_its_limit():
    limit = 3 * 2**30
    folder = new_cgroup(limit)
    if folder is None:
        pytest.skip("no memory cgroup can be made here (needs root and a memory controller)")
    script = (
        "from ragen.host import memory; print(memory.total_memory(), memory.available_memory())"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", script],
            preexec_fn=lambda: (folder / "cgroup.procs").write_text(str(os.getpid())),
            capture_output=True,
            text=True,
            check=True,
        )
    except subprocess.CalledProcessError:  # the child ran and failed: a real failure
        raise
    except subprocess.SubprocessError as err:  # the child could not join the cgroup
        pytest.skip(f"a process cannot be moved into a new cgroup here: {err}")
    finally:
        folder.rmdir()
    total, available = map(int, done.stdout.split())
    assert total == limit
    assert 0 < available < limit  # the child's own interpreter and torch are in it
