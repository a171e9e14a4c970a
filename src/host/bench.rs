//! GPU timing through the Rust runtime (feature `runtime`): `mla-gen tune` picks each (dtype, head
//! size)'s fastest schedule among candidate kernels; `mla-gen bench` times kernels and the
//! launcher's host cost. Median of CUDA-event times, L2 flushed before every launch, random data.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, CudaSlice, CudaStream, DevicePtr};

use crate::dtype::Dtype;
use crate::host::runtime::{DeviceBuffer, Kernel, MergeArgs, Runtime, RuntimeError};
use crate::reference::Layout;

/// Bytes a merge moves: rows with context read two rows and write one (and three lse), rows
/// without context read and write one row (and two lse).
pub(crate) fn merge_bytes(t: usize, h: usize, d: usize, size: usize, n: usize, lse: bool) -> u64 {
    let (ctx, plain) = ((n * h) as u64, ((t - n) * h) as u64);
    let (l3, l2) = if lse { (12, 8) } else { (8, 4) };
    ctx * (3 * (d * size) as u64 + l3) + plain * (2 * (d * size) as u64 + l2)
}

/// Device buffers big enough for the largest shape, filled once with random values.
struct Buffers {
    dtype: Dtype,
    prefix: CudaSlice<u8>,
    suffix: CudaSlice<u8>,
    output: CudaSlice<u8>,
    prefix_lse: CudaSlice<f32>,
    suffix_lse: CudaSlice<f32>,
    output_lse: CudaSlice<f32>,
    flush: CudaSlice<u8>,
}

fn random_bytes(dtype: Dtype, n_elems: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ((x >> 11) as f64 / (1u64 << 53) as f64 * 8.0 - 4.0) as f32
    };
    let mut out = Vec::with_capacity(n_elems * dtype.size_bytes() as usize);
    for _ in 0..n_elems {
        let v = next();
        match dtype {
            Dtype::F32 => out.extend_from_slice(&v.to_le_bytes()),
            Dtype::F16 => out.extend_from_slice(&half::f16::from_f32(v).to_le_bytes()),
            Dtype::Bf16 => out.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes()),
            Dtype::Fp8E4m3 => out.push(crate::reference::fp8::e4m3_from_f32(v)),
            Dtype::I32 => out.extend_from_slice(&(v as i32).to_le_bytes()),
            Dtype::U8 => out.push(v as u8),
        }
    }
    out
}

impl Buffers {
    fn new(
        stream: &Arc<CudaStream>,
        dtype: Dtype,
        max_elems: usize,
        max_rows: usize,
    ) -> Result<Buffers, RuntimeError> {
        let bytes = max_elems * dtype.size_bytes() as usize;
        // SAFETY: every byte is written below before any kernel reads it.
        let alloc = |n: usize| unsafe { stream.alloc::<u8>(n) }.map_err(RuntimeError::from);
        let (mut prefix, mut suffix, output) = (alloc(bytes)?, alloc(bytes)?, alloc(bytes)?);
        // Fill from a 64 MB random chunk, repeated; random, never zeros.
        let chunk_elems = (64 << 20) / dtype.size_bytes() as usize;
        for (i, buf) in [&mut prefix, &mut suffix].into_iter().enumerate() {
            let chunk = random_bytes(dtype, chunk_elems.min(max_elems), 0x9e37 + i as u64);
            let mut off = 0;
            while off < bytes {
                let len = chunk.len().min(bytes - off);
                let mut view = buf.slice_mut(off..off + len);
                stream
                    .memcpy_htod(&chunk[..len], &mut view)
                    .map_err(RuntimeError::from)?;
                off += len;
            }
        }
        let lse: Vec<f32> = random_bytes(Dtype::F32, max_rows, 0x51)
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) * 2.5)
            .collect();
        let prefix_lse = stream.clone_htod(&lse).map_err(RuntimeError::from)?;
        let suffix_lse = stream
            .clone_htod(&lse.iter().rev().copied().collect::<Vec<_>>())
            .map_err(RuntimeError::from)?;
        let output_lse = stream.clone_htod(&lse).map_err(RuntimeError::from)?;
        let flush = stream
            .alloc_zeros::<u8>(512 << 20)
            .map_err(RuntimeError::from)?;
        stream.synchronize().map_err(RuntimeError::from)?;
        Ok(Buffers {
            dtype,
            prefix,
            suffix,
            output,
            prefix_lse,
            suffix_lse,
            output_lse,
            flush,
        })
    }

    fn args(
        &self,
        stream: &CudaStream,
        t: usize,
        h: usize,
        d: usize,
        n: Option<usize>,
    ) -> MergeArgs {
        let ptr = |s: &CudaSlice<u8>| s.device_ptr(stream).0;
        let lptr = |s: &CudaSlice<f32>| s.device_ptr(stream).0;
        let elems = self.prefix.len() / self.dtype.size_bytes() as usize;
        let l = Layout::contiguous(h, d);
        let buf = |p: u64| DeviceBuffer {
            ptr: p,
            len: elems,
            dtype: self.dtype,
        };
        let lbuf = |p: u64| DeviceBuffer {
            ptr: p,
            len: self.prefix_lse.len(),
            dtype: Dtype::F32,
        };
        MergeArgs {
            output: buf(ptr(&self.output)),
            output_lse: Some(lbuf(lptr(&self.output_lse))),
            prefix: buf(ptr(&self.prefix)),
            prefix_lse: lbuf(lptr(&self.prefix_lse)),
            suffix: buf(ptr(&self.suffix)),
            suffix_lse: lbuf(lptr(&self.suffix_lse)),
            output_scale: None,
            output_scales: None,
            num_tokens: t,
            num_heads: h,
            output_layout: l,
            prefix_layout: l,
            suffix_layout: l,
            prefill_tokens_with_context: n,
        }
    }

    fn flush_l2(&self, stream: &CudaStream) -> Result<(), RuntimeError> {
        let (p, _s) = self.flush.device_ptr(stream);
        // SAFETY: writes inside our own 512 MB allocation.
        unsafe { result::memset_d8_async(p, 1, self.flush.len(), stream.cu_stream()) }
            .map_err(RuntimeError::from)
    }
}

