//! The float64 reference: docs/SEMANTICS.md as plain code, the yardstick every kernel is
//! checked against. Values are f64; converting inputs from f16/bf16/f32 is exact.

use crate::dtype::Dtype;

/// A `[T, H, D]` tensor view in elements: row (t, h) starts at `t*token_stride + h*head_stride`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub token_stride: usize,
    pub head_stride: usize,
}

impl Layout {
    pub fn contiguous(heads: usize, head_size: usize) -> Layout {
        Layout {
            token_stride: heads * head_size,
            head_stride: head_size,
        }
    }
    pub fn row(&self, t: usize, h: usize) -> usize {
        t * self.token_stride + h * self.head_stride
    }
}

/// Where `(t, h)` of an lse array lives.
pub fn lse_index(
    head_major: bool,
    num_tokens: usize,
    num_heads: usize,
    t: usize,
    h: usize,
) -> usize {
    if head_major {
        h * num_tokens + t
    } else {
        t * num_heads + h
    }
}

/// The merge of one row: the weights the row gets and its lse.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RowMerge {
    /// Past the threshold: the suffix row as is; lse = suffix lse as given.
    CopySuffix { lse: f64 },
    /// No keys on either side: the prefix row; lse = -inf.
    CopyPrefix,
    /// `out = prefix * prefix_weight + suffix * suffix_weight`.
    Blend {
        prefix_weight: f64,
        suffix_weight: f64,
        lse: f64,
    },
}

impl RowMerge {
    pub fn lse(&self) -> f64 {
        match *self {
            RowMerge::CopySuffix { lse } | RowMerge::Blend { lse, .. } => lse,
            RowMerge::CopyPrefix => f64::NEG_INFINITY,
        }
    }
    /// The merged value of one element, in float64.
    pub fn value(&self, prefix: f64, suffix: f64) -> f64 {
        match *self {
            RowMerge::CopySuffix { .. } => suffix,
            RowMerge::CopyPrefix => prefix,
            RowMerge::Blend {
                prefix_weight,
                suffix_weight,
                ..
            } => prefix * prefix_weight + suffix * suffix_weight,
        }
    }
    /// |prefix term| + |suffix term|: the scale a float32 evaluation's rounding error is
    /// relative to (the sum itself can cancel to near zero).
    pub fn magnitude(&self, prefix: f64, suffix: f64) -> f64 {
        match *self {
            RowMerge::CopySuffix { .. } => suffix.abs(),
            RowMerge::CopyPrefix => prefix.abs(),
            RowMerge::Blend {
                prefix_weight,
                suffix_weight,
                ..
            } => (prefix * prefix_weight).abs() + (suffix * suffix_weight).abs(),
        }
    }
}

/// How row (t, h) merges, given its two lse values and whether the token has context
/// (`t < prefill_tokens_with_context`).
pub fn merge_row(prefix_lse: f32, suffix_lse: f32, has_context: bool) -> RowMerge {
    if !has_context {
        return RowMerge::CopySuffix {
            lse: f64::from(suffix_lse),
        };
    }
    // FA2 reports an empty sequence as +inf, FA3 as -inf: both mean "no keys".
    let no_keys = |x: f64| {
        if x == f64::INFINITY {
            f64::NEG_INFINITY
        } else {
            x
        }
    };
    let p = no_keys(f64::from(prefix_lse));
    let s = no_keys(f64::from(suffix_lse));
    // Not f64::max, nor `p > s ? p : s` alone: a NaN on either side makes m NaN, also beside an
    // empty side (-inf), so that the row and its lse are NaN rather than a copy of the prefix.
    let m = if p.is_nan() || s.is_nan() {
        f64::NAN
    } else if p > s {
        p
    } else {
        s
    };
    if m == f64::NEG_INFINITY {
        return RowMerge::CopyPrefix;
    }
    let a = (p - m).exp();
    let b = (s - m).exp();
    RowMerge::Blend {
        prefix_weight: a / (a + b),
        suffix_weight: b / (a + b),
        lse: (a + b).ln() + m,
    }
}

