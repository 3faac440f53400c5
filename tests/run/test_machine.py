"""machine.jsonl: the CPU's name from /proc/cpuinfo, and one phrase of a record."""

from ragen.run.machine import cpu_fields, cpu_name, machine_summary

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
