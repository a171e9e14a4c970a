//! The float64 reference: docs/SEMANTICS.md as plain code, the yardstick every kernel is
//! checked against. Values are f64; converting inputs from f16/bf16/f32 is exact.

use crate::dtype::Dtype;

pub use crate::contract::Layout;

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
    /// No keys on either side (base e): the prefix row; lse = -inf.
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

// The one type of the lse base: the spec's option (crate::gen::variant re-exports it), the
// manifest's `variant.lse_base` (absent for base e) and the reference's arithmetic. A row without
// keys: base e keeps the first side's row, base 2 blends with weights 0 (FlashInfer's rule).
/// The base of the lse a kernel reads and writes (docs/SEMANTICS.md, "lse in base 2"). Hosts
/// select it by the `select` block's `lse_base`, which base-2 kernels alone name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum LseBase {
    /// lse = ln(sum of exp(logit)): vLLM's, FlashAttention's and SGLang's.
    #[default]
    #[serde(rename = "e")]
    E,
    /// lse = log2(sum of 2^logit): FlashInfer's, with its rule for a row without keys (zeros).
    #[serde(rename = "2")]
    Two,
}

impl LseBase {
    /// Each base by its spec and manifest name.
    pub const ALL: [(&'static str, LseBase); 2] = [("e", LseBase::E), ("2", LseBase::Two)];
    /// Base e (the manifest omits the field).
    pub fn is_e(&self) -> bool {
        *self == LseBase::E
    }
    /// The base given the manifest's `variant.lse_base` value (None: the field is absent).
    pub fn from_manifest(value: Option<&str>) -> Option<LseBase> {
        let name = value.unwrap_or("e");
        Self::ALL
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, base)| base)
    }
    /// base^x.
    fn pow(self, x: f64) -> f64 {
        match self {
            LseBase::E => x.exp(),
            LseBase::Two => x.exp2(),
        }
    }
    /// log_base(x).
    fn log(self, x: f64) -> f64 {
        match self {
            LseBase::E => x.ln(),
            LseBase::Two => x.log2(),
        }
    }

    /// [`merge_row`] in this base. Base 2 differs in the arithmetic and in one rule: a row with
    /// context and no keys on either side is blended with weights 0 (zeros for finite rows),
    /// lse -inf, where base e copies the prefix.
    pub fn merge_row(self, prefix_lse: f32, suffix_lse: f32, has_context: bool) -> RowMerge {
        if !has_context {
            return RowMerge::CopySuffix {
                lse: f64::from(suffix_lse),
            };
        }
        let p = no_keys_as_minus_inf(prefix_lse);
        let s = no_keys_as_minus_inf(suffix_lse);
        // Not f64::max, nor `p > s ? p : s` alone: a NaN on either side makes m NaN, also beside
        // an empty side (-inf), so that the row and its lse are NaN rather than a copy of the
        // prefix.
        let m = max_keep_nan(p, s);
        if m == f64::NEG_INFINITY {
            return match self {
                LseBase::E => RowMerge::CopyPrefix,
                LseBase::Two => RowMerge::Blend {
                    prefix_weight: 0.0,
                    suffix_weight: 0.0,
                    lse: f64::NEG_INFINITY,
                },
            };
        }
        let a = self.pow(p - m);
        let b = self.pow(s - m);
        RowMerge::Blend {
            prefix_weight: a / (a + b),
            suffix_weight: b / (a + b),
            lse: self.log(a + b) + m,
        }
    }

    /// [`merge_states_row`] in this base. Base 2 differs in the arithmetic and in two rules: one
    /// state (K = 1, a runtime-K kernel) is its row and lse as given, and a row without keys in
    /// any state is zeros, lse -inf.
    pub fn merge_states_row(self, lse: &[f32]) -> StatesMerge {
        if self == LseBase::Two && lse.len() == 1 {
            return StatesMerge::AsGiven {
                lse: f64::from(lse[0]),
            };
        }
        // The largest lse; a NaN anywhere makes it NaN (and then every weight).
        let m = lse
            .iter()
            .map(|&x| no_keys_as_minus_inf(x))
            .fold(f64::NEG_INFINITY, max_keep_nan);
        if m == f64::NEG_INFINITY {
            return match self {
                LseBase::E => StatesMerge::CopyFirst,
                LseBase::Two => StatesMerge::Zeros,
            };
        }
        let w: Vec<f64> = lse
            .iter()
            .map(|&x| self.pow(no_keys_as_minus_inf(x) - m))
            .collect();
        let sum: f64 = w.iter().sum();
        StatesMerge::Blend {
            weights: w.iter().map(|x| x / sum).collect(),
            lse: self.log(sum) + m,
        }
    }
}

/// FA2 reports an empty sequence as +inf, FA3 as -inf: both mean "no keys" (in either base).
fn no_keys_as_minus_inf(x: f32) -> f64 {
    let x = f64::from(x);
    if x == f64::INFINITY {
        f64::NEG_INFINITY
    } else {
        x
    }
}

/// The larger of two lse values, NaN if either is NaN.
fn max_keep_nan(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a > b {
        a
    } else {
        b
    }
}

/// How row (t, h) merges, given its two lse values and whether the token has context
/// (`t < prefill_tokens_with_context`), in base e ([`LseBase::merge_row`] for either base).
pub fn merge_row(prefix_lse: f32, suffix_lse: f32, has_context: bool) -> RowMerge {
    LseBase::E.merge_row(prefix_lse, suffix_lse, has_context)
}

/// How one row of a K-way merge combines its K states (`merge_states`).
#[derive(Debug, Clone, PartialEq)]
pub enum StatesMerge {
    /// No keys in any state (every lse -inf or +inf; base e): state 0's row; lse = -inf.
    CopyFirst,
    /// One state in base 2: its row, and its lse as given (+inf and NaN included).
    AsGiven { lse: f64 },
    /// No keys in any state, base 2: every element +0 (the kernel writes zero words, so an
    /// infinite element gives 0, not inf x 0); lse = -inf.
    Zeros,
    /// `out = sum_k state_k * weights[k]`; a NaN lse makes every weight and the lse NaN.
    Blend { weights: Vec<f64>, lse: f64 },
}

impl StatesMerge {
    pub fn lse(&self) -> f64 {
        match self {
            StatesMerge::CopyFirst | StatesMerge::Zeros => f64::NEG_INFINITY,
            StatesMerge::AsGiven { lse } | StatesMerge::Blend { lse, .. } => *lse,
        }
    }
    /// The merged value and the magnitude `sum |state_k * w_k|` a float32 evaluation's rounding
    /// error is relative to, from the K values of one element.
    pub fn value_and_magnitude(&self, values: &[f64]) -> (f64, f64) {
        match self {
            StatesMerge::CopyFirst | StatesMerge::AsGiven { .. } => (values[0], values[0].abs()),
            StatesMerge::Zeros => (0.0, 0.0),
            StatesMerge::Blend { weights, .. } => weights
                .iter()
                .zip(values)
                .fold((0.0, 0.0), |(v, m), (w, x)| (v + w * x, m + (w * x).abs())),
        }
    }
}

/// How row (t, h) of a K-way merge combines its states, given their K lse values, in base e
/// ([`LseBase::merge_states_row`] for either base).
pub fn merge_states_row(lse: &[f32]) -> StatesMerge {
    LseBase::E.merge_states_row(lse)
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
        StatesMerge::CopyFirst | StatesMerge::AsGiven { .. } | StatesMerge::Zeros => None,
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

/// FP8 e4m3 as the kernels produce it (reference/fp8.rs).
pub mod fp8;