/// How one row of a K-way merge combines its K states (`merge_states`).
#[derive(Debug, Clone, PartialEq)]
pub enum StatesMerge {
    /// No keys in any state (every lse -inf or +inf): state 0's row; lse = -inf.
    CopyFirst,
    /// `out = sum_k state_k * weights[k]`; a NaN lse makes every weight and the lse NaN.
    Blend { weights: Vec<f64>, lse: f64 },
}

impl StatesMerge {
    pub fn lse(&self) -> f64 {
        match self {
            StatesMerge::CopyFirst => f64::NEG_INFINITY,
            StatesMerge::Blend { lse, .. } => *lse,
        }
    }
    /// The merged value and the magnitude `sum |state_k * w_k|` a float32 evaluation's rounding
    /// error is relative to, from the K values of one element.
    pub fn value_and_magnitude(&self, values: &[f64]) -> (f64, f64) {
        match self {
            StatesMerge::CopyFirst => (values[0], values[0].abs()),
            StatesMerge::Blend { weights, .. } => weights
                .iter()
                .zip(values)
                .fold((0.0, 0.0), |(v, m), (w, x)| (v + w * x, m + (w * x).abs())),
        }
    }
}

/// How row (t, h) of a K-way merge combines its states, given their K lse values.
pub fn merge_states_row(lse: &[f32]) -> StatesMerge {
    let no_keys = |x: f32| {
        let x = f64::from(x);
        if x == f64::INFINITY {
            f64::NEG_INFINITY
        } else {
            x
        }
    };
    // The largest lse; a NaN anywhere makes it NaN (and then every weight).
    let m = lse
        .iter()
        .map(|&x| no_keys(x))
        .fold(f64::NEG_INFINITY, |m, x| {
            if m.is_nan() || x.is_nan() {
                f64::NAN
            } else if x > m {
                x
            } else {
                m
            }
        });
    if m == f64::NEG_INFINITY {
        return StatesMerge::CopyFirst;
    }
    let w: Vec<f64> = lse.iter().map(|&x| (no_keys(x) - m).exp()).collect();
    let sum: f64 = w.iter().sum();
    StatesMerge::Blend {
        weights: w.iter().map(|x| x / sum).collect(),
        lse: sum.ln() + m,
    }
}

/// `mask_empty_context_lse`: set lse to -inf for every head of the tokens of requests whose
/// context is empty. Request b holds tokens `query_start_loc[b] .. query_start_loc[b+1]`
/// (non-decreasing start locations); its context is empty when
/// `context_start_loc[b+1] == context_start_loc[b]`. Tokens outside every request keep their lse.
pub fn mask_empty_context(
    lse: &mut [f32],
    head_major: bool,
    (num_tokens, num_heads): (usize, usize),
    query_start_loc: &[i32],
    context_start_loc: &[i32],
) {
    for b in 0..query_start_loc.len().saturating_sub(1) {
        if context_start_loc[b + 1] != context_start_loc[b] {
            continue;
        }
        let clamp = |x: i32| (x.max(0) as usize).min(num_tokens);
        for t in clamp(query_start_loc[b])..clamp(query_start_loc[b + 1]) {
            for h in 0..num_heads {
                lse[lse_index(head_major, num_tokens, num_heads, t, h)] = f32::NEG_INFINITY;
            }
        }
    }
}

/// Round a float64 to the nearest value of `dtype` (ties to even), returned as f64.
pub fn round_to(dtype: Dtype, x: f64) -> f64 {
    match dtype {
        Dtype::F32 => f64::from(x as f32),
        Dtype::F16 => f64::from(half::f16::from_f64(x)),
        Dtype::Bf16 => f64::from(half::bf16::from_f64(x)),
        Dtype::Fp8E4m3 => fp8::e4m3_to_f64(fp8::e4m3_from_f32(x as f32)),
        // Index and mask types: integers, no merge rounds into them.
        Dtype::I32 | Dtype::U8 => x.round_ties_even(),
    }
}

