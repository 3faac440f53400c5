"""machine.jsonl: the CPU's name from /proc/cpuinfo, one phrase of a record, and whether a
run ran on this machine."""

from ragen.run.jsonl import append_jsonl
from ragen.run.machine import cpu_fields, cpu_name, machine_summary, ran_only_on, same_cpu, this_cpu

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC
flags\t\t: fpu avx2

processor\t: 1
model name\t: another
"""


def test_the_cpu_is_the_first_processors_fields_in_cpuinfo(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO)
    fields = cpu_fields(path)
    assert (fields["cpu family"], fields["model"], fields["processor"]) == ("25", "1", "0")
    assert cpu_name(fields) == "AMD EPYC"
    assert cpu_name({"model name": ""}) != ""  # blank: what platform says instead
    assert cpu_fields(tmp_path / "none") == {}  # not Linux


def test_a_summary_names_the_cpu_its_kernels_and_the_dtype_or_the_gpu():
    cpu = {
        "cpu": "AMD EPYC 7B13",
        "cpu_capability": "AVX2",
        "device": "cpu",
        "model_dtype": "float32",
    }
    assert machine_summary(cpu) == "AMD EPYC 7B13, AVX2, float32"
    gpu = {**cpu, "device": "cuda", "gpu": "NVIDIA H200", "model_dtype": "bfloat16"}
    assert machine_summary(gpu) == "NVIDIA H200, bfloat16"
    assert machine_summary({}) == "unknown machine"


def test_a_run_ran_here_when_every_start_was_on_this_cpu(tmp_path):
    (tmp_path / "cpuinfo").write_text(CPUINFO)
    cpu = this_cpu(tmp_path / "cpuinfo")
    assert (cpu["cpu"], cpu["cpu_family"], cpu["cpu_model"]) == ("AMD EPYC", "25", "1")
    start = {"step": 0, "device": "cpu", **cpu}
    assert same_cpu(start, cpu)
    older = {k: v for k, v in start.items() if k not in ("cpu_family", "cpu_model")}
    assert same_cpu(older, cpu)  # a record from before family and model were kept
    assert not same_cpu({**start, "cpu_family": "26"}, cpu)  # the same name, another Zen
    other_isa = "AVX2" if cpu["cpu_capability"] == "AVX512" else "AVX512"
    assert not same_cpu({**start, "cpu_capability": other_isa}, cpu)  # another instruction set
    assert not same_cpu({**start, "device": "cuda", "gpu": "NVIDIA H200"}, cpu)
    path = tmp_path / "machine.jsonl"
    assert not ran_only_on(path, cpu)  # no record: not known to have run here
    append_jsonl(path, [start])
    assert ran_only_on(path, cpu)
    append_jsonl(path, [{**start, "step": 4, "cpu_family": "26"}])
    assert not ran_only_on(path, cpu)  # resumed on another machine
