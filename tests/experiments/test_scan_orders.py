"""experiments/scan_orders.py: the careful rule's success under each tie-break."""

import pytest

from experiments import lake_ceiling, scan_orders


def test_every_order_is_scored_and_the_larger_offsets_row_is_the_careful_experts():
    success = scan_orders.success_by_order(4, "dev", 10)
    assert len(success) == 24 + 1
    assert all(0 < p < 1 for p in success.values())
    careful = lake_ceiling.expert_play("frozen-lake", 4, 10, 1, {"random_ends": True}, "dev")
    assert success[scan_orders.LARGER_OFFSET] == pytest.approx(careful["careful"], abs=1e-12)
    # a tie-break matters on some lake: the orders do not all score alike
    assert len({round(p, 9) for p in success.values()}) > 1