/// Distance between `x` (a value of `dtype`) and the next representable value away from zero.
pub fn ulp(dtype: Dtype, x: f64) -> f64 {
    let x = x.abs();
    match dtype {
        Dtype::F32 => {
            let f = x as f32;
            f64::from(f32::from_bits(f.to_bits() + 1)) - f64::from(f)
        }
        Dtype::F16 => {
            let h = half::f16::from_f64(x);
            f64::from(half::f16::from_bits(h.to_bits() + 1)) - f64::from(h)
        }
        Dtype::Bf16 => {
            let h = half::bf16::from_f64(x);
            f64::from(half::bf16::from_bits(h.to_bits() + 1)) - f64::from(h)
        }
        Dtype::Fp8E4m3 => {
            let c = fp8::e4m3_from_f32(x as f32) & 0x7f;
            // Past the largest finite value the step below it stands in.
            let (lo, hi) = if c >= 0x7e { (0x7d, 0x7e) } else { (c, c + 1) };
            fp8::e4m3_to_f64(hi) - fp8::e4m3_to_f64(lo)
        }
        Dtype::I32 | Dtype::U8 => 1.0,
    }
}

/// Per-element relative tolerance of a float32 merge rounded into `dtype`.
pub fn tolerance(dtype: Dtype) -> f64 {
    match dtype {
        Dtype::F32 => 1e-6,
        Dtype::F16 => 1e-3,
        Dtype::Bf16 => 8e-3,
        // Judged by e4m3 steps, not relative error: see fp8_element_matches.
        Dtype::Fp8E4m3 => 0.0,
        Dtype::I32 | Dtype::U8 => 0.0,
    }
}

/// Does a kernel's FP8 e4m3 output code match? Copied rows (and the no-keys prefix) must be the
/// exact code of `input * RN(1 / scale)` in float32 ([`fp8::e4m3_scaled`]); merged values within
/// one e4m3 step of the float64 reference's conversion of `value / scale` (the float32 merge and
/// the reciprocal may round differently before converting).
pub fn fp8_element_matches(row: &RowMerge, prefix: f32, suffix: f32, scale: f32, got: u8) -> bool {
    match row {
        RowMerge::CopySuffix { .. } => got == fp8::e4m3_scaled(suffix, scale),
        RowMerge::CopyPrefix => got == fp8::e4m3_scaled(prefix, scale),
        RowMerge::Blend { .. } => {
            let want = row.value(f64::from(prefix), f64::from(suffix)) / f64::from(scale);
            let want_code = fp8::e4m3_from_f32(want as f32);
            if want_code & 0x7f == fp8::E4M3_NAN || got & 0x7f == fp8::E4M3_NAN {
                return want_code & 0x7f == got & 0x7f;
            }
            let (g, w) = (fp8::e4m3_to_f64(got), fp8::e4m3_to_f64(want_code));
            g == w || (g - w).abs() <= ulp(Dtype::Fp8E4m3, g).max(ulp(Dtype::Fp8E4m3, w))
        }
    }
}

/// Does a kernel's per-token-group FP8 scale match? `values`: the float64 reference values of the
/// group's elements (`row.value(prefix, suffix)`). Copied rows: their float32 values are known
/// exactly, so the scale must be bit-exact. Blends: between the scales of the float64 absmax
/// moved by ±1e-5 relative (the float32 merge rounds each value a few ulps from float64).
pub fn fp8_group_scale_matches(row: &RowMerge, values: &[f64], ue8m0: bool, got: f32) -> bool {
    match row {
        RowMerge::CopySuffix { .. } | RowMerge::CopyPrefix => {
            let absmax = fp8::group_absmax(values.iter().map(|&v| v as f32));
            got.to_bits() == fp8::group_scale(absmax, ue8m0).to_bits()
        }
        RowMerge::Blend { .. } => {
            let absmax = values.iter().fold(0.0f64, |a, v| a.max(v.abs()));
            let near = |f: f64| fp8::group_scale((absmax * f) as f32, ue8m0);
            let (lo, hi) = (near(1.0 - 1e-5), near(1.0 + 1e-5));
            got >= lo.min(hi) && got <= lo.max(hi)
        }
    }
}

