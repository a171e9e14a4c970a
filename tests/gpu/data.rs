//! Helpers of the GPU suite (tests/gpu.rs) about the data: random inputs with the lse specials,
//! element bits of each dtype, the poison an unwritten element keeps, the suite's layouts, and the
//! checks every family's output shares (padding kept, output lse written or left).

use rayon::prelude::*;

use mla_gen::dtype::Dtype;
use mla_gen::reference::{self, Layout};

pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        // xorshift64*: fast, and plenty for test data.
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

pub fn to_bits(dtype: Dtype, x: f32) -> u32 {
    match dtype {
        Dtype::F32 => x.to_bits(),
        Dtype::F16 => u32::from(half::f16::from_f32(x).to_bits()),
        Dtype::Bf16 => u32::from(half::bf16::from_f32(x).to_bits()),
        Dtype::Fp8E4m3 => u32::from(reference::fp8::e4m3_from_f32(x)),
        other => unreachable!("{other:?} is not a row type"),
    }
}

pub fn from_bits(dtype: Dtype, b: u32) -> f64 {
    match dtype {
        Dtype::F32 => f64::from(f32::from_bits(b)),
        Dtype::F16 => f64::from(half::f16::from_bits(b as u16)),
        Dtype::Bf16 => f64::from(half::bf16::from_bits(b as u16)),
        Dtype::Fp8E4m3 => reference::fp8::e4m3_to_f64(b as u8),
        other => unreachable!("{other:?} is not a row type"),
    }
}

/// NaNs with payloads no arithmetic produces: an element still holding one was never written.
pub fn poison(dtype: Dtype) -> u32 {
    match dtype {
        Dtype::F32 => 0x7fc0_dead,
        // The conversion writes NaN as 0x7f, never 0xff.
        Dtype::Fp8E4m3 => 0xff,
        Dtype::F16 => 0x7e5a,
        Dtype::Bf16 => 0x7fa5,
        other => unreachable!("{other:?} is not a row type"),
    }
}
pub const LSE_POISON: u32 = 0x7fc0_beef;

/// The head padding after row (t, h) of an output must still hold the poison: nothing was
/// written outside the rows.
pub fn padding_error(
    out: &[u32],
    ol: Layout,
    (ti, hi): (usize, usize),
    (h, d): (usize, usize),
    poison: u32,
) -> Option<String> {
    let pad_end = if hi + 1 < h { ol.head_stride } else { d };
    (d..pad_end)
        .find(|&e| out[ol.row(ti, hi) + e] != poison)
        .map(|e| format!("t={ti} h={hi}: wrote padding element {e}"))
}

/// An output lse element: written and within the reference's tolerance when requested, still
/// the poison when the pointer was null.
pub fn output_lse_error(
    with_lse: bool,
    got: u32,
    want: f64,
    (ti, hi): (usize, usize),
) -> Option<String> {
    if !with_lse {
        return (got != LSE_POISON)
            .then(|| format!("t={ti} h={hi}: output_lse written although null"));
    }
    if got == LSE_POISON {
        return Some(format!("t={ti} h={hi}: output_lse never written"));
    }
    (!reference::lse_matches(want, f32::from_bits(got))).then(|| {
        format!(
            "t={ti} h={hi}: lse got {}, want {want}",
            f32::from_bits(got)
        )
    })
}

/// A [T, H, D] tensor's storage on the host, as raw bits.
pub fn random_tensor(dtype: Dtype, t: usize, h: usize, d: usize, l: Layout, seed: u64) -> Vec<u32> {
    let len = if t * h == 0 {
        0
    } else {
        l.row(t - 1, h - 1) + d
    };
    let mut v = vec![poison(dtype); len];
    v.par_chunks_mut(l.token_stride.max(1))
        .enumerate()
        .for_each(|(ti, chunk)| {
            let mut rng = Rng(seed ^ (ti as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            for hi in 0..h {
                let start = hi * l.head_stride;
                if start + d > chunk.len() {
                    break;
                }
                for x in &mut chunk[start..start + d] {
                    *x = to_bits(dtype, (rng.unit() * 8.0 - 4.0) as f32);
                }
            }
        });
    v
}

/// lse with ~10% +inf, ~10% -inf, ~3% rows -inf on both sides, ~0.5% NaN.
pub fn random_lse(n: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let mut rng = Rng(seed | 1);
    let mut p = Vec::with_capacity(n);
    let mut s = Vec::with_capacity(n);
    for _ in 0..n {
        let (mut a, mut b) = (random_lse_value(&mut rng), random_lse_value(&mut rng));
        if rng.unit() < 0.03 {
            a = f32::NEG_INFINITY;
            b = if rng.unit() < 0.5 {
                f32::NEG_INFINITY
            } else {
                f32::INFINITY
            };
        }
        p.push(a);
        s.push(b);
    }
    (p, s)
}

/// One lse value of the suite's mix: ~10% +inf, ~10% -inf, ~0.5% NaN, else finite.
pub fn random_lse_value(rng: &mut Rng) -> f32 {
    let u = rng.unit();
    if u < 0.10 {
        f32::INFINITY
    } else if u < 0.20 {
        f32::NEG_INFINITY
    } else if u < 0.205 {
        f32::NAN
    } else {
        (rng.unit() * 30.0 - 15.0) as f32
    }
}

/// Layouts of one case: (prefix, suffix, output).
pub type Layouts = (Layout, Layout, Layout);

/// The suite's padded layouts: each tensor different (prefix a V of D in a 1.5x-wide buffer,
/// suffix dense, output one vector of head and token padding).
pub fn padded_layouts(d: usize, h: usize, vec: usize) -> Layouts {
    let round = |x: usize| x.div_ceil(vec) * vec;
    (
        Layout {
            head_stride: round(d + d / 2),
            token_stride: h * round(d + d / 2) + vec,
        },
        Layout::contiguous(h, d),
        Layout {
            head_stride: round(d + 1),
            token_stride: h * round(d + 1) + vec,
        },
    )
}

/// Dense layouts: no padding, what a dense specialization takes (and what a general kernel
/// hands to its specialization).
pub fn dense_layouts(d: usize, h: usize) -> Layouts {
    let dense = Layout::contiguous(h, d);
    (dense, dense, dense)
}

/// Start locations of `requests` requests (docs/SEMANTICS.md, the empty-context mask): over the
/// first ~90% of `t` tokens (some requests with no tokens), the rest of the tokens in none; ~40%
/// of the requests with an empty context. (query_start_loc, context_start_loc), B + 1 each.
pub fn start_locations(t: usize, requests: usize, seed: u64) -> (Vec<i32>, Vec<i32>) {
    let mut rng = Rng(seed | 1);
    let covered = t - t / 10;
    let mut cuts: Vec<i32> = (0..requests.saturating_sub(1))
        .map(|_| (rng.unit() * covered as f64) as i32)
        .collect();
    cuts.sort_unstable();
    let mut qsl = vec![0i32];
    qsl.extend(cuts);
    qsl.push(covered as i32);
    let mut csl = vec![0i32];
    for _ in 0..requests {
        let len = if rng.unit() < 0.4 {
            0
        } else {
            1 + (rng.unit() * 100.0) as i32
        };
        csl.push(csl.last().unwrap() + len);
    }
    (qsl, csl)
}
