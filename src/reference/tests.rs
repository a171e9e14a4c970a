//! Unit tests of the parent module.

use super::*;

const INF: f32 = f32::INFINITY;

/// A blend's (prefix weight, suffix weight, lse); any other merge fails the test.
fn blend_of(r: RowMerge) -> (f64, f64, f64) {
    match r {
        RowMerge::Blend {
            prefix_weight,
            suffix_weight,
            lse,
        } => (prefix_weight, suffix_weight, lse),
        other => panic!("not a blend: {other:?}"),
    }
}

#[test]
fn group_scales_match_exactly_for_copies_and_within_rounding_for_blends() {
    let copy = merge_row(1.0, 2.0, false);
    let blend = merge_row(0.0, 0.0, true);
    let values = [1.0, -448.0, 3.0];
    assert!(fp8_group_scale_matches(&copy, &values, false, 1.0));
    assert!(!fp8_group_scale_matches(
        &copy,
        &values,
        false,
        f32::from_bits(1.0f32.to_bits() + 1)
    ));
    // vLLM's rule, absmax x RN(1/448), not the IEEE quotient (one ulp apart at 100).
    let copied = [100.0, -2.0];
    assert!(fp8_group_scale_matches(
        &copy,
        &copied,
        false,
        100.0f32 * (1.0 / 448.0)
    ));
    assert!(!fp8_group_scale_matches(
        &copy,
        &copied,
        false,
        100.0f32 / 448.0
    ));
    let values = [100.0, -2.0];
    let exact = 100.0f32 * (1.0 / 448.0);
    assert!(fp8_group_scale_matches(&blend, &values, false, exact));
    assert!(fp8_group_scale_matches(
        &blend,
        &values,
        false,
        exact * (1.0 + 1e-6)
    ));
    assert!(!fp8_group_scale_matches(
        &blend,
        &values,
        false,
        exact * (1.0 + 1e-3)
    ));
    // UE8M0: 100 / 448 = 0.223 rounds up to 0.25; the next power either side is wrong.
    assert!(fp8_group_scale_matches(&blend, &values, true, 0.25));
    assert!(!fp8_group_scale_matches(&blend, &values, true, 0.5));
    assert!(!fp8_group_scale_matches(&blend, &values, true, 0.125));
}

#[test]
fn k_way_merge_by_hand() {
    // Equal lse: the mean of the rows, lse + ln K.
    let r = merge_states_row(&[1.0, 1.0, 1.0, 1.0]);
    assert_eq!(r.value_and_magnitude(&[1.0, 2.0, 3.0, 6.0]).0, 3.0);
    assert!((r.lse() - (1.0 + 4f64.ln())).abs() < 1e-15);
    // -inf and +inf states weigh nothing; ln 2 apart weighs 2:1.
    let r = merge_states_row(&[-INF, 2f32.ln(), INF, 0.0]);
    let (v, _) = r.value_and_magnitude(&[100.0, 3.0, 100.0, 6.0]);
    assert!((v - 4.0).abs() < 1e-6, "{v}");
    assert!((r.lse() - 3f64.ln()).abs() < 1e-7);
    // No keys anywhere: state 0's row, lse -inf (never NaN).
    let r = merge_states_row(&[INF, -INF, -INF]);
    assert_eq!(r, StatesMerge::CopyFirst);
    assert_eq!(r.value_and_magnitude(&[7.0, 1.0, 2.0]).0, 7.0);
    assert_eq!(r.lse(), f64::NEG_INFINITY);
    // A NaN lse anywhere, even after the others are -inf, propagates.
    for lse in [
        [f32::NAN, -INF, -INF],
        [-INF, -INF, f32::NAN],
        [0.0, f32::NAN, 1.0],
    ] {
        let r = merge_states_row(&lse);
        assert!(r.lse().is_nan(), "{lse:?}");
        assert!(r.value_and_magnitude(&[1.0, 1.0, 1.0]).0.is_nan());
    }
}

#[test]
fn two_states_merge_like_the_pairwise_merge() {
    for (p, s) in [
        (0.5f32, -1.25f32),
        (3.0, 3.0),
        (-INF, 2.0),
        (INF, 1.0),
        (-INF, -INF),
    ] {
        let pair = merge_row(p, s, true);
        let k = merge_states_row(&[p, s]);
        assert_eq!(k.lse(), pair.lse(), "({p}, {s})");
        let (v, _) = k.value_and_magnitude(&[1.5, -2.0]);
        assert!((v - pair.value(1.5, -2.0)).abs() < 1e-15, "({p}, {s})");
    }
    // NaN, beside an empty state too: both give a NaN row and lse.
    for (p, s) in [
        (f32::NAN, -INF),
        (f32::NAN, INF),
        (-INF, f32::NAN),
        (0.0, f32::NAN),
    ] {
        let pair = merge_row(p, s, true);
        let k = merge_states_row(&[p, s]);
        assert!(pair.lse().is_nan() && k.lse().is_nan(), "({p}, {s})");
        assert!(pair.value(1.5, -2.0).is_nan(), "({p}, {s})");
        assert!(k.value_and_magnitude(&[1.5, -2.0]).0.is_nan(), "({p}, {s})");
    }
}