/// Does `got` match the float64 value `want` rounded into `dtype`? NaN matches only NaN and
/// infinities match exactly; a copy (`blend` = None) must be exact, a blend may be off by
/// `relative * magnitude` plus one ulp of the rounded value.
fn value_matches(dtype: Dtype, want: f64, got: f64, blend: Option<(f64, f64)>) -> bool {
    if want.is_nan() || got.is_nan() {
        return want.is_nan() && got.is_nan();
    }
    let rounded = round_to(dtype, want);
    if rounded.is_infinite() || got.is_infinite() {
        return rounded == got;
    }
    match blend {
        None => got == rounded,
        Some((relative, magnitude)) => {
            (got - rounded).abs() <= relative * magnitude + ulp(dtype, rounded)
        }
    }
}

/// Does a kernel's element `got` match the reference?
/// Copies must be exact; blends within `tolerance * magnitude` plus one ulp of the rounded
/// reference. NaN matches only NaN; infinities match exactly.
pub fn element_matches(dtype: Dtype, row: &RowMerge, prefix: f64, suffix: f64, got: f64) -> bool {
    let blend = match row {
        RowMerge::CopySuffix { .. } | RowMerge::CopyPrefix => None,
        RowMerge::Blend { .. } => Some((tolerance(dtype), row.magnitude(prefix, suffix))),
    };
    value_matches(dtype, row.value(prefix, suffix), got, blend)
}

/// [`element_matches`] for a K-way merge: a float32 sum of K products may be off by about
/// (K + 2) float32 roundings of the magnitude, which for K = 16 is above f32's 1e-6.
pub fn states_element_matches(dtype: Dtype, merge: &StatesMerge, values: &[f64], got: f64) -> bool {
    let (want, magnitude) = merge.value_and_magnitude(values);
    let blend = match merge {
        StatesMerge::CopyFirst => None,
        StatesMerge::Blend { weights, .. } => {
            let f32_sum = (weights.len() as f64 + 2.0) * f64::from(f32::EPSILON) / 2.0;
            Some((tolerance(dtype).max(f32_sum), magnitude))
        }
    };
    value_matches(dtype, want, got, blend)
}

/// Does a kernel's output lse match? Within 1e-5 absolute; -inf, +inf and NaN exactly.
pub fn lse_matches(want: f64, got: f32) -> bool {
    let got = f64::from(got);
    if want.is_nan() || got.is_nan() {
        return want.is_nan() && got.is_nan();
    }
    if want.is_infinite() || got.is_infinite() {
        return want == got;
    }
    (want - got).abs() <= 1e-5
}

#[cfg(test)]
mod tests;

/// FP8 e4m3 ("e4m3fn": no infinities, NaN = 0x7f/0xff, largest finite ±448) as the kernels
/// produce it: round to nearest even, saturating. The CUDA templates implement the same integer
/// algorithm, so the two agree bit for bit on the same float32 input.
pub mod fp8 {
    /// Largest finite e4m3 magnitude.
    pub const E4M3_MAX: f32 = 448.0;
    /// The code NaN converts to.
    pub const E4M3_NAN: u8 = 0x7f;

    /// float32 -> e4m3: NaN -> 0x7f; |x| >= 448 (infinities too) -> ±448; subnormals below 2^-6
    /// in steps of 2^-9; ties to even; the sign of zero kept.
    pub fn e4m3_from_f32(x: f32) -> u8 {
        let bits = x.to_bits();
        let sign = ((bits >> 31) as u8) << 7;
        let a = f32::from_bits(bits & 0x7fff_ffff);
        if a.is_nan() {
            return E4M3_NAN;
        }
        if a >= E4M3_MAX {
            return sign | 0x7e;
        }
        if a < 1.0 / 64.0 {
            // Subnormal range: code = round_half_even(a / 2^-9), 0..=8 (8 = the smallest normal).
            return sign | (a * 512.0).round_ties_even() as u8;
        }
        let exp = ((bits >> 23) & 0xff) as i32 - 127 + 7; // 1..=15
        let mant = bits & 0x7f_ffff;
        let mut code = ((exp as u32) << 3) | (mant >> 20);
        let rest = mant & 0xf_ffff;
        if rest > 0x8_0000 || (rest == 0x8_0000 && code & 1 == 1) {
            code += 1; // a carry into the exponent is the right next value
        }
        sign | code.min(0x7e) as u8
    }