/// The buffers for `dtype`, reallocated (the old ones freed first) when the dtype changes.
fn buffers_for<'a>(
    current: &'a mut Option<Buffers>,
    stream: &Arc<CudaStream>,
    dtype: Dtype,
    max_elems: usize,
    max_rows: usize,
) -> Result<&'a Buffers, RuntimeError> {
    if current.as_ref().map(|b| b.dtype) != Some(dtype) {
        drop(current.take());
        *current = Some(Buffers::new(stream, dtype, max_elems, max_rows)?);
    }
    current
        .as_ref()
        .ok_or_else(|| RuntimeError::Bench("no buffers".into()))
}

/// `bench` and `tune` time the pairwise merge; the K-way and in-place merges are timed by
/// python/bench/bench.py.
fn is_pairwise(k: &Kernel) -> bool {
    k.meta.variant.family == crate::variant::Family::MergeAttnStates
}

fn max_head_size(rt: &Runtime) -> usize {
    rt.kernels()
        .iter()
        .map(|k| k.meta.variant.head_size as usize)
        .max()
        .unwrap_or(0)
}

/// Median kernel time in microseconds over `reps` launches, each after an L2 flush.
fn time_kernel(
    rt: &Runtime,
    k: &Kernel,
    stream: &Arc<CudaStream>,
    bufs: &Buffers,
    args: &MergeArgs,
    reps: usize,
) -> Result<f64, RuntimeError> {
    let reps = reps.max(1);
    for _ in 0..3 {
        // SAFETY: the arguments are the bench's own buffers (Buffers), allocated for the largest
        // shape and alive until the stream is synchronized below.
        unsafe { k.launch(stream, &args.args()) }?;
    }
    let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
    let mut events = Vec::with_capacity(reps);
    for _ in 0..reps {
        let (a, b) = (
            rt.ctx.new_event(flags).map_err(RuntimeError::from)?,
            rt.ctx.new_event(flags).map_err(RuntimeError::from)?,
        );
        bufs.flush_l2(stream)?;
        a.record(stream).map_err(RuntimeError::from)?;
        // SAFETY: as above.
        unsafe { k.launch(stream, &args.args()) }?;
        b.record(stream).map_err(RuntimeError::from)?;
        events.push((a, b));
    }
    stream.synchronize().map_err(RuntimeError::from)?;
    let mut times: Vec<f64> = events
        .iter()
        .map(|(a, b)| a.elapsed_ms(b).map(|ms| f64::from(ms) * 1e3))
        .collect::<Result<_, _>>()
        .map_err(RuntimeError::from)?;
    times.sort_by(f64::total_cmp);
    Ok(times.get(times.len() / 2).copied().unwrap_or(f64::NAN))
}

