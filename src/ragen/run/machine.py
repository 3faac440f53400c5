"""Where a run ran: one line of ``machine.jsonl`` each time it starts or resumes.

The same config and seed give the same numbers on the same machine only: ``model.dtype=auto``
is bfloat16 on a CPU with native bf16 (AVX512-BF16 or AMX) and float32 elsewhere, and the
kernels a CPU's instruction set selects round differently. A run records the machine and the
dtypes its settings resolved to, so that two runs (or the seeds of a study) that ran on
different machines can be told apart from their logs.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

import torch

from ragen import __version__
from ragen.run.jsonl import read_jsonl

CPUINFO = Path("/proc/cpuinfo")


def cpu_fields(cpuinfo: Path = CPUINFO) -> dict[str, str]:
    """The first CPU's fields in Linux's /proc/cpuinfo ("model name", "cpu family", …); none
    elsewhere."""
    fields: dict[str, str] = {}
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return fields
    for line in text.splitlines():
        if not line.strip():
            break  # the first processor's block ends
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_name(fields: dict[str, str]) -> str:
    """The CPU's model name from ``fields`` (`cpu_fields`), else what `platform` says, else
    "unknown"."""
    return fields.get("model name") or platform.processor() or platform.machine() or "unknown"


def machine_record(
    device: torch.device, model_dtype: torch.dtype, update_dtype: torch.dtype, step: int
) -> dict:
    """What ``machine.jsonl`` records of a start at ``step`` (0 for a new run): the CPU (its
    name, family and model numbers, the instruction set torch's kernels use, whether bf16 is
    native, the cores this process may use), the GPU where the run uses one, the dtypes
    ``model.dtype`` and ``trainer.update_dtype`` resolved to, and the versions of torch,
    transformers and ragen."""
    from transformers import __version__ as transformers_version

    from ragen.models import bf16_supported

    return {
        "step": step,
        "time": round(time.time(), 3),
        **this_cpu(),
        "cpu_bf16": bf16_supported("cpu"),
        "cores": _cores(),
        "device": device.type,
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "model_dtype": _name(model_dtype),
        "update_dtype": _name(update_dtype),
        "torch": torch.__version__,
        "transformers": transformers_version,
        "ragen": __version__,
    }


def this_cpu(cpuinfo: Path = CPUINFO) -> dict[str, str | None]:
    """This machine's CPU as ``machine.jsonl`` records it: its name, family and model numbers
    (a virtual CPU's name may not tell which it is), and the instruction set torch's kernels
    use."""
    fields = cpu_fields(cpuinfo)
    return {
        "cpu": cpu_name(fields),
        "cpu_family": fields.get("cpu family"),
        "cpu_model": fields.get("model"),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


def same_cpu(record: dict, cpu: dict) -> bool:
    """Whether a machine.jsonl ``record`` ran on the CPU ``cpu`` (`this_cpu`) describes: the
    same name and instruction set, and the same family and model numbers where both record
    them (a record written before ragen kept them has none). A GPU run's pace is its GPU's:
    never the same."""
    if record.get("device") == "cuda":
        return False
    if any(record.get(key) != cpu.get(key) for key in ("cpu", "cpu_capability")):
        return False
    return all(
        record.get(key) is None or cpu.get(key) is None or record[key] == cpu[key]
        for key in ("cpu_family", "cpu_model")
    )


def ran_only_on(path: Path, cpu: dict) -> bool:
    """Whether the run whose machine.jsonl is ``path`` recorded every start on ``cpu``
    (`same_cpu`); False for a run without one."""
    records = [r for r in read_jsonl(path).records if isinstance(r, dict)]
    return bool(records) and all(same_cpu(r, cpu) for r in records)


def _cores() -> int | None:
    """The cores this process may run on (its affinity where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count()


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def machine_summary(record: dict) -> str:
    """One short phrase of a record: "CPU NAME, AVX2, float32", or the GPU's name and dtype."""
    where = record.get("gpu") or record.get("cpu") or "unknown machine"
    parts = [str(where)]
    if record.get("device") != "cuda" and record.get("cpu_capability"):
        parts.append(str(record["cpu_capability"]))
    if record.get("model_dtype"):
        parts.append(str(record["model_dtype"]))
    return ", ".join(parts)


def machines_of(path: Path) -> list[str]:
    """The distinct machines (`machine_summary`) a run's machine.jsonl records, in the order
    its starts ran on them; none for a run without one (older than it, or not started)."""
    seen: list[str] = []
    for record in read_jsonl(path).records:
        if isinstance(record, dict) and (summary := machine_summary(record)) not in seen:
            seen.append(summary)
    return seen