    /// e4m3 -> its value (NaN for 0x7f/0xff).
    pub fn e4m3_to_f64(code: u8) -> f64 {
        let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
        let exp = i32::from((code >> 3) & 0xf);
        let mant = f64::from(code & 7);
        if exp == 15 && mant == 7.0 {
            return f64::NAN;
        }
        if exp == 0 {
            sign * mant * 2f64.powi(-9)
        } else {
            sign * (1.0 + mant / 8.0) * 2f64.powi(exp - 7)
        }
    }

    /// The reciprocal every FP8 kernel multiplies by: `1 / scale` rounded to float32 (nearest
    /// even), once per tensor or group.
    pub fn reciprocal(scale: f32) -> f32 {
        1.0 / scale
    }

    /// The FP8 output of a float32 value under `scale` (per tensor, or a group's as written):
    /// `saturate(RN(value * RN(1 / scale)))`, a multiplication by the float32 reciprocal as the
    /// kernels do it, not a division (docs/SEMANTICS.md).
    pub fn e4m3_scaled(value: f32, scale: f32) -> u8 {
        e4m3_from_f32(value * reciprocal(scale))
    }

    /// The scale of one per-token group from the float32 absmax of its values (NaN elements do
    /// not count: `f32::max` drops them, like CUDA's `fmaxf`): `max(absmax, 1e-10) / 448` in
    /// float32, and with `ue8m0` rounded up to a power of two (a mantissa left after the division
    /// moves the exponent up one; a power of two stays).
    pub fn group_scale(absmax: f32, ue8m0: bool) -> f32 {
        let scale = absmax.max(1e-10) / E4M3_MAX;
        let bits = scale.to_bits();
        if ue8m0 && bits & 0x7f_ffff != 0 {
            f32::from_bits((bits & 0xff80_0000) + 0x80_0000)
        } else {
            scale
        }
    }

