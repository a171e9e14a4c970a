//! The bench's pure parts: shape and kernel lists, the tuner's analysis and size rule, and the
//! text bench and tune print. No GPU.

use serde_json::json;

use super::report::{analysis_text, legend, row_line, summary};
use super::rule::Mode::{Cold, Hot};
use super::rule::{analyze, label, ModeTimes, ShapeKey, PLAIN, TOLERANCE};
use super::*;
use crate::variant::Schedule;

fn sched(bt: u32, hpb: u32) -> Schedule {
    Schedule {
        rows_per_thread: 1,
        min_blocks_per_sm: 1,
        block_threads: bt,
        heads_per_block: hpb,
        vecs_per_thread: 0,
    }
}

fn shape(t: usize, h: usize) -> ShapeKey {
    ShapeKey {
        t,
        h,
        half: false,
        bytes: merge_bytes(t, h, 128, 2, t, true),
    }
}

#[test]
fn shapes_and_kernel_lists_parse_or_say_how_to_write_them() {
    assert_eq!(
        parse_shapes("613x16, 4096x16/2,1x1").unwrap(),
        vec![(613, 16, false), (4096, 16, true), (1, 1, false)]
    );
    for bad in ["613", "0x16", "ax16", "613x16/3", "", " , "] {
        let e = parse_shapes(bad).unwrap_err();
        assert!(e.contains("TxH") || e.contains("no shapes"), "{bad}: {e}");
    }
    assert_eq!(
        parse_kernels("bf16:128,f32:64").unwrap(),
        vec![("bf16".to_string(), 128), ("f32".to_string(), 64)]
    );
    assert!(parse_kernels("bf17:128")
        .unwrap_err()
        .contains("unknown dtype"));
    assert!(parse_kernels("bf16")
        .unwrap_err()
        .contains("dtype:head_size"));
    assert!(parse_kernels("").is_err());
}

#[test]
fn labels_name_block_threads_and_heads_and_only_unusual_fields() {
    assert_eq!(label(&PLAIN), "bt128/hpb1");
    let mut s = sched(512, 8);
    s.rows_per_thread = 2;
    s.min_blocks_per_sm = 2;
    assert_eq!(label(&s), "bt512/hpb8/rpt2/mb2");
}

#[test]
fn one_schedule_within_tolerance_everywhere_needs_no_rule() {
    let shapes = [shape(613, 16), shape(32768, 128)];
    let schedules = [PLAIN, sched(512, 1)];
    // plain is 1% slower at the large shape only: within 2% everywhere.
    let modes = [
        ModeTimes {
            mode: Cold,
            times: vec![vec![5.0, 1010.0], vec![5.5, 1000.0]],
        },
        ModeTimes {
            mode: Hot,
            times: vec![vec![2.66, 1005.0], vec![2.88, 1000.0]],
        },
    ];
    let a = analyze(&shapes, &schedules, &modes, Some(sched(512, 1)), TOLERANCE);
    assert_eq!(a.uniform, vec!["bt128/hpb1".to_string()]);
    assert!(a.rule.is_none());
    assert_eq!(a.current.as_deref(), Some("bt512/hpb1"));
    assert_eq!(a.plain.as_deref(), Some("bt128/hpb1"));
    let hot = &a.shapes[0].modes[1];
    assert_eq!(
        (hot.mode, hot.best.as_str(), hot.best_us),
        (Hot, "bt128/hpb1", 2.66)
    );
    assert!((hot.current.unwrap() - 2.88 / 2.66).abs() < 1e-12);
    assert_eq!(hot.plain, Some(1.0));
    let (best, worst) = a.best_single.clone().unwrap();
    assert_eq!(best, "bt128/hpb1");
    assert!((worst - 1.01).abs() < 1e-9);
}

