//! GPU timing through the Rust runtime (feature `runtime`): `mla-gen tune` picks each (dtype, head
//! size)'s fastest schedule among candidate kernels; `mla-gen bench` times kernels and the
//! launcher's host cost. Random data, never zeros. Two L2 conditions:
//!
//! - cold (`cold.rs`): eager launches, the L2 flushed before each, median of CUDA-event times;
//! - hot (`graph.rs`, `hot.rs`): in a CUDA graph, right after a producer kernel wrote the
//!   merge's inputs, the producer-only graph subtracted, as an engine replays its graphs.
//!
//! `rule.rs` and `report.rs` turn the timings into verdicts and text without a GPU.

mod buffers;
mod cold;
mod graph;
mod hot;
pub mod report;
pub mod rule;
mod tune;

use std::collections::HashMap;
use std::path::Path;

use cudarc::driver::CudaContext;

use crate::host::runtime::{Kernel, Runtime, RuntimeError};
use buffers::{buffers_for, CopyBuffers};

pub use graph::graph_iterations;
pub use report::L2;
pub use tune::{tune, TuneOptions, TUNE_SHAPES};

/// Bytes a merge moves: rows with context read two rows and write one (and three lse), rows
/// without context read and write one row (and two lse).
pub(crate) fn merge_bytes(t: usize, h: usize, d: usize, size: usize, n: usize, lse: bool) -> u64 {
    let (ctx, plain) = ((n * h) as u64, ((t - n) * h) as u64);
    let (l3, l2) = if lse { (12, 8) } else { (8, 4) };
    ctx * (3 * (d * size) as u64 + l3) + plain * (2 * (d * size) as u64 + l2)
}

/// A shape: (tokens, heads, threshold at T/2).
pub type Shape = (usize, usize, bool);

/// Parse shapes written `TxH` (every token has context) or `TxH/2` (threshold T/2), separated
/// by commas: `613x16,4096x16/2`.
pub fn parse_shapes(text: &str) -> Result<Vec<Shape>, String> {
    let mut out = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (dims, half) = match item.strip_suffix("/2") {
            Some(d) => (d, true),
            None => (item, false),
        };
        let bad = || format!("shape `{item}`: write TxH or TxH/2 with T, H >= 1 (e.g. 613x16/2)");
        let (t, h) = dims.split_once('x').ok_or_else(bad)?;
        let (t, h) = (
            t.trim().parse::<usize>().map_err(|_| bad())?,
            h.trim().parse::<usize>().map_err(|_| bad())?,
        );
        if t == 0 || h == 0 {
            return Err(bad());
        }
        out.push((t, h, half));
    }
    if out.is_empty() {
        return Err("no shapes given".into());
    }
    Ok(out)
}

/// Parse `dtype:head_size` pairs separated by commas: `bf16:128,f16:128`.
pub fn parse_kernels(text: &str) -> Result<Vec<(String, u32)>, String> {
    let mut out = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let bad = || format!("`{item}`: write dtype:head_size (e.g. bf16:128)");
        let (dt, d) = item.split_once(':').ok_or_else(bad)?;
        let dt = dt.trim();
        if crate::dtype::Dtype::from_name(dt).is_none() {
            return Err(format!("`{item}`: unknown dtype `{dt}`"));
        }
        out.push((dt.to_string(), d.trim().parse::<u32>().map_err(|_| bad())?));
    }
    if out.is_empty() {
        return Err("no dtype:head_size given".into());
    }
    Ok(out)
}

/// `bench` and `tune` time the pairwise merge that writes its inputs' dtype; the K-way and
/// in-place merges are timed by bench/bench.py, FP8 outputs by
/// bench/bench_families.py and the fused mask by bench/bench_ctxmask.py (a folder
/// such as the default one holds them beside the plain merges).
fn is_pairwise(k: &Kernel) -> bool {
    let v = &k.meta.variant;
    v.family == crate::variant::Family::MergeAttnStates
        && v.output == crate::variant::OutputKind::Same
        && !v.mask_empty_context
}

fn max_head_size(rt: &Runtime) -> usize {
    rt.kernels()
        .iter()
        .map(|k| k.meta.variant.head_size as usize)
        .max()
        .unwrap_or(0)
}