    /// The float32 absmax of a group the way the kernels take it: `fmaxf(acc, |x|)` from 0.
    pub fn group_absmax(values: impl IntoIterator<Item = f32>) -> f32 {
        values.into_iter().fold(0.0f32, |m, x| m.max(x.abs()))
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn group_scales_by_hand_and_against_exp2_ceil_log2() {
            assert_eq!(group_scale(448.0, false), 1.0);
            assert_eq!(group_scale(0.0, false), 1e-10 / 448.0);
            assert_eq!(
                group_scale(f32::NAN, false),
                1e-10 / 448.0,
                "NaN does not count"
            );
            assert_eq!(group_scale(448.0, true), 1.0, "a power of two stays");
            assert_eq!(group_scale(449.0, true), 2.0);
            assert_eq!(group_scale(300.0, true), 1.0);
            assert_eq!(group_absmax([1.0, -7.5, f32::NAN, 3.0]), 7.5);
            // UE8M0 = 2^ceil(log2(scale)) for every normal scale: a sweep over absmax values
            // spanning 2^-40 .. 2^40, every mantissa pattern class.
            let mut x = 1u32;
            for i in 0..200_000u32 {
                x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                let exp = 87 + (i % 80); // 2^-40 .. 2^40
                let absmax = f32::from_bits((exp << 23) | (x & 0x7f_ffff));
                let scale = group_scale(absmax, false);
                let want = 2f64.powf(f64::from(scale).log2().ceil()) as f32;
                assert_eq!(group_scale(absmax, true), want, "absmax {absmax:e}");
                assert_eq!(scale, absmax.max(1e-10) / 448.0);
            }
        }

        /// Independent oracle: the nearest of all finite codes by exhaustive search, ties to the
        /// even code, saturating, NaN to 0x7f.
        fn oracle(x: f32) -> u8 {
            if x.is_nan() {
                return E4M3_NAN;
            }
            let x = f64::from(x);
            if x.abs() >= 448.0 {
                return if x < 0.0 { 0xfe } else { 0x7e };
            }
            let mut best: Option<(f64, u8)> = None;
            for code in 0u8..=0x7e {
                let v = e4m3_to_f64(code);
                let d = (v - x.abs()).abs();
                best = match best {
                    Some((bd, bc)) if bd < d || (bd == d && bc % 2 == 0) => Some((bd, bc)),
                    _ => Some((d, code)),
                };
            }
            let code = best.map_or(0, |b| b.1);
            if x.is_sign_negative() {
                code | 0x80
            } else {
                code
            }
        }

        #[test]
        fn every_code_round_trips() {
            for code in 0u8..=255 {
                let v = e4m3_to_f64(code);
                if v.is_nan() {
                    assert!(code & 0x7f == 0x7f);
                    continue;
                }
                assert_eq!(e4m3_from_f32(v as f32), code, "code {code:#04x} = {v}");
            }
        }

        #[test]
        fn matches_the_oracle_on_every_input_class() {
            let mut inputs: Vec<f32> = vec![
                0.0,
                -0.0,
                f32::INFINITY,
                f32::NEG_INFINITY,
                f32::NAN,
                -f32::NAN,
                448.0,
                447.9,
                448.1,
                464.0,
                463.99,
                480.0,
                1e30,
                -1e30,
                f32::MIN_POSITIVE,
                1e-45,
                -1e-45,
                1.0 / 64.0,
                1.0 / 512.0,
                1.0 / 1024.0,
                3.0 / 1024.0,
                0.5 / 512.0 * 3.0,
            ];
            // Ties: midpoints between neighbouring codes (normals and subnormals), both signs.
            for code in 0u8..0x7e {
                let mid = (e4m3_to_f64(code) + e4m3_to_f64(code + 1)) / 2.0;
                for v in [mid, mid.next_up(), mid.next_down()] {
                    inputs.push(v as f32);
                    inputs.push(-(v as f32));
                }
            }
            // Random bit patterns across the whole float32 range, and dense in e4m3's range.
            let mut s = 0x9e37_79b9_7f4a_7c15u64;
            for i in 0..200_000 {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                inputs.push(if i % 2 == 0 {
                    f32::from_bits(s as u32)
                } else {
                    ((s >> 11) as f64 / (1u64 << 53) as f64 * 1000.0 - 500.0) as f32
                });
            }
            for x in inputs {
                assert_eq!(
                    e4m3_from_f32(x),
                    oracle(x),
                    "x = {x:e} ({:#010x})",
                    x.to_bits()
                );
            }
        }

        #[test]
        fn scaled_output_multiplies_by_the_reciprocal() {
            assert_eq!(e4m3_scaled(896.0, 2.0), 0x7e);
            assert_eq!(e4m3_scaled(1.0, 0.5), e4m3_from_f32(2.0));
            assert_eq!(e4m3_scaled(-1e9, 1.0), 0xfe);
            // The reciprocal rounds first: 1/3 in float32 is 0x3eaaaaab, and 3 * that is 1 + 2^-24
            // in float32 arithmetic's real product, rounded to 1.
            assert_eq!(reciprocal(3.0).to_bits(), 0x3eaa_aaab);
            assert_eq!(e4m3_scaled(3.0, 3.0), e4m3_from_f32(1.0));
            // Zero, infinite and NaN scales give what the division gave: the reciprocal is inf, 0
            // or NaN, and 0 * inf, inf * 0 are NaN as 0 / 0 and inf / inf are.
            assert_eq!(e4m3_scaled(1.0, 0.0), 0x7e);
            assert_eq!(e4m3_scaled(0.0, 0.0), E4M3_NAN);
            assert_eq!(e4m3_scaled(5.0, f32::INFINITY), 0);
            assert_eq!(e4m3_scaled(f32::INFINITY, f32::INFINITY), E4M3_NAN);
            assert_eq!(e4m3_scaled(2.0, f32::NAN), E4M3_NAN);
            assert_eq!(e4m3_scaled(-0.0, 2.0), 0x80, "the sign of zero is kept");
        }

        /// The templates' NaN fix-up after `cvt.rn.satfinite.e4m3x2.f32` (prelude.cu.tera,
        /// nan_codes_to_7f), the same integer steps: every byte value in every position of a word,
        /// beside every other byte value, turns 0x7f and 0xff into 0x7f and keeps the rest.
        #[test]
        fn the_kernels_nan_fixup_changes_only_nan_codes() {
            let fix = |c: u32| c & !(((c & 0x7f7f_7f7f).wrapping_add(0x0101_0101)) & 0x8080_8080);
            for pos in 0..4 {
                for b in 0u32..256 {
                    for other in 0u32..256 {
                        let word = (other * 0x0101_0101) & !(0xff << (8 * pos)) | (b << (8 * pos));
                        let want_byte = if b & 0x7f == 0x7f { 0x7f } else { b };
                        let want =
                            (other * 0x0101_0101) & !(0xff << (8 * pos)) | (want_byte << (8 * pos));
                        let want = (0..4).fold(want, |w, q| {
                            if q != pos && other & 0x7f == 0x7f {
                                w & !(0xff << (8 * q)) | (0x7f << (8 * q))
                            } else {
                                w
                            }
                        });
                        assert_eq!(fix(word), want, "word {word:#010x}");
                    }
                }
            }
        }

        /// Distance in e4m3 steps between two codes (both non-NaN), on the line where neighbouring
        /// codes are neighbouring integers.
        fn steps(a: u8, b: u8) -> i32 {
            let line = |c: u8| {
                if c & 0x80 != 0 {
                    -i32::from(c & 0x7f)
                } else {
                    i32::from(c)
                }
            };
            (line(a) - line(b)).abs()
        }

        /// The multiplication by the rounded reciprocal against the exact quotient: for scales
        /// whose reciprocal is a normal float32 (2^-126 <= scale <= 2^126: every group scale, every
        /// realistic per-tensor scale), `e4m3(RN(value * RN(1/scale)))` is within one e4m3 step of
        /// the e4m3 code of the exact float64 `value / scale`, and equal to it unless that quotient
        /// lies within 2^-22 (relative) of a rounding boundary. Random values and scales over many
        /// binades, scales that are not powers of two, outputs in the subnormal range and past
        /// saturation.
        #[test]
        fn reciprocal_multiplication_stays_within_one_step_of_the_exact_quotient() {
            let mut s = 0x2545_f491_4f6c_dd1du64;
            let mut next = || {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                s
            };
            let (mut differ, mut total) = (0u64, 0u64);
            for i in 0..2_000_000u64 {
                let r = next();
                // Scales 2^-40 .. 2^40 with random mantissas (a power of two now and then).
                let scale_exp = 87 + (r % 80) as u32;
                let mant = if i % 17 == 0 {
                    0
                } else {
                    (r >> 8) as u32 & 0x7f_ffff
                };
                let scale = f32::from_bits((scale_exp << 23) | mant);
                // value / scale spread over e4m3's whole range and beyond: 2^-14 .. 2^11, both
                // signs, so subnormal outputs (below 2^-6), normals and saturation all occur.
                let q = f64::from((next() >> 40) as u32) / f64::from(1u32 << 24) * 25.0 - 14.0;
                let sign = if r & 1 == 0 { 1.0 } else { -1.0 };
                let value = (sign * 2f64.powf(q) * f64::from(scale)) as f32;
                let exact = f64::from(value) / f64::from(scale);
                // (Through float32: a second rounding that can only matter at an exact tie.)
                let want = e4m3_from_f32(exact as f32);
                let got = e4m3_scaled(value, scale);
                total += 1;
                assert!(
                    steps(got, want) <= 1,
                    "value {value:e} scale {scale:e}: got {got:#04x}, exact quotient {exact:e} -> {want:#04x}"
                );
                if got != want {
                    differ += 1;
                    // Only next to a boundary between two codes.
                    let (a, b) = (e4m3_to_f64(got), e4m3_to_f64(want));
                    let boundary = (a + b) / 2.0;
                    assert!(
                        ((exact - boundary) / boundary).abs() < 2f64.powi(-22),
                        "value {value:e} scale {scale:e}: differs away from a boundary"
                    );
                }
            }
            // Near-ties are rare: the two rules agree on all but a few in 10^5.
            assert!(differ * 10_000 < total, "{differ} of {total} differ");
        }
    }
}