#[test]
fn no_uniform_winner_proposes_the_fewest_ranges_of_rows() {
    // Small shapes favour plain (hot), large ones bt512 (cold), the middle is a tie.
    let shapes = [
        shape(256, 16),   // 4096 rows
        shape(613, 64),   // 39232
        shape(4096, 16),  // 65536
        shape(32768, 16), // 524288
        shape(32768, 128),
    ];
    let schedules = [PLAIN, sched(256, 2), sched(512, 1)];
    let modes = [
        ModeTimes {
            mode: Cold,
            times: vec![
                vec![5.0, 20.0, 30.0, 240.0, 1100.0],
                vec![5.0, 20.0, 30.0, 220.0, 1030.0],
                vec![5.0, 20.0, 30.0, 200.0, 1000.0],
            ],
        },
        ModeTimes {
            mode: Hot,
            times: vec![
                vec![2.0, 10.0, 20.0, 200.0, 1000.0],
                vec![2.2, 10.1, 20.1, 200.0, 1000.0],
                vec![2.5, 11.0, 20.3, 200.0, 1000.0],
            ],
        },
    ];
    let a = analyze(&shapes, &schedules, &modes, Some(sched(512, 1)), TOLERANCE);
    assert!(a.uniform.is_empty());
    let rule = a.rule.clone().expect("a rule");
    assert!(rule.relaxed_at_rows.is_empty());
    let got: Vec<(usize, Option<usize>, &str)> = rule
        .ranges
        .iter()
        .map(|r| (r.from_rows, r.below_rows, r.schedule.as_str()))
        .collect();
    // Two ranges: plain up to 65536 rows, bt512 from 524288; the boundary is their geometric
    // mean, 183 K rows.
    let b = ((65536f64 * 524288f64).sqrt()).round() as usize;
    assert_eq!(
        got,
        vec![(0, Some(b), "bt128/hpb1"), (b, None, "bt512/hpb1")]
    );
    assert_eq!(rule.ranges[0].rows, vec![4096, 39232, 65536]);
    assert!(rule
        .text()
        .starts_with(&format!("rows < {b}: bt128/hpb1 (worst 1.000)")));
    assert!(rule.text().contains(&format!("rows >= {b}: bt512/hpb1")));
    let text = analysis_text("bf16 d128 (3 candidates)", &a);
    assert!(text.contains("one schedule within 2% of the best at every shape (cold and hot): none"));
    assert!(
        text.contains("proposed size rule (rows = tokens x heads): rows <"),
        "{text}"
    );
    assert!(
        text.contains("current bt512/hpb1: cold worst 1.000"),
        "{text}"
    );
    assert!(
        text.contains("plain bt128/hpb1: cold worst 1.200"),
        "{text}"
    );
}

#[test]
fn a_row_count_where_nothing_fits_is_relaxed_and_said_so() {
    // At 9808 rows, cold wants bt512 and hot wants plain, each 10% apart: no schedule is within
    // 2% in both modes, so the rule takes the least worst there and names the row count.
    let shapes = [shape(613, 16), shape(32768, 128)];
    let schedules = [PLAIN, sched(512, 1)];
    let modes = [
        ModeTimes {
            mode: Cold,
            times: vec![vec![5.5, 1000.0], vec![5.0, 1000.0]],
        },
        ModeTimes {
            mode: Hot,
            times: vec![vec![2.6, 1000.0], vec![2.8, 1000.0]],
        },
    ];
    let a = analyze(&shapes, &schedules, &modes, None, TOLERANCE);
    let rule = a.rule.clone().unwrap();
    assert_eq!(rule.relaxed_at_rows, vec![613 * 16]);
    assert_eq!(rule.ranges.len(), 1, "{:?}", rule.ranges);
    // plain's worst at 9808 rows is 1.1 (cold), bt512's 2.8 / 2.6 = 1.077: bt512 there.
    assert_eq!(rule.ranges[0].schedule, "bt512/hpb1");
    assert_eq!(rule.text(), "all rows: bt512/hpb1 (worst 1.077)");
    assert!(analysis_text("t", &a).contains("at rows [9808]"));
}

#[test]
fn a_failed_time_never_wins() {
    let shapes = [shape(613, 16)];
    let modes = [ModeTimes {
        mode: Hot,
        times: vec![vec![f64::NAN], vec![3.0]],
    }];
    let a = analyze(&shapes, &[PLAIN, sched(512, 1)], &modes, None, TOLERANCE);
    assert_eq!(a.shapes[0].modes[0].best, "bt512/hpb1");
    assert_eq!(a.shapes[0].modes[0].plain, Some(f64::INFINITY));
    assert_eq!(a.uniform, vec!["bt512/hpb1".to_string()]);
    assert!(analysis_text("t", &a).contains("fail"));
}