/// What `bench` times.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub shapes: Vec<Shape>,
    /// Cold launches per kernel and shape (median).
    pub reps: usize,
    /// Hot: timed replays of each graph (median).
    pub graph_reps: usize,
    pub l2: L2,
    /// (dtype, head size) of the kernels to time.
    pub only: Vec<(String, u32)>,
}

/// Cold and hot copy times of one byte count.
#[derive(Clone, Copy, Default)]
struct CopyTimes {
    cold: Option<f64>,
    hot: Option<f64>,
}

/// Time every kernel of `dir` on the given shapes (T, H, threshold T/2), and the per-call host
/// cost of launching. Returns JSON rows.
pub fn bench(dir: &Path, o: &BenchOptions) -> Result<serde_json::Value, RuntimeError> {
    let ctx = CudaContext::new(0).map_err(RuntimeError::from)?;
    let stream = ctx.default_stream();
    let rt = Runtime::load(ctx.clone(), dir)?;
    let max_d = max_head_size(&rt);
    let max_rows = o.shapes.iter().map(|s| s.0 * s.1).max().unwrap_or(1).max(1);
    let mut rows = Vec::new();
    let mut current = None;
    let mut kernels: Vec<&Kernel> = rt
        .kernels()
        .iter()
        .map(|k| k.as_ref())
        // A size rule's kernels run inside their kernel's rows (its launches apply the rule).
        .filter(|k| is_pairwise(k) && k.meta.variant.rows_below.is_none())
        .filter(|k| {
            o.only
                .iter()
                .any(|(d, h)| k.meta.variant.dtype.name() == d && k.meta.variant.head_size == *h)
        })
        .collect();
    kernels.sort_by_key(|k| k.meta.variant.dtype.name());
    // The copies move each row's bytes: half read, half written.
    let copy_bytes = |k: &Kernel, (t, h, half): Shape| {
        let size = k.meta.dtype().map_or(4, |d| d.size_bytes() as usize);
        let n = if half { t / 2 } else { t };
        (merge_bytes(t, h, k.meta.variant.head_size as usize, size, n, true) / 2) as usize
    };
    let max_copy = kernels
        .iter()
        .flat_map(|k| o.shapes.iter().map(|&s| copy_bytes(k, s)))
        .max()
        .unwrap_or(0);
    let copies = if o.l2 == L2::Both || o.l2 == L2::Hot {
        Some(CopyBuffers::new(&stream, max_copy)?)
    } else {
        None
    };
    let mut hot_state = if o.l2.hot() {
        Some(hot::HotState::new(&ctx, &stream)?)
    } else {
        None
    };
    let mut copy_times: HashMap<usize, CopyTimes> = HashMap::new();
    for k in &kernels {
        let dtype = k
            .meta
            .dtype()
            .ok_or_else(|| RuntimeError::NoKernel(k.meta.name.clone()))?;
        let bufs = buffers_for(&mut current, &stream, dtype, max_rows * max_d, max_rows)?;
        let d = k.meta.variant.head_size as usize;
        for &(t, h, half) in &o.shapes {
            let n = if half { t / 2 } else { t };
            let bytes = merge_bytes(t, h, d, dtype.size_bytes() as usize, n, true);
            let mut row = serde_json::json!({
                "kernel": k.meta.name, "dtype": dtype.name(), "T": t, "H": h, "D": d,
                "threshold": if half { "T/2" } else { "none" }, "bytes": bytes,
            });
            let gbs = |us: f64| bytes as f64 / (us * 1e-6) / 1e9;
            let cb = copy_bytes(k, (t, h, half));
            let ct = copy_times.entry(cb).or_default();
            if o.l2.cold() {
                let args = bufs.args(&stream, t, h, d, Some(n));
                let us = cold::time_kernel(&ctx, k, &stream, bufs, &args, o.reps)?;
                row["us"] = us.into();
                row["gbs"] = gbs(us).into();
                if let (Some(c), true) = (&copies, o.l2 == L2::Both) {
                    let (a, b, _) = c.ptrs(&stream);
                    let copy_us = match ct.cold {
                        Some(v) => v,
                        None => cold::time_copy(&ctx, &stream, bufs, (a, b), cb, o.reps)?,
                    };
                    ct.cold = Some(copy_us);
                    row["copy_us"] = copy_us.into();
                    row["copy_gbs"] = gbs(copy_us).into();
                    row["pct_copy"] = (100.0 * copy_us / us).into();
                }
            }
            if let (Some(hs), Some(c)) = (hot_state.as_mut(), &copies) {
                let r = hs.merge(k, bufs, (t, h, d, n), bytes, o.graph_reps)?;
                row["hot_us"] = r.us.into();
                row["hot_gbs"] = gbs(r.us).into();
                row["hot_producer_us"] = r.producer_us.into();
                row["hot_iterations"] = r.iterations.into();
                let copy_us = match ct.hot {
                    Some(v) => v,
                    None => hs.copy(c, cb, o.graph_reps)?.us,
                };
                ct.hot = Some(copy_us);
                row["hot_copy_us"] = copy_us.into();
                row["hot_copy_gbs"] = gbs(copy_us).into();
                row["hot_pct_copy"] = (100.0 * copy_us / r.us).into();
            }
            rows.push(row);
        }
    }
    drop(hot_state);
    let host = host_cost(&stream, &kernels, current.as_ref())?;
    Ok(serde_json::json!({
        "device": ctx.name().unwrap_or_default(),
        "l2": o.l2.name(),
        "method": {
            "cold": "eager, L2 flushed (512 MB memset) before each launch, median of CUDA-event times",
            "hot": "CUDA graph of R x [producer, X] minus R x [producer], per iteration, median of graph replays; the producer is one kernel copying every input of X from a pristine copy",
            "copy": "cuMemcpyDtoDAsync of half the merge's bytes (read + written = the merge's bytes)",
        },
        "rows": rows,
        "host_us_per_launch": host[0],
        "host_us_validation_only": host[1],
        "host_us_bare_cu_launch_kernel": host[2],
    }))
}

