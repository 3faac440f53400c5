"""benchmarks/profile_update.py: an update's profiled op times summed by kind."""

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks import profile_update


def test_ops_are_sorted_into_their_kinds():
    kind = profile_update.kind_of
    assert kind("aten::mm") == "matmul"
    assert kind("aten::addmm") == "matmul"  # not an elementwise add
    assert kind("aten::_scaled_dot_product_flash_attention_for_cpu_backward") == "attention"
    assert kind("aten::_to_copy") == "cast/copy"
    assert kind("aten::copy_") == "cast/copy"
    assert kind("aten::mul") == "elementwise"
    assert kind("aten::_log_softmax_backward_data") == "elementwise"
    assert kind("aten::_foreach_addcdiv_") == "optimizer"
    assert kind("MmBackward0") == "autograd"
    assert kind("autograd::engine::evaluate_function: MmBackward0") == "autograd"
    assert kind("aten::unknown_thing") == "other"


def test_a_profiled_matmul_lands_in_the_matmul_kind():
    a = torch.randn(256, 256, requires_grad=True)
    b = torch.randn(256, 256)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            (a @ b).sum().backward()
    ops = profile_update.op_table(prof)
    calls = {r["op"]: r["calls"] for r in ops}
    assert calls["aten::mm"] == 6  # three forwards, three backwards (grad of a only)
    assert [r["self_s"] for r in ops] == sorted((r["self_s"] for r in ops), reverse=True)
    kinds = profile_update.by_kind(ops)
    assert kinds["matmul"] > 0
    assert abs(sum(kinds.values()) - sum(r["self_s"] for r in ops)) < 1e-9


def test_ops_split_by_input_shape():
    a, b = torch.randn(64, 32), torch.randn(32, 16)
    c, d = torch.randn(8, 8), torch.randn(8, 8)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        a @ b
        c @ d
        c @ d
    mms = {
        r["shapes"]: r["calls"]
        for r in profile_update.op_table(prof, True)
        if r["op"] == "aten::mm"
    }
    assert mms == {"[[64, 32], [32, 16]]": 1, "[[8, 8], [8, 8]]": 2}