fn row() -> serde_json::Value {
    json!({
        "kernel": "merge_attn_states_bf16_d128_thr_lse", "dtype": "bf16", "T": 613, "H": 16,
        "D": 128, "threshold": "none", "bytes": 7_650_240u64, "us": 5.1234, "gbs": 1493.2,
        "copy_us": 4.8, "copy_gbs": 1593.8, "pct_copy": 93.7,
        "hot_us": 2.88, "hot_gbs": 2656.3, "hot_copy_us": 2.5, "hot_pct_copy": 86.8,
    })
}

#[test]
fn cold_rows_print_as_before_the_hot_mode() {
    // The line `mla-gen bench` printed before the hot mode (serde_json's Display ignores the
    // widths of T and H, as it did then).
    assert_eq!(
        row_line(&row(), L2::Cold),
        "merge_attn_states_bf16_d128_thr_lse      T=613 H=16 thr=none        5.1 us   1493 GB/s"
    );
    assert!(legend(L2::Cold).is_none());
    assert!(summary(&[
        json!({"kernel": "k", "T": 1, "H": 1, "threshold": "none", "bytes": 9e6, "us": 1.0})
    ])
    .is_empty());
}

#[test]
fn both_and_hot_rows_append_copy_and_hot_columns() {
    let both = row_line(&row(), L2::Both);
    assert!(both.starts_with(&row_line(&row(), L2::Cold)));
    assert!(
        both.ends_with(
            ", copy      4.8 us,  93.7% of copy | hot     2.88 us   2656 GB/s, hot copy     2.50 us,  86.8% of hot copy"
        ),
        "{both}"
    );
    let hot = row_line(&row(), L2::Hot);
    assert!(hot.starts_with("merge_attn_states_bf16_d128_thr_lse      T=613 H=16 thr=none  | hot"));
    assert!(!hot.contains("% of copy"));
    assert!(legend(L2::Both).unwrap().contains("producer"));
}

#[test]
fn summary_reports_cold_copy_share_from_8_mb_and_hot_copy_share() {
    let mut small = row();
    small["bytes"] = json!(1_000_000u64);
    small["pct_copy"] = json!(50.0);
    let mut big = row();
    big["T"] = json!(32768);
    big["bytes"] = json!(400_000_000u64);
    big["pct_copy"] = json!(98.0);
    big["hot_pct_copy"] = json!(99.0);
    let lines = summary(&[small, row(), big]);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(
        lines[0],
        "cold, shapes moving >= 8 MB (1): % of copy min 98.0 (merge_attn_states_bf16_d128_thr_lse T=32768 H=16 thr=none), median 98.0; 1 of 1 >= 95%"
    );
    assert!(
        lines[1].starts_with("hot (3 shapes): % of hot copy min 86.8"),
        "{}",
        lines[1]
    );
    assert!(lines[1].ends_with("median 86.8, max 99.0"), "{}", lines[1]);
}

#[test]
fn merge_bytes_counts_rows_with_and_without_context() {
    // 613 x 16 x 128 bf16, every token with context: 9808 rows x (3 x 256 + 12).
    assert_eq!(merge_bytes(613, 16, 128, 2, 613, true), 9808 * 780);
    assert_eq!(
        merge_bytes(8, 2, 64, 4, 4, false),
        8 * (3 * 256 + 8) + 8 * (2 * 256 + 4)
    );
}

#[test]
fn the_producer_self_test_ranges_fit_their_padded_buffer() {
    let sizes = [16 * 5000 + 12, 4, 16 * 3 + 8, 1 << 20];
    let (offsets, total) = super::graph::aligned_layout(&sizes);
    assert_eq!(offsets, vec![0, 80016, 80032, 80096]);
    assert_eq!(total, 80096 + (1 << 20));
    for (&off, &n) in offsets.iter().zip(&sizes) {
        assert_eq!(off % 16, 0);
        assert!(off + n <= total);
    }
}
