//! GPU suite: every generated kernel against the float64 reference, on poisoned outputs.
//! Skips with a message where no CUDA driver is present (CI). On a GPU machine:
//! `scripts/gpu-check.sh` (see docs/GPU-VERIFICATION.md).
//!
//! Environment: MLA_GEN_GPU_EXTRA = more generated folders, colon-separated (token-major, no-threshold, no-lse
//! and odd head sizes, from tests/gpu-extra.toml); MLA_GEN_GPU_QUICK = 1 for the small subset run
//! under compute-sanitizer; MLA_GEN_GPU_REPORT = a file to append the counts to.
#![cfg(feature = "runtime")]

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use rayon::prelude::*;

use mla_gen::dtype::Dtype;
use mla_gen::reference::{self, lse_index, Layout, RowMerge, StatesMerge};
use mla_gen::runtime::{
    self, DeviceBuffer, GroupScales, InPlaceArgs, Kernel, MaskLseArgs, MergeArgs, Runtime,
    StatesArgs, StatesLayout,
};
use mla_gen::spec::Family;

/// Say it where a person sees it: libtest captures print!, not direct writes to stderr.
fn say(msg: &str) {
    let _ = writeln!(std::io::stderr(), "{msg}");
}

fn gpu() -> Option<Arc<CudaContext>> {
    if !runtime::driver_present() {
        say("SKIPPED GPU test: no CUDA driver (libcuda.so.1) on this machine; run scripts/gpu-check.sh on a GPU machine");
        return None;
    }
    match CudaContext::new(0) {
        Ok(c) => Some(c),
        Err(e) => {
            say(&format!(
                "SKIPPED GPU test: CUDA driver present but no usable GPU ({e:?})"
            ));
            None
        }
    }
}

fn dir_of(var: Option<&str>) -> Option<PathBuf> {
    match var {
        Some(v) => std::env::var_os(v).map(PathBuf::from),
        None => {
            let in_repo = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/generated"));
            Some(if in_repo.exists() {
                in_repo
            } else {
                PathBuf::from("generated")
            })
        }
    }
}

/// Elements per vector access: every stride a tensor takes must be a multiple of it (the
/// contract's `stride_multiple`, equal for all of a kernel's row tensors).
fn vec_elems(k: &Kernel) -> usize {
    k.meta
        .params
        .iter()
        .filter_map(|p| p.tensor.as_ref())
        .map(|t| t.stride_multiple as usize)
        .max()
        .unwrap_or(1)
}

fn report(line: &str) {
    say(line);
    if let Some(p) = std::env::var_os("MLA_GEN_GPU_REPORT") {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
        {
            let _ = writeln!(f, "{line}");
        }
    }
}

#[test]
fn every_ptx_and_cubin_loads() {
    let Some(ctx) = gpu() else { return };
    let dir = dir_of(None).unwrap();
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    ctx.bind_to_thread().unwrap();
    let (mut ok, mut failed) = (0, Vec::new());
    for k in manifest["kernels"].as_array().unwrap() {
        for a in k["archs"].as_array().unwrap() {
            let arch = a["arch"].as_str().unwrap();
            let cc = ctx.compute_capability().unwrap();
            let dev = format!("sm_{}{}", cc.0, cc.1);
            // PTX JITs on its own architecture and newer ones (sm_100 PTX does not on an H200);
            // a CUBIN loads only on its own architecture family.
            let number = |a: &str| -> u32 {
                a.trim_start_matches(|c: char| !c.is_ascii_digit())
                    .trim_end_matches('a')
                    .parse()
                    .unwrap()
            };
            let mut files = Vec::new();
            if number(arch) <= number(&dev) {
                files.push(a["ptx"]["file"].as_str().unwrap().to_string());
            }
            if arch == dev {
                files.push(a["cubin"]["file"].as_str().unwrap().to_string());
            }
            for f in files {
                let mut image = std::fs::read(dir.join(&f)).unwrap();
                if f.ends_with(".ptx") {
                    image.push(0);
                }
                // SAFETY: a complete image, alive for the call.
                match unsafe { cudarc::driver::result::module::load_data(image.as_ptr().cast()) } {
                    Ok(m) => {
                        ok += 1;
                        unsafe { cudarc::driver::result::module::unload(m) }.unwrap();
                    }
                    Err(e) => failed.push(format!("{f}: {e:?}")),
                }
            }
        }
    }
    report(&format!(
        "module load (cuModuleLoadData): {ok} loaded, {} failed{}",
        failed.len(),
        failed
            .iter()
            .map(|f| format!("\n  {f}"))
            .collect::<String>()
    ));
    assert!(failed.is_empty());
    assert!(ok > 0);
}

