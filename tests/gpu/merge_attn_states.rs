//! The pairwise merge (merge_attn_states, its FP8 outputs) in the GPU suite: one case against the
//! float64 reference, and the options the suite cycles through.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use rayon::prelude::*;

use mla_gen::dtype::Dtype;
use mla_gen::reference::{self, lse_index, LseBase, RowMerge};
use mla_gen::runtime::{DeviceBuffer, GroupScales, Kernel, MergeArgs};

use crate::common::*;
use crate::data::*;

#[allow(clippy::too_many_arguments)]
pub fn run_case(
    k: &Kernel,
    base: LseBase,
    stream: &Arc<CudaStream>,
    t: usize,
    h: usize,
    threshold: Option<usize>,
    with_lse: bool,
    seed: u64,
    layouts: Option<Layouts>,
) -> Result<u64, String> {
    let dtype = k.meta.dtype().unwrap();
    let d = k.meta.variant.head_size as usize;
    let vec = vec_elems(k);
    // A dense specialization takes dense tensors only (its contract bounds the strides).
    let (pl, sl, ol) = layouts.unwrap_or_else(|| {
        if k.meta.variant.dense {
            dense_layouts(d, h)
        } else {
            padded_layouts(d, h, vec)
        }
    });
    let prefix = random_tensor(dtype, t, h, d, pl, seed ^ 0x1111);
    let suffix = random_tensor(dtype, t, h, d, sl, seed ^ 0x2222);
    let (plse, slse) = random_lse(t * h, seed ^ 0x3333);
    let out_len = if t * h == 0 {
        0
    } else {
        ol.row(t - 1, h - 1) + d
    };
    let out_dtype = k.meta.output_dtype().unwrap();
    let out_init = vec![poison(out_dtype); out_len];
    // FP8 outputs: a per-case scale in [0.05, 4), so values past ±448 saturate.
    let scale = (0.05 + Rng(seed ^ 0x5ca1e).unit() * 3.95) as f32;
    let scale_dev: CudaSlice<f32> = stream.clone_htod(&[scale]).unwrap();
    // Per-token-group FP8: the scales in one of three layouts (row-major, padded, column-major),
    // poisoned so an unwritten or stray scale shows.
    let group = k.meta.variant.fp8_group;
    let groups_per_token = group.map_or(0, |g| h * d / g.group_size as usize);
    let (sts, sgs) = match seed % 3 {
        0 => (groups_per_token, 1),
        1 => (groups_per_token + 3, 1),
        _ => (1, t),
    };
    let scales_len = if group.is_some() && t * h > 0 {
        (t - 1) * sts + (groups_per_token - 1) * sgs + 1
    } else {
        0
    };
    let scales_dev: CudaSlice<u32> = stream
        .clone_htod(&vec![LSE_POISON; scales_len.max(1)])
        .unwrap();

    // The fused empty-context mask: up to 5 requests (at least one) over the first ~90% of the
    // tokens, ~40% of them without context; the reference merges with the prefix lse masked
    // first (docs/SEMANTICS.md: the mask, then the plain merge, bit for bit).
    let (qsl, csl) = if k.meta.variant.mask_empty_context {
        start_locations(t, t.clamp(1, 5), seed ^ 0x4444)
    } else {
        (Vec::new(), Vec::new())
    };
    let mut plse = plse;
    let pl_dev: CudaSlice<f32> = stream.clone_htod(&plse).unwrap();
    if k.meta.variant.mask_empty_context {
        reference::mask_empty_context(&mut plse, k.meta.head_major(), (t, h), &qsl, &csl);
    }
    let qsl_dev: CudaSlice<i32> = stream.clone_htod(&at_least_one(&qsl)).unwrap();
    let csl_dev: CudaSlice<i32> = stream.clone_htod(&at_least_one(&csl)).unwrap();
    let (p_hold, p_buf) = upload_bits(stream, dtype, &prefix);
    let (s_hold, s_buf) = upload_bits(stream, dtype, &suffix);
    let (o_hold, o_buf) = upload_bits(stream, out_dtype, &out_init);
    let sl_dev: CudaSlice<f32> = stream.clone_htod(&slse).unwrap();
    let ol_dev: CudaSlice<u32> = stream.clone_htod(&vec![LSE_POISON; t * h]).unwrap();
    let args = MergeArgs {
        output: o_buf,
        output_lse: with_lse.then(|| f32_buffer(raw(&ol_dev, stream), t * h)),
        prefix: p_buf,
        prefix_lse: f32_buffer(raw(&pl_dev, stream), t * h),
        suffix: s_buf,
        suffix_lse: f32_buffer(raw(&sl_dev, stream), t * h),
        output_scale: (out_dtype == Dtype::Fp8E4m3 && group.is_none())
            .then(|| f32_buffer(raw(&scale_dev, stream), 1)),
        output_scales: group.map(|_| GroupScales {
            buf: f32_buffer(raw(&scales_dev, stream), scales_len),
            token_stride: sts,
            group_stride: sgs,
        }),
        num_tokens: t,
        num_heads: h,
        output_layout: ol,
        prefix_layout: pl,
        suffix_layout: sl,
        prefill_tokens_with_context: threshold,
    };
    let mut named = args.args();
    if k.meta.variant.mask_empty_context {
        let i32buf = |p: u64, len: usize| DeviceBuffer {
            ptr: p,
            len,
            dtype: Dtype::I32,
        };
        named
            .buffer(
                "query_start_loc",
                Some(i32buf(raw(&qsl_dev, stream), qsl.len())),
            )
            .buffer(
                "context_start_loc",
                Some(i32buf(raw(&csl_dev, stream), csl.len())),
            )
            .int("num_requests", qsl.len() - 1);
    }
    // SAFETY: every buffer is one of this case's allocations above, with its length; they live
    // until after the synchronize below.
    unsafe { k.launch(stream, &named) }.map_err(|e| e.to_string())?;
    stream.synchronize().map_err(|e| format!("{e:?}"))?;
    let out = download_bits(stream, out_dtype, o_hold.as_ref());
    let out_lse: Vec<u32> = stream.clone_dtoh(&ol_dev).unwrap();
    let scales: Vec<u32> = stream.clone_dtoh(&scales_dev).unwrap();
    drop((p_hold, s_hold));
    if group.is_some() {
        let written = scales[..scales_len]
            .iter()
            .filter(|&&b| b != LSE_POISON)
            .count();
        if written != t * groups_per_token {
            return Err(format!(
                "{written} group scales written, want {} (T={t} x {groups_per_token})",
                t * groups_per_token
            ));
        }
    }

    let n = threshold.unwrap_or(t);
    let head_major = k.meta.head_major();
    // Check rows in parallel; report the first mismatch.
    let bad: Option<String> = (0..t * h).into_par_iter().find_map_any(|row| {
        let (ti, hi) = (row / h, row % h);
        let li = lse_index(head_major, t, h, ti, hi);
        let m: RowMerge = base.merge_row(plse[li], slse[li], ti < n);
        // Per-token-group FP8: each element is judged against its group's scale as written.
        let group_scale = |e: usize| -> Result<f32, String> {
            let Some(g) = group else { return Ok(scale) };
            let gsz = g.group_size as usize;
            let gi = hi * (d / gsz) + e / gsz;
            let got = f32::from_bits(scales[ti * sts + gi * sgs]);
            let values: Vec<f64> = (e / gsz * gsz..(e / gsz + 1) * gsz)
                .map(|x| {
                    let pv = from_bits(dtype, prefix[pl.row(ti, hi) + x]);
                    let sv = from_bits(dtype, suffix[sl.row(ti, hi) + x]);
                    m.value(pv, sv)
                })
                .collect();
            let ok = reference::fp8_group_scale_matches(&m, &values, g.ue8m0, got);
            if ok {
                Ok(got)
            } else {
                Err(format!("t={ti} h={hi} group {gi}: scale {got:e} ({:#x}) does not match {m:?}", got.to_bits()))
            }
        };
        let mut elem_scale = scale;
        for e in 0..d {
            let got_bits = out[ol.row(ti, hi) + e];
            if got_bits == poison(out_dtype) {
                return Some(format!("t={ti} h={hi} e={e}: never written"));
            }
            let pv = from_bits(dtype, prefix[pl.row(ti, hi) + e]);
            let sv = from_bits(dtype, suffix[sl.row(ti, hi) + e]);
            let got = from_bits(out_dtype, got_bits);
            // A group's scale is checked once, at its first element.
            if group.is_none_or(|g| e % g.group_size as usize == 0) {
                elem_scale = match group_scale(e) {
                    Ok(s) => s,
                    Err(why) => return Some(why),
                };
            }
            let scale = elem_scale;
            let ok = if out_dtype == Dtype::Fp8E4m3 {
                reference::fp8_element_matches(&m, pv as f32, sv as f32, scale, got_bits as u8)
            } else {
                reference::element_matches(dtype, &m, pv, sv, got)
            };
            if !ok {
                return Some(format!(
                    "t={ti} h={hi} e={e}: got {got:e}, want {:e} (prefix {pv:e} suffix {sv:e} lse {}/{} -> {m:?})",
                    m.value(pv, sv), plse[li], slse[li]
                ));
            }
        }
        padding_error(&out, ol, (ti, hi), (h, d), poison(out_dtype))
            .or_else(|| output_lse_error(with_lse, out_lse[li], m.lse(), (ti, hi)))
    });
    match bad {
        None => Ok((t * h * d) as u64),
        Some(b) => Err(b),
    }
}