/// Host cost of one launch: the runtime's (checks and launch), the checks alone, and
/// `cuLaunchKernel` alone, each the median of 20 rounds of 500 calls.
fn host_cost(
    stream: &std::sync::Arc<cudarc::driver::CudaStream>,
    kernels: &[&Kernel],
    bufs: Option<&buffers::Buffers>,
) -> Result<[Option<f64>; 3], RuntimeError> {
    // Back-to-back launches on a tiny shape, fewer than the launch queue holds. The last
    // kernel's dtype is the one the current buffers hold.
    let k = kernels
        .last()
        .ok_or_else(|| RuntimeError::NoKernel("any".into()))?;
    let bufs = bufs.ok_or_else(|| RuntimeError::Bench("no buffers".into()))?;
    let args = bufs.args(stream, 1, 1, k.meta.variant.head_size as usize, Some(1));
    let mut per_call = Vec::new();
    for _ in 0..20 {
        stream.synchronize().map_err(RuntimeError::from)?;
        let start = std::time::Instant::now();
        for _ in 0..500 {
            // SAFETY: the bench's own buffers, sized for the largest shape, alive throughout.
            unsafe { k.launch(stream, &args.args()) }?;
        }
        per_call.push(start.elapsed().as_secs_f64() * 1e6 / 500.0);
    }
    stream.synchronize().map_err(RuntimeError::from)?;
    // The same checks without a launch: what validation costs of the per-call time (the rest
    // is the context check and cuLaunchKernel). Naming the arguments is part of it, as above.
    let mut checks = Vec::new();
    for _ in 0..20 {
        let start = std::time::Instant::now();
        for _ in 0..500 {
            let args = std::hint::black_box(&args);
            std::hint::black_box(k.check(&args.args())?);
        }
        checks.push(start.elapsed().as_secs_f64() * 1e6 / 500.0);
    }
    // The driver's launch call alone (as the runtime makes it) with the same arguments: what any
    // launcher pays on this machine.
    let mut bare = Vec::new();
    for _ in 0..20 {
        stream.synchronize().map_err(RuntimeError::from)?;
        // SAFETY: as above.
        bare.push(unsafe { k.bare_launch_us(stream, &args.args(), 500) }?);
    }
    stream.synchronize().map_err(RuntimeError::from)?;
    let mid = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    };
    Ok([mid(per_call), mid(checks), mid(bare)])
}

#[cfg(test)]
mod tests;