/// Shapes the tuner scores a schedule on: (tokens, heads, threshold at T/2).
pub(crate) const TUNE_SHAPES: [(usize, usize, bool); 8] = [
    (1024, 16, false),
    (1024, 128, false),
    (8192, 16, true),
    (8192, 128, false),
    (32768, 16, false),
    (32768, 128, false),
    (32768, 128, true),
    (4096, 64, false),
];

/// For each (dtype, head size) in `candidates`, time every schedule on TUNE_SHAPES and keep
/// the one with the lowest geometric-mean time relative to the best per shape. Writes the
/// winners as TOML to `out` and returns a report.
pub fn tune(candidates: &Path, out: &Path, reps: usize) -> Result<String, RuntimeError> {
    let ctx = CudaContext::new(0).map_err(RuntimeError::from)?;
    let stream = ctx.default_stream();
    let rt = Runtime::load(ctx.clone(), candidates)?;
    // (dtype, head size) -> kernels (schedules)
    let mut groups: BTreeMap<(String, u32), Vec<&Kernel>> = BTreeMap::new();
    // Schedules are tuned on the pairwise merge; other families take the same table.
    for k in rt
        .kernels()
        .iter()
        .map(|k| k.as_ref())
        .filter(|k| is_pairwise(k))
    {
        groups
            .entry((k.meta.variant.dtype.clone(), k.meta.variant.head_size))
            .or_default()
            .push(k);
    }
    let max_d = max_head_size(&rt);
    let max_rows = TUNE_SHAPES.iter().map(|s| s.0 * s.1).max().unwrap_or(0);
    let mut report = String::new();
    let mut toml = format!(
        "# Schedules chosen by `mla-gen tune` on {} (sm_{}{}), driver CUDA {}.{}; each is the lowest\n# geometric-mean time over the tune shapes. Generation reads this file (embedded at build\n# time), so it needs no GPU. (dtype, head_size) pairs not listed use rows_per_thread = 1,\n# min_blocks_per_sm = 1, block_threads = 256,\n# heads_per_block = 1.\n",
        ctx.name().unwrap_or_default(),
        rt.compute_capability.0,
        rt.compute_capability.1,
        rt.driver_cuda.0,
        rt.driver_cuda.1
    );
    let mut current: Option<Buffers> = None;
    for ((dtype_name, d), kernels) in &groups {
        let dtype = Dtype::from_name(dtype_name)
            .ok_or_else(|| RuntimeError::NoKernel(dtype_name.to_string()))?;
        let bufs = buffers_for(&mut current, &stream, dtype, max_rows * max_d, max_rows)?;
        let d = *d as usize;
        // times[kernel][shape]
        let mut times = vec![vec![0.0; TUNE_SHAPES.len()]; kernels.len()];
        for (si, &(t, h, half)) in TUNE_SHAPES.iter().enumerate() {
            let args = bufs.args(&stream, t, h, d, half.then_some(t / 2));
            for (ki, k) in kernels.iter().enumerate() {
                times[ki][si] = time_kernel(&rt, k, &stream, bufs, &args, reps)?;
            }
        }
        let best_per_shape: Vec<f64> = (0..TUNE_SHAPES.len())
            .map(|si| {
                times
                    .iter()
                    .map(|row| row[si])
                    .fold(f64::INFINITY, f64::min)
            })
            .collect();
        let score = |row: &Vec<f64>| {
            (row.iter()
                .zip(&best_per_shape)
                .map(|(t, b)| (t / b).ln())
                .sum::<f64>()
                / row.len() as f64)
                .exp()
        };
        let (wi, _) = times
            .iter()
            .enumerate()
            .map(|(i, r)| (i, score(r)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .ok_or_else(|| RuntimeError::NoKernel(format!("{dtype_name} d{d}")))?;
        for (ki, k) in kernels.iter().enumerate() {
            let worst = times[ki]
                .iter()
                .zip(&best_per_shape)
                .map(|(t, b)| t / b)
                .fold(0.0, f64::max);
            let big = merge_bytes(32768, 128, d, dtype.size_bytes() as usize, 32768, true) as f64;
            report.push_str(&format!(
                "{}{:<48} score {:.3}  worst {:.3}  32768x128: {:>8.1} us = {:>5.0} GB/s\n",
                if ki == wi { "* " } else { "  " },
                k.meta.name,
                score(&times[ki]),
                worst,
                times[ki][5],
                big / (times[ki][5] * 1e-6) / 1e9
            ));
        }
        let w = &kernels[wi].meta.variant.schedule;
        toml.push_str(&format!(
            "\n[[schedule]]\ndtype = \"{dtype_name}\"\nhead_size = {d}\nrows_per_thread = {}\nmin_blocks_per_sm = {}\nblock_threads = {}\nheads_per_block = {}\n",
            w.rows_per_thread, w.min_blocks_per_sm, w.block_threads, w.heads_per_block
        ));
    }
    std::fs::write(out, toml).map_err(|source| RuntimeError::Io {
        path: out.to_path_buf(),
        source,
    })?;
    Ok(report)
}

/// Time every kernel of `dir` on the given shapes (T, H, threshold T/2), and the per-call host
/// cost of launching. Returns JSON rows.
pub fn bench(
    dir: &Path,
    shapes: &[(usize, usize, bool)],
    reps: usize,
    only: &[(&str, u32)],
) -> Result<serde_json::Value, RuntimeError> {
    let ctx = CudaContext::new(0).map_err(RuntimeError::from)?;
    let stream = ctx.default_stream();
    let rt = Runtime::load(ctx.clone(), dir)?;
    let max_d = max_head_size(&rt);
    let max_rows = shapes.iter().map(|s| s.0 * s.1).max().unwrap_or(1).max(1);
    let mut rows = Vec::new();
    let mut current: Option<Buffers> = None;
    let mut kernels: Vec<&Kernel> = rt
        .kernels()
        .iter()
        .map(|k| k.as_ref())
        .filter(|k| is_pairwise(k))
        .filter(|k| {
            only.iter()
                .any(|&(d, h)| k.meta.variant.dtype == d && k.meta.variant.head_size == h)
        })
        .collect();
    kernels.sort_by_key(|k| k.meta.variant.dtype.clone());
    for k in &kernels {
        let dtype = k
            .meta
            .dtype()
            .ok_or_else(|| RuntimeError::NoKernel(k.meta.name.clone()))?;
        let bufs = buffers_for(&mut current, &stream, dtype, max_rows * max_d, max_rows)?;
        let d = k.meta.variant.head_size as usize;
        for &(t, h, half) in shapes {
            let n = if half { t / 2 } else { t };
            let args = bufs.args(&stream, t, h, d, Some(n));
            let us = time_kernel(&rt, k, &stream, bufs, &args, reps)?;
            let bytes = merge_bytes(t, h, d, dtype.size_bytes() as usize, n, true);
            rows.push(serde_json::json!({
                "kernel": k.meta.name, "dtype": dtype.name(), "T": t, "H": h, "D": d,
                "threshold": if half { "T/2" } else { "none" }, "bytes": bytes,
                "us": us, "gbs": bytes as f64 / (us * 1e-6) / 1e9,
            }));
        }
    }
    // Host cost: back-to-back launches on a tiny shape, fewer than the launch queue holds.
    // The last kernel's dtype is the one the current buffers hold.
    let k = kernels
        .last()
        .ok_or_else(|| RuntimeError::NoKernel("any".into()))?;
    let bufs = current
        .as_ref()
        .ok_or_else(|| RuntimeError::Bench("no buffers".into()))?;
    let args = bufs.args(&stream, 1, 1, k.meta.variant.head_size as usize, Some(1));
    let mut per_call = Vec::new();
    for _ in 0..20 {
        stream.synchronize().map_err(RuntimeError::from)?;
        let start = std::time::Instant::now();
        for _ in 0..500 {
            // SAFETY: the bench's own buffers, sized for the largest shape, alive throughout.
            unsafe { k.launch(&stream, &args.args()) }?;
        }
        per_call.push(start.elapsed().as_secs_f64() * 1e6 / 500.0);
    }
    stream.synchronize().map_err(RuntimeError::from)?;
    per_call.sort_by(f64::total_cmp);
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
    checks.sort_by(f64::total_cmp);
    // cuLaunchKernel alone with the same arguments: what any launcher pays on this machine.
    let mut bare = Vec::new();
    for _ in 0..20 {
        stream.synchronize().map_err(RuntimeError::from)?;
        // SAFETY: as above.
        bare.push(unsafe { k.bare_launch_us(&stream, &args.args(), 500) }?);
    }
    stream.synchronize().map_err(RuntimeError::from)?;
    bare.sort_by(f64::total_cmp);
    Ok(serde_json::json!({
        "device": ctx.name().unwrap_or_default(),
        "rows": rows,
        "host_us_per_launch": per_call.get(per_call.len() / 2),
        "host_us_validation_only": checks.get(checks.len() / 2),
        "host_us_bare_cu_launch_kernel": bare.get(bare.len() / 2),
    }))
}