#[test]
fn empty_contexts_mask_their_tokens_only() {
    // Requests: [0, 2) with context, [2, 5) without, [5, 5) empty, [5, 6) without;
    // token 6 belongs to no request.
    let qsl = [0, 2, 5, 5, 6];
    let csl = [0, 10, 10, 12, 12];
    for head_major in [true, false] {
        let mut lse: Vec<f32> = (0..14).map(|x| x as f32).collect();
        mask_empty_context(&mut lse, head_major, (7, 2), &qsl, &csl);
        for t in 0..7 {
            for h in 0..2 {
                let i = lse_index(head_major, 7, 2, t, h);
                let masked = (2..6).contains(&t);
                assert_eq!(lse[i] == f32::NEG_INFINITY, masked, "t={t} h={h}");
                if !masked {
                    assert_eq!(lse[i], i as f32);
                }
            }
        }
    }
}

#[test]
fn equal_lse_averages_the_rows() {
    let r = merge_row(0.0, 0.0, true);
    assert_eq!(r.value(2.0, 4.0), 3.0);
    assert!((r.lse() - 2f64.ln()).abs() < 1e-15);
}

#[test]
fn hand_computed_blend() {
    // p = ln 3, s = 0: a = 1, b = 1/3 after subtracting m = ln 3 -> weights 3/4, 1/4.
    let r = merge_row(3f32.ln(), 0.0, true);
    let (prefix_weight, suffix_weight, lse) = blend_of(r);
    assert!((prefix_weight - 0.75).abs() < 1e-7);
    assert!((suffix_weight - 0.25).abs() < 1e-7);
    assert!((lse - 4f64.ln()).abs() < 1e-7);
    assert!((r.value(8.0, 4.0) - 7.0).abs() < 1e-6);
}

#[test]
fn plus_infinity_means_no_keys() {
    // FA2's +inf on the prefix: all weight on the suffix.
    let r = merge_row(INF, 1.5, true);
    assert_eq!(r.value(100.0, 7.0), 7.0);
    assert_eq!(r.lse(), 1.5);
    // -inf behaves the same.
    assert_eq!(merge_row(-INF, 1.5, true), r);
    // And on the suffix side.
    assert_eq!(merge_row(2.0, INF, true).value(5.0, 9.0), 5.0);
}

#[test]
fn no_keys_on_either_side_gives_the_prefix_and_minus_infinity() {
    for (p, s) in [(-INF, -INF), (INF, INF), (INF, -INF), (-INF, INF)] {
        let r = merge_row(p, s, true);
        assert_eq!(r, RowMerge::CopyPrefix);
        assert_eq!(r.value(3.0, f64::NAN), 3.0, "never NaN from the suffix");
        assert_eq!(r.lse(), f64::NEG_INFINITY);
    }
}

#[test]
fn threshold_copies_the_suffix_and_its_lse_as_given() {
    for t in [0usize, 4, 7] {
        let n = 4; // prefill_tokens_with_context
        let r = merge_row(1.0, INF, t < n);
        if t < n {
            assert_eq!(r.value(2.0, 9.0), 2.0);
            assert_eq!(r.lse(), 1.0);
        } else {
            assert_eq!(
                r,
                RowMerge::CopySuffix { lse: f64::INFINITY },
                "lse as given, +inf kept"
            );
        }
    }
    // n = 0: every row copies; n = T: none does.
    assert!(matches!(
        merge_row(0.0, 0.0, false),
        RowMerge::CopySuffix { .. }
    ));
}

#[test]
fn nan_propagates() {
    assert!(merge_row(f32::NAN, 0.0, true).value(1.0, 1.0).is_nan());
    assert!(merge_row(0.0, f32::NAN, true).lse().is_nan());
    assert!(merge_row(0.0, 0.0, true).value(f64::NAN, 1.0).is_nan());
}

