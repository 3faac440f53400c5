"""machine.jsonl: the CPU's name from /proc/cpuinfo, and one phrase of a record."""

from ragen.run.machine import cpu_name, machine_summary

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu avx2
"""


def test_the_cpu_name_is_cpuinfos_model_name(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO)
    assert cpu_name(path) == "AMD EPYC 7B13"
    path.write_text("processor\t: 0\nmodel name\t:\n")  # blank: what platform says instead
    assert cpu_name(path) != ""
    assert cpu_name(tmp_path / "none") != ""  # not Linux


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