/// A specialization for calls where every token has context (`_dense_nothr`): its contract
/// bounds the threshold to T, so launches with another threshold are not its cases.
pub fn takes_only_all_context(k: &Kernel) -> bool {
    bounds_of(k, "prefill_tokens_with_context").is_some_and(|b| b.min == "num_tokens")
}

/// One case of the suite: cycle (threshold, output lse) over the shapes so every kernel sees every
/// setting several times; inputs are fresh for each case.
pub fn suite_case(
    k: &Kernel,
    base: LseBase,
    stream: &Arc<CudaStream>,
    (t, h): (usize, usize),
    case: usize,
    seed: u64,
) -> (String, Result<u64, String>) {
    let thresholds: Vec<Option<usize>> = if !k.meta.variant.prefix_threshold {
        vec![None]
    } else if takes_only_all_context(k) {
        vec![None, Some(t)]
    } else {
        vec![None, Some(0), Some(t / 2), Some(t)]
    };
    let lse_opts: Vec<bool> = if k.meta.variant.output_lse {
        vec![true, false]
    } else {
        vec![false]
    };
    let combos: Vec<(Option<usize>, bool)> = thresholds
        .iter()
        .flat_map(|&th| lse_opts.iter().map(move |&l| (th, l)))
        .collect();
    let (th, with_lse) = combos[case % combos.len()];
    // Every third case dense: a general kernel then launches its dense specialization.
    let dense = case % 3 == 1;
    let d = k.meta.variant.head_size as usize;
    let layouts = dense.then(|| dense_layouts(d, h));
    (
        format!("threshold={th:?} lse={with_lse} dense={dense}"),
        run_case(k, base, stream, t, h, th, with_lse, seed, layouts),
    )
}

/// A device copy needs at least one element.
fn at_least_one(v: &[i32]) -> Vec<i32> {
    if v.is_empty() {
        vec![0]
    } else {
        v.to_vec()
    }
}