#[test]
fn nan_lse_beside_an_empty_side_propagates() {
    // A NaN lse on one side and no keys (+inf or -inf) on the other: not a row without keys
    // (that would copy the prefix with lse -inf) but a NaN row with a NaN lse.
    for (p, s) in [
        (f32::NAN, INF),
        (f32::NAN, -INF),
        (INF, f32::NAN),
        (-INF, f32::NAN),
        (f32::NAN, f32::NAN),
    ] {
        let r = merge_row(p, s, true);
        assert!(matches!(r, RowMerge::Blend { .. }), "({p}, {s}) gave {r:?}");
        assert!(r.lse().is_nan(), "({p}, {s})");
        assert!(r.value(3.0, 5.0).is_nan(), "({p}, {s})");
        // The FP8 outputs: the NaN code.
        assert!(fp8_element_matches(&r, 3.0, 5.0, 1.0, fp8::E4M3_NAN));
        assert!(!fp8_element_matches(
            &r,
            3.0,
            5.0,
            1.0,
            fp8::e4m3_from_f32(3.0)
        ));
    }
    // Past the threshold the suffix is copied as given, whatever the prefix lse.
    assert_eq!(
        merge_row(f32::NAN, -INF, false),
        RowMerge::CopySuffix {
            lse: f64::NEG_INFINITY
        }
    );
}

#[test]
fn comparisons() {
    let r = merge_row(0.0, 0.0, true);
    assert!(element_matches(Dtype::Bf16, &r, 1.0, 2.0, 1.5));
    assert!(!element_matches(Dtype::Bf16, &r, 1.0, 2.0, 1.53));
    assert!(element_matches(
        Dtype::F32,
        &r,
        1.0,
        2.0,
        f64::from(1.5f32 + f32::EPSILON)
    ));
    assert!(!element_matches(Dtype::F32, &r, 1.0, 2.0, 1.5001));
    assert!(!element_matches(Dtype::F16, &r, 1.0, 2.0, f64::NAN));
    let copy = merge_row(0.0, 0.0, false);
    assert!(!element_matches(
        Dtype::F32,
        &copy,
        1.0,
        2.0,
        f64::from(2.0f32 + 2.0 * f32::EPSILON)
    ));
    assert!(lse_matches(f64::NEG_INFINITY, f32::NEG_INFINITY));
    assert!(!lse_matches(1.0, f32::NEG_INFINITY));
    assert!(!lse_matches(1.0, 1.0001));
    assert_eq!(round_to(Dtype::Bf16, 1.0 + 1.0 / 256.0), 1.0, "tie to even");
    assert_eq!(ulp(Dtype::F16, 1.0), 1.0 / 1024.0);
}

#[test]
fn layouts_and_lse_indices() {
    let l = Layout {
        token_stride: 4 * 192,
        head_stride: 192,
    };
    assert_eq!(l.row(2, 3), 2 * 768 + 3 * 192);
    assert_eq!(lse_index(true, 10, 4, 3, 2), 2 * 10 + 3);
    assert_eq!(lse_index(false, 10, 4, 3, 2), 3 * 4 + 2);
}

#[test]
fn base_2_blends_by_powers_of_two() {
    let two = LseBase::Two;
    // p = 1, s = 0: a = 2^0 = 1, b = 2^-1 -> weights 2/3, 1/3; lse = log2(1.5) + 1 = log2(3).
    // (Base e gives e/(1+e) and ln(1 + 1/e) + 1: different numbers.)
    let r = two.merge_row(1.0, 0.0, true);
    let (prefix_weight, suffix_weight, lse) = blend_of(r);
    assert!((prefix_weight - 2.0 / 3.0).abs() < 1e-15);
    assert!((suffix_weight - 1.0 / 3.0).abs() < 1e-15);
    assert!((lse - 3f64.log2()).abs() < 1e-15);
    assert!((r.value(3.0, 6.0) - 4.0).abs() < 1e-15);
    assert!((merge_row(1.0, 0.0, true).lse() - (1.0 + (-1f64).exp().ln_1p())).abs() < 1e-15);
    // Equal lse: the mean, lse + log2(2) = lse + 1 exactly.
    let r = two.merge_row(3.0, 3.0, true);
    assert_eq!((r.value(2.0, 4.0), r.lse()), (3.0, 4.0));
    // +inf still means no keys: all weight on the other side, its lse.
    let r = two.merge_row(INF, 1.5, true);
    assert_eq!((r.value(100.0, 7.0), r.lse()), (7.0, 1.5));
    // Past the threshold the suffix and its lse as given, +inf kept.
    assert_eq!(
        two.merge_row(1.0, INF, false),
        RowMerge::CopySuffix { lse: f64::INFINITY }
    );
}