// ---- random inputs ----

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*: fast, and plenty for test data.
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn to_bits(dtype: Dtype, x: f32) -> u32 {
    match dtype {
        Dtype::F32 => x.to_bits(),
        Dtype::F16 => u32::from(half::f16::from_f32(x).to_bits()),
        Dtype::Bf16 => u32::from(half::bf16::from_f32(x).to_bits()),
        Dtype::Fp8E4m3 => u32::from(reference::fp8::e4m3_from_f32(x)),
        other => unreachable!("{other:?} is not a row type"),
    }
}

fn from_bits(dtype: Dtype, b: u32) -> f64 {
    match dtype {
        Dtype::F32 => f64::from(f32::from_bits(b)),
        Dtype::F16 => f64::from(half::f16::from_bits(b as u16)),
        Dtype::Bf16 => f64::from(half::bf16::from_bits(b as u16)),
        Dtype::Fp8E4m3 => reference::fp8::e4m3_to_f64(b as u8),
        other => unreachable!("{other:?} is not a row type"),
    }
}

/// NaNs with payloads no arithmetic produces: an element still holding one was never written.
fn poison(dtype: Dtype) -> u32 {
    match dtype {
        Dtype::F32 => 0x7fc0_dead,
        // The conversion writes NaN as 0x7f, never 0xff.
        Dtype::Fp8E4m3 => 0xff,
        Dtype::F16 => 0x7e5a,
        Dtype::Bf16 => 0x7fa5,
        other => unreachable!("{other:?} is not a row type"),
    }
}
const LSE_POISON: u32 = 0x7fc0_beef;

