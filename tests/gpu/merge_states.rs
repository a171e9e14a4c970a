//! The K-way merge (merge_states) in the GPU suite: one case against the float64 reference, and
//! the options the suite cycles through.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use rayon::prelude::*;

use mla_gen::reference::{self, Layout, LseBase, StatesMerge};
use mla_gen::runtime::{Kernel, StatesArgs, StatesLayout};

use crate::common::*;
use crate::data::*;

/// A K-way merge case: K states [T, K, H, D] in padded strides, lse [T, K, H] with the suite's
/// specials and ~3% of rows without keys in any state.
fn run_states_case(
    k: &Kernel,
    base: LseBase,
    stream: &Arc<CudaStream>,
    (t, h, kk): (usize, usize, usize),
    with_lse: bool,
    seed: u64,
) -> Result<u64, String> {
    let dtype = k.meta.dtype().unwrap();
    let d = k.meta.variant.head_size as usize;
    let vec = vec_elems(k);
    let round = |x: usize| x.div_ceil(vec) * vec;
    let head_stride = round(d + d / 2);
    let sl = StatesLayout {
        head_stride,
        state_stride: h * head_stride + vec,
        token_stride: kk * (h * head_stride + vec) + vec,
    };
    let (_, _, ol) = padded_layouts(d, h, vec);
    // The K states as one [T * K, H, D] tensor whose "token" stride is the state stride.
    let rows_layout = Layout {
        token_stride: sl.state_stride,
        head_stride,
    };
    let mut states = random_tensor(dtype, t * kk, h, d, rows_layout, seed ^ 0x1111);
    states.resize(
        if t * h == 0 {
            0
        } else {
            (t - 1) * sl.token_stride + (kk - 1) * sl.state_stride + (h - 1) * head_stride + d
        },
        poison(dtype),
    );
    // Move row (t*K + k) from its packed place to its padded one, last first.
    for ti in (0..t).rev() {
        for ki in (0..kk).rev() {
            let from = (ti * kk + ki) * sl.state_stride;
            let to = ti * sl.token_stride + ki * sl.state_stride;
            if from != to {
                for x in (0..(h - 1) * head_stride + d).rev() {
                    states[to + x] = states[from + x];
                    states[from + x] = poison(dtype);
                }
            }
        }
    }
    let mut rng = Rng(seed ^ 0x3333 | 1);
    let mut lse: Vec<f32> = (0..t * kk * h)
        .map(|_| random_lse_value(&mut rng))
        .collect();
    for ti in 0..t {
        for hi in 0..h {
            if rng.unit() < 0.03 {
                for ki in 0..kk {
                    lse[(ti * kk + ki) * h + hi] = if rng.unit() < 0.5 {
                        f32::NEG_INFINITY
                    } else {
                        f32::INFINITY
                    };
                }
            }
        }
    }
    let out_len = if t * h == 0 {
        0
    } else {
        ol.row(t - 1, h - 1) + d
    };
    let (s_hold, s_buf) = upload_bits(stream, dtype, &states);
    let (o_hold, o_buf) = upload_bits(stream, dtype, &vec![poison(dtype); out_len]);
    let sl_dev: CudaSlice<f32> = stream.clone_htod(&lse).unwrap();
    let ol_dev: CudaSlice<u32> = stream.clone_htod(&vec![LSE_POISON; t * h]).unwrap();
    let args = StatesArgs {
        output: o_buf,
        output_lse: with_lse.then(|| f32_buffer(raw(&ol_dev, stream), t * h)),
        states: s_buf,
        states_lse: f32_buffer(raw(&sl_dev, stream), lse.len()),
        num_tokens: t,
        num_heads: h,
        num_states: kk,
        output_layout: ol,
        states_layout: sl,
    };
    // SAFETY: this case's allocations, alive until the synchronize.
    unsafe { k.launch(stream, &args.args()) }.map_err(|e| e.to_string())?;
    stream.synchronize().map_err(|e| format!("{e:?}"))?;
    let out = download_bits(stream, dtype, o_hold.as_ref());
    let out_lse: Vec<u32> = stream.clone_dtoh(&ol_dev).unwrap();
    drop(s_hold);
    let bad: Option<String> = (0..t * h).into_par_iter().find_map_any(|row| {
        let (ti, hi) = (row / h, row % h);
        let row_lse: Vec<f32> = (0..kk).map(|ki| lse[(ti * kk + ki) * h + hi]).collect();
        let m: StatesMerge = base.merge_states_row(&row_lse);
        let mut values = vec![0.0; kk];
        for e in 0..d {
            let got_bits = out[ol.row(ti, hi) + e];
            if got_bits == poison(dtype) {
                return Some(format!("t={ti} h={hi} e={e}: never written"));
            }
            for (ki, v) in values.iter_mut().enumerate() {
                *v = from_bits(dtype, states[ti * sl.token_stride + ki * sl.state_stride + hi * head_stride + e]);
            }
            let got = from_bits(dtype, got_bits);
            if !reference::states_element_matches(dtype, &m, &values, got) {
                return Some(format!(
                    "t={ti} h={hi} e={e}: got {got:e}, want {:e} (states {values:?}, lse {row_lse:?})",
                    m.value_and_magnitude(&values).0
                ));
            }
        }
        padding_error(&out, ol, (ti, hi), (h, d), poison(dtype))
            .or_else(|| output_lse_error(with_lse, out_lse[ti * h + hi], m.lse(), (ti, hi)))
            .map(|e| format!("{e} (lse {row_lse:?})"))
    });
    match bad {
        None => Ok((t * h * d) as u64),
        Some(b) => Err(b),
    }
}

/// One case of the suite: a runtime-K kernel cycles K over 1, 3, 5 and 16; every third case
/// without the output lse.
pub fn suite_case(
    k: &Kernel,
    base: LseBase,
    stream: &Arc<CudaStream>,
    (t, h): (usize, usize),
    num_states: Option<u32>,
    case: usize,
    seed: u64,
) -> (String, Result<u64, String>) {
    let kk = num_states.map_or([1, 3, 5, 16][case % 4], |n| n as usize);
    let with_lse = k.meta.variant.output_lse && case % 3 != 2;
    // K states of the largest shapes would need gigabytes on the host: fewer tokens.
    let d = k.meta.variant.head_size as usize;
    let t = t.min(((1usize << 25) / (kk * h * (d + d / 2 + 8))).max(1));
    (
        format!("T'={t} K={kk} lse={with_lse}"),
        run_states_case(k, base, stream, (t, h, kk), with_lse, seed),
    )
}