#[test]
fn base_2_rows_without_keys_are_zeros_not_the_prefix() {
    for (p, s) in [(-INF, -INF), (INF, INF), (INF, -INF), (-INF, INF)] {
        let r = LseBase::Two.merge_row(p, s, true);
        assert_eq!(
            (r.value(3.0, -5.0), r.lse()),
            (0.0, f64::NEG_INFINITY),
            "({p}, {s})"
        );
        assert!(element_matches(Dtype::Bf16, &r, 3.0, -5.0, 0.0));
        assert!(
            !element_matches(Dtype::Bf16, &r, 3.0, -5.0, 3.0),
            "the prefix is wrong here"
        );
        assert_ne!(r, merge_row(p, s, true), "base e copies the prefix");
    }
    // A NaN beside an empty side stays NaN, as in base e.
    for (p, s) in [(f32::NAN, -INF), (INF, f32::NAN)] {
        let r = LseBase::Two.merge_row(p, s, true);
        assert!(r.lse().is_nan() && r.value(3.0, 5.0).is_nan(), "({p}, {s})");
    }
}

#[test]
fn base_2_k_way_merge_by_hand() {
    let two = LseBase::Two;
    // lse 2, 1, 1, 0: weights 1, 1/2, 1/2, 1/4 before normalizing (sum 9/4); lse = log2(9/4) + 2.
    let r = two.merge_states_row(&[2.0, 1.0, 1.0, 0.0]);
    let (v, _) = r.value_and_magnitude(&[9.0, 0.0, 0.0, 0.0]);
    assert!((v - 4.0).abs() < 1e-14, "{v}");
    assert!((r.lse() - 9f64.log2()).abs() < 1e-14);
    // Equal lse: the mean, lse + log2(K).
    let r = two.merge_states_row(&[1.0; 4]);
    assert_eq!(r.value_and_magnitude(&[1.0, 2.0, 3.0, 6.0]).0, 3.0);
    assert_eq!(r.lse(), 3.0);
    // No keys in any state: zeros (never state 0's row), lse -inf.
    let r = two.merge_states_row(&[INF, -INF, -INF]);
    assert_eq!(r.value_and_magnitude(&[7.0, 1.0, 2.0]).0, 0.0);
    assert_eq!(r.lse(), f64::NEG_INFINITY);
    assert!(states_element_matches(
        Dtype::F16,
        &r,
        &[7.0, 1.0, 2.0],
        0.0
    ));
    assert!(!states_element_matches(
        Dtype::F16,
        &r,
        &[7.0, 1.0, 2.0],
        7.0
    ));
    // The kernel writes zero words: an infinite element is 0 there, not inf x 0 = NaN.
    assert_eq!(r.value_and_magnitude(&[f64::INFINITY, 1.0, 2.0]).0, 0.0);
    // A NaN lse propagates.
    assert!(two.merge_states_row(&[-INF, f32::NAN]).lse().is_nan());
    // Two states agree with the pairwise merge in base 2.
    for (p, s) in [(0.5f32, -1.25f32), (-INF, 2.0), (INF, -INF)] {
        let (pair, k) = (two.merge_row(p, s, true), two.merge_states_row(&[p, s]));
        assert_eq!(k.lse(), pair.lse(), "({p}, {s})");
        let (v, _) = k.value_and_magnitude(&[1.5, -2.0]);
        assert!((v - pair.value(1.5, -2.0)).abs() < 1e-15, "({p}, {s})");
    }
}

#[test]
fn base_2_one_state_is_its_row_and_lse_as_given() {
    // FlashInfer's MergeStates with K = 1, empty rows and NaN included; base e merges instead.
    for lse in [0.5f32, INF, -INF, f32::NAN] {
        let r = LseBase::Two.merge_states_row(&[lse]);
        assert_eq!(r.value_and_magnitude(&[7.0]).0, 7.0, "{lse}");
        assert_eq!(r.lse().to_bits(), f64::from(lse).to_bits(), "{lse}");
        assert!(states_element_matches(Dtype::Bf16, &r, &[7.0], 7.0));
        assert!(!states_element_matches(Dtype::Bf16, &r, &[7.0], 0.0));
    }
    assert_eq!(merge_states_row(&[INF]).lse(), f64::NEG_INFINITY);
    assert!(merge_states_row(&[f32::NAN])
        .value_and_magnitude(&[7.0])
        .0
        .is_nan());
}

#[test]
fn lse_base_from_the_manifest_field() {
    assert_eq!(LseBase::from_manifest(None), Some(LseBase::E));
    assert_eq!(LseBase::from_manifest(Some("e")), Some(LseBase::E));
    assert_eq!(LseBase::from_manifest(Some("2")), Some(LseBase::Two));
    assert_eq!(LseBase::from_manifest(Some("10")), None);
}
