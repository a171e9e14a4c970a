//! FP8 e4m3 ("e4m3fn": no infinities, NaN = 0x7f/0xff, largest finite ±448) as the kernels
//! produce it: round to nearest even, saturating. The CUDA templates implement the same integer
//! algorithm, so the two agree bit for bit on the same float32 input.

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
/// not count: `f32::max` drops them, like CUDA's `fmaxf`): `max(absmax, 1e-10) x RN(1/448)`,
/// one float32 multiplication (vLLM's rule, docs/SEMANTICS.md), and with `ue8m0` rounded up to a
/// power of two as vLLM does it, 2^ceil(log2f(scale)): a mantissa left moves the exponent up
/// one, except where log2f(scale) rounds to the integer k (a scale a few ulps above 2^k), which
/// keeps 2^k; a power of two stays.
pub fn group_scale(absmax: f32, ue8m0: bool) -> f32 {
    let scale = absmax.max(1e-10) * (1.0 / E4M3_MAX);
    let bits = scale.to_bits();
    if !ue8m0 || bits & 0x7f_ffff == 0 || !scale.is_finite() {
        return scale;
    }
    let power = bits & 0xff80_0000;
    // log2f is within an ulp of log2 and, this close to an integer k, rounds k + (a tiny t) as
    // float32 rounds it: the float32 of the float64 log2.
    if (f64::from(scale).log2() as f32).fract() == 0.0 {
        f32::from_bits(power)
    } else {
        f32::from_bits(power + 0x80_0000)
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
        // RN(1/448) = 0x3b124925: 1e-10 x it is one ulp above the IEEE quotient 1e-10 / 448.
        assert_eq!((1.0f32 / 448.0).to_bits(), 0x3b12_4925);
        assert_eq!(group_scale(0.0, false), 1e-10 * (1.0 / 448.0));
        assert_eq!(
            group_scale(0.0, false).to_bits(),
            (1e-10f32 / 448.0).to_bits() + 1
        );
        assert_eq!(
            group_scale(f32::NAN, false),
            1e-10 * (1.0 / 448.0),
            "NaN does not count"
        );
        assert_eq!(group_scale(448.0, true), 1.0, "a power of two stays");
        // A scale one ulp above 2^-15 (absmax 0x3c600001): log2f gives -15 exactly, and vLLM
        // keeps 2^-15; 0x93 ulps above, the next power (run 133: the one scale of 5,440,000
        // that differed from vLLM's).
        for (absmax, scale, power) in [
            (0x3c60_0001, 0x3800_0001, -15),
            (0x3c60_0100, 0x3800_0093, -14),
        ] {
            let absmax = f32::from_bits(absmax);
            assert_eq!(group_scale(absmax, false).to_bits(), scale);
            assert_eq!(group_scale(absmax, true), 2f32.powi(power));
        }
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
            let want = 2f64.powf(f64::from(f64::from(scale).log2() as f32).ceil()) as f32;
            assert_eq!(group_scale(absmax, true), want, "absmax {absmax:e}");
            // One rounding of max(absmax, 1e-10) x RN(1/448), the exact product in f64: vLLM's
            // formula (its Triton kernel's scales matched bit for bit on the GPU, run 134).
            let exact = f64::from(absmax.max(1e-10)) * f64::from(f32::from_bits(0x3b12_4925));
            assert_eq!(scale, exact as f32, "absmax {absmax:e}");
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