/// The head padding after row (t, h) of an output must still hold the poison: nothing was
/// written outside the rows.
fn padding_error(
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
fn output_lse_error(
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
fn random_tensor(dtype: Dtype, t: usize, h: usize, d: usize, l: Layout, seed: u64) -> Vec<u32> {
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
fn random_lse(n: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
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

fn upload_bits(
    stream: &Arc<CudaStream>,
    dtype: Dtype,
    bits: &[u32],
) -> (Box<dyn std::any::Any>, DeviceBuffer) {
    let (holder, ptr): (Box<dyn std::any::Any>, u64) = match dtype {
        Dtype::F32 => {
            let s: CudaSlice<u32> = stream.clone_htod(bits).unwrap();
            let p = raw(&s, stream);
            (Box::new(s), p)
        }
        Dtype::Fp8E4m3 => {
            let bytes: Vec<u8> = bits.iter().map(|&b| b as u8).collect();
            let s: CudaSlice<u8> = stream.clone_htod(&bytes).unwrap();
            let p = raw(&s, stream);
            (Box::new(s), p)
        }
        _ => {
            let narrow: Vec<u16> = bits.iter().map(|&b| b as u16).collect();
            let s: CudaSlice<u16> = stream.clone_htod(&narrow).unwrap();
            let p = raw(&s, stream);
            (Box::new(s), p)
        }
    };
    (
        holder,
        DeviceBuffer {
            ptr,
            len: bits.len(),
            dtype,
        },
    )
}

fn raw<T>(s: &CudaSlice<T>, stream: &CudaStream) -> u64 {
    use cudarc::driver::DevicePtr;
    let (p, _sync) = s.device_ptr(stream);
    p
}

fn download_bits(stream: &Arc<CudaStream>, dtype: Dtype, holder: &dyn std::any::Any) -> Vec<u32> {
    match dtype {
        Dtype::F32 => stream
            .clone_dtoh(holder.downcast_ref::<CudaSlice<u32>>().unwrap())
            .unwrap(),
        Dtype::Fp8E4m3 => stream
            .clone_dtoh(holder.downcast_ref::<CudaSlice<u8>>().unwrap())
            .unwrap()
            .into_iter()
            .map(u32::from)
            .collect(),
        _ => stream
            .clone_dtoh(holder.downcast_ref::<CudaSlice<u16>>().unwrap())
            .unwrap()
            .into_iter()
            .map(u32::from)
            .collect(),
    }
}

#[derive(Default)]
struct Counts {
    cases: usize,
    passed: usize,
    failed: Vec<String>,
    elements: u64,
}

/// Layouts of one case: (prefix, suffix, output).
type Layouts = (Layout, Layout, Layout);

/// The suite's padded layouts: each tensor different (prefix a V of D in a 1.5x-wide buffer,
/// suffix dense, output one vector of head and token padding).
fn padded_layouts(d: usize, h: usize, vec: usize) -> Layouts {
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
fn dense_layouts(d: usize, h: usize) -> Layouts {
    let dense = Layout::contiguous(h, d);
    (dense, dense, dense)
}

#[allow(clippy::too_many_arguments)]
fn run_case(
    k: &Kernel,
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

    let (p_hold, p_buf) = upload_bits(stream, dtype, &prefix);
    let (s_hold, s_buf) = upload_bits(stream, dtype, &suffix);
    let (o_hold, o_buf) = upload_bits(stream, out_dtype, &out_init);
    let pl_dev: CudaSlice<f32> = stream.clone_htod(&plse).unwrap();
    let sl_dev: CudaSlice<f32> = stream.clone_htod(&slse).unwrap();
    let ol_dev: CudaSlice<u32> = stream.clone_htod(&vec![LSE_POISON; t * h]).unwrap();
    let f32buf = |p: u64| DeviceBuffer {
        ptr: p,
        len: t * h,
        dtype: Dtype::F32,
    };
    let args = MergeArgs {
        output: o_buf,
        output_lse: with_lse.then(|| f32buf(raw(&ol_dev, stream))),
        prefix: p_buf,
        prefix_lse: f32buf(raw(&pl_dev, stream)),
        suffix: s_buf,
        suffix_lse: f32buf(raw(&sl_dev, stream)),
        output_scale: (out_dtype == Dtype::Fp8E4m3 && group.is_none()).then(|| DeviceBuffer {
            ptr: raw(&scale_dev, stream),
            len: 1,
            dtype: Dtype::F32,
        }),
        output_scales: group.map(|_| GroupScales {
            buf: DeviceBuffer {
                ptr: raw(&scales_dev, stream),
                len: scales_len,
                dtype: Dtype::F32,
            },
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
    // SAFETY: every buffer is one of this case's allocations above, with its length; they live
    // until after the synchronize below.
    unsafe { k.launch(stream, &args.args()) }.map_err(|e| e.to_string())?;
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
        let m: RowMerge = reference::merge_row(plse[li], slse[li], ti < n);
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

/// One lse value of the suite's mix: ~10% +inf, ~10% -inf, ~0.5% NaN, else finite.
fn random_lse_value(rng: &mut Rng) -> f32 {
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

/// A K-way merge case: K states [T, K, H, D] in padded strides, lse [T, K, H] with the suite's
/// specials and ~3% of rows without keys in any state.
fn run_states_case(
    k: &Kernel,
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
        output_lse: with_lse.then(|| DeviceBuffer {
            ptr: raw(&ol_dev, stream),
            len: t * h,
            dtype: Dtype::F32,
        }),
        states: s_buf,
        states_lse: DeviceBuffer {
            ptr: raw(&sl_dev, stream),
            len: lse.len(),
            dtype: Dtype::F32,
        },
        num_tokens: t,
        num_heads: h,
        num_states: kk,
        output_layout: ol,
        states_layout: sl,
    };
    // SAFETY: as in run_case: this case's allocations, alive until the synchronize.
    unsafe { k.launch(stream, &args.args()) }.map_err(|e| e.to_string())?;
    stream.synchronize().map_err(|e| format!("{e:?}"))?;
    let out = download_bits(stream, dtype, o_hold.as_ref());
    let out_lse: Vec<u32> = stream.clone_dtoh(&ol_dev).unwrap();
    drop(s_hold);
    let bad: Option<String> = (0..t * h).into_par_iter().find_map_any(|row| {
        let (ti, hi) = (row / h, row % h);
        let row_lse: Vec<f32> = (0..kk).map(|ki| lse[(ti * kk + ki) * h + hi]).collect();
        let m: StatesMerge = reference::merge_states_row(&row_lse);
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

/// An in-place case: state (padded) := merge(state, other), with an optional mask of ~30% zeros.
/// Masked tokens and rows without keys must keep their exact bits; padding its poison.
fn run_in_place_case(
    k: &Kernel,
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
    let f32buf = |p: u64| DeviceBuffer {
        ptr: p,
        len: t * h,
        dtype: Dtype::F32,
    };
    let args = InPlaceArgs {
        state: st_buf,
        state_lse: f32buf(raw(&stl_dev, stream)),
        other: ot_buf,
        other_lse: f32buf(raw(&otl_dev, stream)),
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
    // SAFETY: as in run_case.
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
        let m: RowMerge = reference::merge_row(state_lse[li], other_lse[li], true);
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
                    reference::merge_row(state_lse[li], other_lse[li], true).lse(),
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

/// An lse-mask case: `requests` requests over the first ~90% of the tokens (some with no tokens),
/// ~40% with an empty context; the rest of the tokens belong to none. Masked (t, h) must read
/// -inf, every other lse value its exact bits.
fn run_mask_lse_case(
    k: &Kernel,
    stream: &Arc<CudaStream>,
    (t, h, requests): (usize, usize, usize),
    seed: u64,
) -> Result<u64, String> {
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
    let (lse, _) = random_lse(t * h, seed ^ 0x77);
    let lse_dev: CudaSlice<f32> = stream.clone_htod(&lse).unwrap();
    let qsl_dev: CudaSlice<i32> = stream.clone_htod(&qsl).unwrap();
    let csl_dev: CudaSlice<i32> = stream.clone_htod(&csl).unwrap();
    let args = MaskLseArgs {
        lse: DeviceBuffer {
            ptr: raw(&lse_dev, stream),
            len: t * h,
            dtype: Dtype::F32,
        },
        query_start_loc: DeviceBuffer {
            ptr: raw(&qsl_dev, stream),
            len: qsl.len(),
            dtype: Dtype::I32,
        },
        context_start_loc: DeviceBuffer {
            ptr: raw(&csl_dev, stream),
            len: csl.len(),
            dtype: Dtype::I32,
        },
        num_requests: requests,
        num_tokens: t,
        num_heads: h,
    };
    // SAFETY: as in run_case.
    unsafe { k.launch(stream, &args.args()) }.map_err(|e| e.to_string())?;
    stream.synchronize().map_err(|e| format!("{e:?}"))?;
    let got: Vec<f32> = stream.clone_dtoh(&lse_dev).unwrap();
    let mut want = lse.clone();
    reference::mask_empty_context(&mut want, k.meta.head_major(), (t, h), &qsl, &csl);
    match (0..t * h).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        None => Ok((t * h) as u64),
        Some(i) => Err(format!(
            "lse element {i}: got {}, want {} (was {})",
            got[i], want[i], lse[i]
        )),
    }
}

/// A specialization for calls where every token has context (`_dense_nothr`): its contract
/// bounds the threshold to T, so launches with another threshold are not its cases.
fn takes_only_all_context(k: &Kernel) -> bool {
    k.meta.params.iter().any(|p| {
        p.name == "prefill_tokens_with_context"
            && p.bounds.as_ref().is_some_and(|b| b.min == "num_tokens")
    })
}

/// Run one case of kernel `k`, whatever its family; `case` picks the options it cycles through.
#[allow(clippy::too_many_arguments)]
fn run_any(
    k: &Kernel,
    stream: &Arc<CudaStream>,
    t: usize,
    h: usize,
    case: usize,
    seed: u64,
) -> (String, Result<u64, String>) {
    match k.meta.variant.family {
        Family::MergeAttnStates => {
            // Cycle (threshold, output lse) over the shapes so every kernel sees every setting
            // several times; inputs are fresh for each case.
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
                run_case(k, stream, t, h, th, with_lse, seed, layouts),
            )
        }
        Family::MergeStates { num_states } => {
            // A runtime-K kernel cycles K over 1, 3, 5 and 16.
            let kk = num_states.map_or([1, 3, 5, 16][case % 4], |n| n as usize);
            let with_lse = k.meta.variant.output_lse && case % 3 != 2;
            // K states of the largest shapes would need gigabytes on the host: fewer tokens.
            let d = k.meta.variant.head_size as usize;
            let t = t.min(((1usize << 25) / (kk * h * (d + d / 2 + 8))).max(1));
            (
                format!("T'={t} K={kk} lse={with_lse}"),
                run_states_case(k, stream, (t, h, kk), with_lse, seed),
            )
        }
        Family::MaskEmptyContextLse => {
            let requests = [1, 5, 64, 1000][case % 4].min(t);
            (
                format!("requests={requests}"),
                run_mask_lse_case(k, stream, (t, h, requests), seed),
            )
        }
        Family::MergeStateInPlace { mask } => {
            let with_mask = mask && case % 3 != 2;
            (
                format!("mask={with_mask}"),
                run_in_place_case(k, stream, (t, h), with_mask, seed),
            )
        }
        // A family added to mla-gen fails here until it gets its check.
        other => (
            format!("{other:?}"),
            Err(format!("no GPU check for the family {other:?}")),
        ),
    }
}

fn suite(dirs: &[PathBuf], tokens: &[usize], heads: &[usize]) -> Counts {
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.default_stream();
    let mut c = Counts::default();
    for dir in dirs {
        let rt =
            Runtime::load(ctx.clone(), dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for (ki, k) in rt.kernels().iter().enumerate() {
            let mut case = 0usize;
            for &t in tokens {
                for &h in heads {
                    let which = case + ki;
                    case += 1;
                    let seed = 0x5eed
                        ^ ((ki as u64) << 32)
                        ^ ((t as u64) << 8)
                        ^ h as u64
                        ^ (case as u64) << 48;
                    c.cases += 1;
                    let (options, result) = run_any(k, &stream, t, h, which, seed);
                    match result {
                        Ok(n) => {
                            c.passed += 1;
                            c.elements += n;
                        }
                        Err(why) => c.failed.push(format!(
                            "{} T={t} H={h} {options} seed={seed:#x}: {why}",
                            k.meta.name
                        )),
                    }
                }
            }
        }
    }
    c
}

#[test]
fn every_kernel_matches_the_float64_reference() {
    let Some(_ctx) = gpu() else { return };
    let quick = std::env::var_os("MLA_GEN_GPU_QUICK").is_some();
    let (tokens, heads): (&[usize], &[usize]) = if quick {
        (&[1, 7, 613], &[1, 4])
    } else {
        (&[1, 7, 256, 613, 4096], &[1, 4, 16, 128])
    };
    let mut dirs = vec![dir_of(None).unwrap()];
    match dir_of(Some("MLA_GEN_GPU_EXTRA")) {
        Some(extra) => dirs.push(extra),
        None => say(
            "note: MLA_GEN_GPU_EXTRA unset: token-major / no-threshold / odd head sizes not run",
        ),
    }
    let started = std::time::Instant::now();
    let c = suite(&dirs, tokens, heads);
    report(&format!(
        "merge suite{}: {} cases, {} passed, {} failed ({:.2e} output elements checked) in {:.0}s",
        if quick { " (quick subset)" } else { "" },
        c.cases,
        c.passed,
        c.failed.len(),
        c.elements as f64,
        started.elapsed().as_secs_f64()
    ));
    for f in c.failed.iter().take(20) {
        report(&format!("  FAILED {f}"));
    }
    assert!(c.failed.is_empty());
}

/// Boundary shapes, run under compute-sanitizer memcheck by scripts/gpu-check.sh: one token and
/// one head, one head of many tokens, the last row ending exactly at its buffer's end (every
/// buffer is allocated to its extent), and token strides far larger than a row.
#[test]
fn boundary_shapes_stay_inside_their_buffers() {
    let Some(ctx) = gpu() else { return };
    let stream = ctx.default_stream();
    let rt = Runtime::load(ctx.clone(), &dir_of(None).unwrap()).unwrap();
    let (mut cases, mut failed) = (0usize, Vec::new());
    for k in rt.kernels() {
        let d = k.meta.variant.head_size as usize;
        let vec = vec_elems(k);
        let wide = |h: usize, gap: usize| Layout {
            head_stride: d,
            token_stride: h * d + gap * vec,
        };
        for (t, h, layouts) in [
            (1, 1, None),
            (1, 1, Some((wide(1, 4096), wide(1, 1), wide(1, 65536)))),
            (1, 128, None),
            (4097, 1, None),
            (3, 2, Some((wide(2, 1 << 20), wide(2, 0), wide(2, 1 << 18)))),
        ] {
            // A dense specialization takes dense tensors only: its own cases are the dense ones.
            if k.meta.variant.dense && layouts.is_some() {
                continue;
            }
            for threshold in [None, Some(0), Some(t)] {
                if threshold == Some(0) && t > 0 && takes_only_all_context(k) {
                    continue;
                }
                cases += 1;
                let seed = 0xb0 ^ ((t * 131 + h) as u64) ^ ((cases as u64) << 20);
                if let Err(why) = run_case(k, &stream, t, h, threshold, true, seed, layouts) {
                    failed.push(format!("{} T={t} H={h} {threshold:?}: {why}", k.meta.name));
                }
            }
        }
    }
    report(&format!(
        "boundary shapes: {cases} cases, {} passed, {} failed",
        cases - failed.len(),
        failed.len()
    ));
    for f in failed.iter().take(10) {
        report(&format!("  FAILED {f}"));
    }
    assert!(failed.is_empty());
}

/// Strides past 2^31 elements: the general pairwise kernel's 64-bit body (its 32-bit one serves
/// every call whose sizes and strides stay below 2^31). One bf16 and one f32 kernel of the
/// default folder, prefix rows 2^31 + 64 elements apart (a 4 or 8 GB buffer), against the float64
/// reference with the other tensors dense and padded.
#[test]
fn strides_past_2_31_take_the_64_bit_path() {
    let Some(ctx) = gpu() else { return };
    let stream = ctx.default_stream();
    let rt = Runtime::load(ctx.clone(), &dir_of(None).unwrap()).unwrap();
    let mut cases = 0;
    for name in [
        "merge_attn_states_bf16_d128_thr_lse",
        "merge_attn_states_f32_d64_thr_lse",
    ] {
        let Some(k) = rt.kernel(name) else {
            say(&format!("note: {name} not in the folder: skipped"));
            continue;
        };
        let d = k.meta.variant.head_size as usize;
        let far = Layout {
            head_stride: d,
            token_stride: (1usize << 31) + 64,
        };
        let (_, _, padded_out) = padded_layouts(d, 1, vec_elems(k));
        for threshold in [None, Some(1)] {
            cases += 1;
            let layouts = (far, Layout::contiguous(1, d), padded_out);
            run_case(
                k,
                &stream,
                2,
                1,
                threshold,
                true,
                0x64b1 ^ cases,
                Some(layouts),
            )
            .unwrap_or_else(|why| panic!("{name} threshold={threshold:?}: {why}"));
        }
    }
    report(&format!("strides past 2^31: {cases} cases passed"));
}

/// The FP8 conversion against the reference on every float32 bit pattern (2^32), through the
/// per-tensor FP8 kernel's copy path: threshold 0, so every row is the suffix multiplied by the
/// reciprocal of the scale 1.0 (exact for every float32, subnormals included; NaN stays NaN) and
/// converted. On sm_89+ this also checks the NaN fix-up after the conversion instruction. Runs each folder of
/// MLA_GEN_GPU_FP8 (colon-separated): scripts/gpu-check.sh builds one for compute_80 (the integer
/// conversion, JIT-compiled here) and one for sm_90 (the cvt.rn.satfinite instruction).
#[test]
fn fp8_conversion_matches_the_reference_on_every_float32() {
    let Some(ctx) = gpu() else { return };
    let Some(dirs) = std::env::var_os("MLA_GEN_GPU_FP8") else {
        say("SKIPPED fp8_conversion test: MLA_GEN_GPU_FP8 unset (scripts/gpu-check.sh sets it)");
        return;
    };
    let stream = ctx.default_stream();
    const D: usize = 128;
    const H: usize = 16;
    const CHUNK: usize = 1 << 28; // float32 patterns per launch (1 GiB in, 256 MiB out)
    let t = CHUNK / (H * D);
    for dir in std::env::split_paths(&dirs) {
        let rt = Runtime::load(ctx.clone(), &dir).unwrap();
        let k = rt
            .kernels()
            .iter()
            .find(|k| {
                let v = &k.meta.variant;
                v.dtype == Dtype::F32
                    && v.head_size == D as u32
                    && v.output == mla_gen::variant::OutputKind::Fp8E4m3
                    && v.prefix_threshold
            })
            .unwrap_or_else(|| panic!("{}: no f32 d128 per-tensor FP8 kernel", dir.display()));
        let scale: CudaSlice<f32> = stream.clone_htod(&[1.0f32]).unwrap();
        let prefix: CudaSlice<u32> = stream.alloc_zeros(CHUNK).unwrap();
        let lse: CudaSlice<f32> = stream.alloc_zeros(t * H).unwrap();
        let row_major = Layout {
            token_stride: H * D,
            head_stride: D,
        };
        let (mut checked, mut mismatches, mut first) = (0u64, 0u64, None);
        for chunk in 0..(1usize << 32) / CHUNK {
            let base = (chunk * CHUNK) as u32;
            let bits: Vec<u32> = (0..CHUNK as u32).map(|i| base.wrapping_add(i)).collect();
            let suffix: CudaSlice<u32> = stream.clone_htod(&bits).unwrap();
            let out: CudaSlice<u8> = stream.clone_htod(&vec![0xffu8; CHUNK]).unwrap();
            let buf = |p: u64, len: usize, dtype: Dtype| DeviceBuffer { ptr: p, len, dtype };
            let args = MergeArgs {
                output: buf(raw(&out, &stream), CHUNK, Dtype::Fp8E4m3),
                output_lse: None,
                prefix: buf(raw(&prefix, &stream), CHUNK, Dtype::F32),
                prefix_lse: buf(raw(&lse, &stream), t * H, Dtype::F32),
                suffix: buf(raw(&suffix, &stream), CHUNK, Dtype::F32),
                suffix_lse: buf(raw(&lse, &stream), t * H, Dtype::F32),
                output_scale: Some(buf(raw(&scale, &stream), 1, Dtype::F32)),
                output_scales: None,
                num_tokens: t,
                num_heads: H,
                output_layout: row_major,
                prefix_layout: row_major,
                suffix_layout: row_major,
                prefill_tokens_with_context: Some(0),
            };
            // SAFETY: this chunk's allocations above, alive until the copy back synchronizes.
            unsafe { k.launch(&stream, &args.args()) }.unwrap();
            let codes: Vec<u8> = stream.clone_dtoh(&out).unwrap();
            let wrong: Vec<(u32, u8)> = bits
                .par_iter()
                .zip(codes.par_iter())
                .filter(|(&b, &c)| reference::fp8::e4m3_from_f32(f32::from_bits(b)) != c)
                .map(|(&b, &c)| (b, c))
                .collect();
            checked += CHUNK as u64;
            mismatches += wrong.len() as u64;
            if first.is_none() {
                first = wrong.first().copied();
            }
        }
        report(&format!(
            "fp8 conversion, {} ({}): {checked} float32 patterns, {mismatches} differ from the reference{}",
            k.meta.name,
            dir.display(),
            first.map_or(String::new(), |(b, c)| format!(
                "; first: {b:#010x} gave {c:#04x}, want {:#04x}",
                reference::fp8::e4m3_from_f32(f32::from_bits(b))
            ))
        ));
        assert_eq!(mismatches, 0);
    }
}
