//! The in-place merge (merge_state_in_place) in the GPU suite: one case against the float64
//! reference, and the options the suite cycles through.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use rayon::prelude::*;

use mla_gen::dtype::Dtype;
use mla_gen::reference::{self, lse_index, LseBase, RowMerge};
use mla_gen::runtime::{DeviceBuffer, InPlaceArgs, Kernel};

use crate::common::*;
use crate::data::*;

/// An in-place case: state (padded) := merge(state, other), with an optional mask of ~30% zeros.
/// Masked tokens and, in base e, rows without keys must keep their exact bits (base 2 writes
/// zeros there); padding its poison.
fn run_in_place_case(
    k: &Kernel,
    base: LseBase,
    stream: &Arc<CudaStream>,
    (t, h): (usize, usize),
    with_mask: bool,
    seed: u64,
) -> Result<u64, String> {
    let dtype = k.meta.dtype().unwrap();
    let d = k.meta.variant.head_size as usize;
    let vec = vec_elems(k);
    let (state_l, other_l, _) = padded_layouts(d, h, vec);
    let state = random_tensor(dtype, t, h, d, state_l, seed ^ 0x1111);
    let other = random_tensor(dtype, t, h, d, other_l, seed ^ 0x2222);
    let (state_lse, other_lse) = random_lse(t * h, seed ^ 0x3333);
    let mut rng = Rng(seed ^ 0x4444 | 1);
    let mask: Vec<u8> = (0..t).map(|_| u8::from(rng.unit() >= 0.3)).collect();
    let (st_hold, st_buf) = upload_bits(stream, dtype, &state);
    let (ot_hold, ot_buf) = upload_bits(stream, dtype, &other);
    let stl_dev: CudaSlice<f32> = stream.clone_htod(&state_lse).unwrap();
    let otl_dev: CudaSlice<f32> = stream.clone_htod(&other_lse).unwrap();
    let mask_dev: CudaSlice<u8> = stream.clone_htod(&mask).unwrap();
    let args = InPlaceArgs {
        state: st_buf,
        state_lse: f32_buffer(raw(&stl_dev, stream), t * h),
        other: ot_buf,
        other_lse: f32_buffer(raw(&otl_dev, stream), t * h),
        mask: with_mask.then(|| DeviceBuffer {
            ptr: raw(&mask_dev, stream),
            len: t,
            dtype: Dtype::U8,
        }),
        num_tokens: t,
        num_heads: h,
        state_layout: state_l,
        other_layout: other_l,
    };
    // SAFETY: this case's allocations above, alive until the synchronize.
    unsafe { k.launch(stream, &args.args()) }.map_err(|e| e.to_string())?;
    stream.synchronize().map_err(|e| format!("{e:?}"))?;
    let out = download_bits(stream, dtype, st_hold.as_ref());
    let out_lse: Vec<f32> = stream.clone_dtoh(&stl_dev).unwrap();
    drop(ot_hold);
    let head_major = k.meta.head_major();
    // The whole buffer: padding and masked rows must hold their bits.
    let touched = |i: usize| -> Option<(usize, usize)> {
        if t * h == 0 || i >= state_l.row(t - 1, h - 1) + d {
            return None;
        }
        let (ti, rest) = (i / state_l.token_stride, i % state_l.token_stride);
        let (hi, e) = (rest / state_l.head_stride, rest % state_l.head_stride);
        (hi < h && e < d && ti < t).then_some((ti, hi))
    };
    let bad: Option<String> = (0..out.len()).into_par_iter().find_map_any(|i| {
        let Some((ti, hi)) = touched(i) else {
            return (out[i] != state[i]).then(|| format!("element {i} outside every row changed"));
        };
        let li = lse_index(head_major, t, h, ti, hi);
        let merged = !with_mask || mask[ti] != 0;
        let m: RowMerge = base.merge_row(state_lse[li], other_lse[li], true);
        if !merged || m == RowMerge::CopyPrefix {
            return (out[i] != state[i])
                .then(|| format!("t={ti} h={hi}: a row that keeps its values changed"));
        }
        let e = i - state_l.row(ti, hi);
        let (pv, sv) = (
            from_bits(dtype, state[i]),
            from_bits(dtype, other[other_l.row(ti, hi) + e]),
        );
        let got = from_bits(dtype, out[i]);
        (!reference::element_matches(dtype, &m, pv, sv, got)).then(|| {
            format!(
                "t={ti} h={hi} e={e}: got {got:e}, want {:e}",
                m.value(pv, sv)
            )
        })
    });
    if let Some(b) = bad {
        return Err(b);
    }
    for (ti, &keep) in mask.iter().enumerate() {
        for hi in 0..h {
            let li = lse_index(head_major, t, h, ti, hi);
            let got = out_lse[li];
            let ok = if with_mask && keep == 0 {
                got.to_bits() == state_lse[li].to_bits()
            } else {
                reference::lse_matches(
                    base.merge_row(state_lse[li], other_lse[li], true).lse(),
                    got,
                )
            };
            if !ok {
                return Err(format!(
                    "t={ti} h={hi}: lse got {got}, from {} and {}",
                    state_lse[li], other_lse[li]
                ));
            }
        }
    }
    Ok((t * h * d) as u64)
}

/// One case of the suite: a kernel with a mask is given one in two cases of three.
pub fn suite_case(
    k: &Kernel,
    base: LseBase,
    stream: &Arc<CudaStream>,
    (t, h): (usize, usize),
    mask: bool,
    case: usize,
    seed: u64,
) -> (String, Result<u64, String>) {
    let with_mask = mask && case % 3 != 2;
    (
        format!("mask={with_mask}"),
        run_in_place_case(k, base, stream, (t, h), with_mask, seed),
    )
}
