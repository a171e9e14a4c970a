"""The benchmark's table text and hot-mode rules (bench/bench_table.py): no torch, no GPU."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from bench_table import header, iterations, line, parse_shapes, ratios, summary  # noqa: E402
import kway_tables  # noqa: E402


def test_shapes_parse_or_name_the_bad_item():
    assert parse_shapes("bf16:613x16x128, f16:4096x16x96/2") == [
        (613, 16, 128, "bf16", False), (4096, 16, 96, "f16", True)]
    for bad in ("bf16:613x16", "bfloat16:1x1x1", "bf16:0x16x128", "613x16x128", ""):
        with pytest.raises(ValueError, match="shape|no shapes"):
            parse_shapes(bad)


def test_iterations_match_the_rust_bench_rule():
    # src/host/bench/graph.rs: graph_iterations
    assert iterations(1 << 20) == 20
    assert iterations(16 << 20) == 20
    assert iterations(64 << 20) == 10
    assert iterations(512 << 20) == 2
    assert iterations(16 << 30) == 2


def _row():
    r = {"dtype": "bfloat16", "T": 613, "H": 16, "D": 128, "threshold": "none", "bytes": 7650240,
         "mla-gen_us": 5.0, "mla-gen_gbs": 1530.0, "copy_us": 4.75, "copy_gbs": 1610.6, "torch_gbs": 300.0,
         "triton_us": 10.0, "triton_gbs": 765.0,
         "hot_mla-gen_us": 2.88, "hot_copy_us": 2.5, "hot_triton_us": 5.76}
    ratios(r)
    return r


def test_cold_columns_print_as_before_and_hot_ones_follow():
    r = _row()
    assert r["pct_copy"] == pytest.approx(95.0) and r["x_triton"] == pytest.approx(2.0)
    assert r["hot_pct_copy"] == pytest.approx(100 * 2.5 / 2.88) and r["hot_x_triton"] == pytest.approx(2.0)
    cold = line(r, "cold")
    # The row bench.py printed before the hot mode.
    assert cold == ("bfloat16    613   16  128 none      7.7 |        5.0   1530  95.0% |      1611 |        300 |"
                    "         765    2.00x")
    assert header("cold").endswith("x triton")
    both = line(r, "both")
    assert both.startswith(cold + " || ") and both.endswith("   86.8%        2.50    2.00x")
    hot = line(r, "hot")
    assert "|        5.0" not in hot and "86.8%" in hot
    assert len(header("both")) == len(both)
    # A column not timed prints as a dash instead of failing.
    del r["hot_x_triton"]
    assert line(r, "hot").endswith("-x")


def test_summary_counts_shapes_from_8_mb_and_reports_hot_copy_share():
    small = dict(_row(), bytes=1_000_000, pct_copy=50.0)
    big = dict(_row(), T=32768, bytes=400_000_000, pct_copy=98.0, hot_pct_copy=99.0)
    lines = summary([small, _row(), big])
    assert lines[0] == ("cold, shapes moving >= 8 MB (1): % of copy min 98.0 (bfloat16 T=32768 H=16 D=128 "
                        "thr=none), median 98.0; 1 of 1 >= 95%")
    assert lines[1].startswith("hot (3 shapes): % of hot copy min 86.8") and lines[1].endswith("max 99.0")
    assert summary([{"bytes": 1}]) == []


def test_kway_small_shapes_are_the_grid_merges_up_to_20_mib_of_states():
    grid = {(K, T, H, D) for H, D in kway_tables.GRID_HD for K in kway_tables.GRID_K for T in kway_tables.GRID_T}
    small = set(kway_tables.SMALL_SHAPES)
    assert len(grid) == 252 and len(small) == len(kway_tables.SMALL_SHAPES) == 73
    states = {s: s[0] * s[1] * s[2] * (2 * s[3] + 4) for s in grid}
    assert small == {s for s in grid if states[s] <= 20 << 20}
    assert (2, 2048, 16, 64) in small and (2, 8192, 16, 64) not in small
    assert kway_tables.parse_shapes("2:2048x16x64,16:256x8x128") == [(2, 2048, 16, 64), (16, 256, 8, 128)]


def test_kway_summary_counts_each_label_below_0_98_and_the_grid_per_k():
    def row(K, T, shipped, fi_k):
        return {"table": "grid", "K": K, "T": T, "H": 16, "D": 64, "kernel": f"merge_states_bf16_d64_k{K}_lse_base2",
                "x_fi": {"shipped": {"cold": shipped[0], "hot": shipped[1]}, "cur-k": {"cold": fi_k, "hot": fi_k}},
                "x_loop": {}}
    rows = [row(2, 256, (1.00, 0.95), 1.1), row(2, 2048, (1.02, 0.97), 1.1), row(2, 8192, (0.99, 1.05), 0.9)]
    lines = kway_tables.summary(rows, "shipped")
    assert "grid hot shipped: x fi median 0.970, min 0.950 (K=2 T=256 H=16 D=64), 2 of 3 below 0.98" in lines
    assert "grid cold cur-k: x fi median 1.100, min 0.900 (K=2 T=8192 H=16 D=64), 1 of 3 below 0.98" in lines
    assert ("grid K=2 shipped [k2] (3 shapes): x fi cold median 1.000 min 0.990, 0 below 0.98; "
            "hot median 0.970 min 0.950, 2 below 0.98") in lines


def test_inplace_summary_counts_each_candidate_apart():
    def row(T, xs, mask=False):
        return {"table": "family-inplace", "T": T, "H": 8, "D": 128, "mask": mask,
                "x_fi": {label: {"cold": x, "hot": x} for label, x in xs.items()}}
    rows = [row(256, {"mla-gen": 0.95, "warpsync": 1.01}), row(2048, {"mla-gen": 0.99, "warpsync": 0.97}),
            row(256, {"mla-gen": 1.2}, mask=True)]
    lines = kway_tables.summary(rows, "shipped")
    assert "family-inplace hot mla-gen: x fi median 0.970, min 0.950 (T=256 H=8 D=128), 1 of 2 below 0.98" in lines
    assert "family-inplace cold warpsync: x fi median 0.990, min 0.970 (T=2048 H=8 D=128), 1 of 2 below 0.98" in lines
    assert "family-inplace mask hot mla-gen: x fi median 1.200, min 1.200 (T=256 H=8 D=128), 0 of 1 below 0.98" in lines


def test_kway_losses_count_only_where_the_second_run_repeats_them():
    def run(xs):
        return [{"table": "grid", "K": 2, "T": T, "H": 8, "D": 64, "x_fi": {"shipped": {"hot": x, "cold": 1.0}}}
                for T, x in zip((256, 2048, 8192), xs)]
    first, second = run((0.95, 0.97, 1.01)), run((0.99, 0.96, 0.90))
    assert kway_tables.repeated_losses(first, second, "shipped", "hot") == [((2, 2048, 8, 64), 0.97, 0.96)]
    assert kway_tables.repeated_losses(first, second, "shipped", "cold") == []
