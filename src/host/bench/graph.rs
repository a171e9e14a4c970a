//! Hot L2, CUDA graphs: the producer kernel that writes a merge's inputs just before it (compiled
//! by NVRTC for the GPU at hand when the bench starts), stream capture, and replay timing.
//!
//! A measurement captures R iterations of [producer, X] in one graph and R producers alone in
//! another, replays each `replays` times (after 3 unrecorded replays) with CUDA events around
//! every replay, and reports (median[producer, X] - median[producer]) / R: the time X adds
//! when its inputs were just written and are still in L2, launched as an engine's CUDA graph
//! launches it.

use std::ffi::{c_void, CString};
use std::sync::Arc;

use cudarc::driver::safe::CudaGraph;
use cudarc::driver::{result, sys, CudaContext, CudaStream};

use super::cold::median;
use crate::host::runtime::RuntimeError;

/// The producer's CUDA source: NVRTC compiles it to a CUBIN for the bench's GPU (a CUBIN, not
/// PTX, so that an NVRTC newer than the driver still gives an image the driver loads).
const PRODUCER_SOURCE: &str = include_str!("producer.cu");
const PRODUCER_NAME: &str = "mla_gen_bench_copy";
/// Ranges one producer launch copies (one per `blockIdx.y`).
pub(super) const MAX_RANGES: usize = 4;
const PRODUCER_THREADS: u32 = 256;

/// NVRTC options of the producer for `arch` (an `sm_XY` or `compute_XY`).
fn options(arch: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        "-std=c++17".to_string(),
    ]
}

/// The producer's CUBIN for `arch` (`sm_XY`).
fn compile(arch: &str) -> Result<Vec<u8>, RuntimeError> {
    let fail = |detail: String| {
        RuntimeError::Bench(format!(
            "the hot mode compiles its producer kernel (src/host/bench/producer.cu) with NVRTC for {arch}: {detail}"
        ))
    };
    let nvrtc = crate::nvrtc::load().map_err(|e| fail(e.to_string()))?;
    nvrtc
        .compile("producer.cu", PRODUCER_SOURCE, &options(arch), false, true)
        .map_err(|e| fail(e.to_string()))?
        .map_err(|f| fail(format!("{} {}", f.message, f.log)))?
        .cubin
        .ok_or_else(|| fail("NVRTC gave no CUBIN".to_string()))
}

/// (source, destination, bytes): one range the producer copies.
pub(super) type Range = (u64, u64, u64);

/// The loaded producer kernel; its module is unloaded on drop.
pub(super) struct Producer {
    ctx: Arc<CudaContext>,
    module: sys::CUmodule,
    function: sys::CUfunction,
    max_blocks: u32,
}

impl Drop for Producer {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: loaded in `load`, unloaded once, here; `function` dies with it.
            let _ = unsafe { result::module::unload(self.module) };
        }
    }
}

impl Producer {
    /// Compile the producer for this GPU, load it, and check, once, that a launch copies what
    /// it should.
    pub(super) fn load(
        ctx: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
    ) -> Result<Producer, RuntimeError> {
        ctx.bind_to_thread()?;
        let cc = |a| ctx.attribute(a).map(|v| v.to_string());
        let arch = format!(
            "sm_{}{}",
            cc(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            cc(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?
        );
        let image = compile(&arch)?;
        let why = |e: cudarc::driver::DriverError| {
            RuntimeError::Bench(format!(
                "the hot mode's producer kernel (compiled by NVRTC for {arch}) cannot be loaded: {e}"
            ))
        };
        // SAFETY: a CUBIN image, alive for the call; the context is current.
        let module =
            unsafe { result::module::load_data(image.as_ptr() as *const c_void) }.map_err(why)?;
        let name = CString::new(PRODUCER_NAME)
            .map_err(|_| RuntimeError::Bench("producer name holds a NUL byte".into()))?;
        let sms = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .unwrap_or(132)
            .max(1) as u32;
        // SAFETY: the module was just loaded in the current context.
        let function = match unsafe { result::module::get_function(module, name) } {
            Ok(f) => f,
            Err(e) => {
                // SAFETY: loaded above, unloaded once.
                let _ = unsafe { result::module::unload(module) };
                return Err(why(e));
            }
        };
        let p = Producer {
            ctx: ctx.clone(),
            module,
            function,
            max_blocks: sms * 8,
        };
        p.self_test(stream)?;
        Ok(p)
    }

    /// Enqueue one launch copying `ranges` (at most four) on `stream`; capturable.
    ///
    /// # Safety
    /// Every range's source and destination hold its bytes, 16-byte aligned, and stay allocated
    /// until the launch (or every replay of a graph that captured it) has finished.
    pub(super) unsafe fn launch(
        &self,
        stream: &CudaStream,
        ranges: &[Range],
    ) -> Result<(), RuntimeError> {
        if ranges.is_empty() || ranges.len() > MAX_RANGES {
            return Err(RuntimeError::Bench(format!(
                "the producer copies 1 to {MAX_RANGES} ranges, not {}",
                ranges.len()
            )));
        }
        let mut values = [0u64; 3 * MAX_RANGES];
        for (i, &(src, dst, bytes)) in ranges.iter().enumerate() {
            values[3 * i..3 * i + 3].copy_from_slice(&[src, dst, bytes]);
        }
        let vectors = ranges.iter().map(|r| r.2 / 16).max().unwrap_or(0);
        let blocks = vectors
            .div_ceil(u64::from(PRODUCER_THREADS))
            .clamp(1, u64::from(self.max_blocks)) as u32;
        let mut params: Vec<*mut c_void> = values
            .iter_mut()
            .map(|v| v as *mut u64 as *mut c_void)
            .collect();
        // SAFETY: twelve 8-byte parameters in the kernel's order (pointer, pointer, u64 per
        // range; unused ranges copy 0 bytes and are never reached by blockIdx.y), alive for the
        // call; the caller vouches for the memory.
        unsafe {
            result::launch_kernel(
                self.function,
                (blocks, ranges.len() as u32, 1),
                (PRODUCER_THREADS, 1, 1),
                0,
                stream.cu_stream(),
                &mut params,
            )
        }?;
        Ok(())
    }

    /// Copy four ranges with ragged tails into buffers poisoned first and compare: a producer
    /// that does not copy would leave the hot mode timing nothing.
    fn self_test(&self, stream: &Arc<CudaStream>) -> Result<(), RuntimeError> {
        let sizes = [16 * 5000 + 12, 4, 16 * 3 + 8, 1 << 20];
        let (offsets, total) = aligned_layout(&sizes);
        let total = total as usize;
        let src: Vec<u8> = (0..total).map(|i| (i * 7 + 3) as u8).collect();
        let d_src = stream.clone_htod(&src)?;
        let d_dst = stream.alloc_zeros::<u8>(total + 64)?;
        let (ps, pd) = (
            cudarc::driver::DevicePtr::device_ptr(&d_src, stream).0,
            cudarc::driver::DevicePtr::device_ptr(&d_dst, stream).0,
        );
        // Ranges at 16-byte aligned offsets inside both buffers.
        let mut ranges = [(0, 0, 0); MAX_RANGES];
        for ((r, &n), &off) in ranges.iter_mut().zip(&sizes).zip(&offsets) {
            *r = (ps + off, pd + off, n);
        }
        // SAFETY: every range lies inside both allocations, which outlive the synchronize.
        unsafe { self.launch(stream, &ranges) }?;
        stream.synchronize()?;
        let got = stream.clone_dtoh(&d_dst)?;
        for &(s, _, n) in &ranges {
            let at = (s - ps) as usize;
            let end = at + n as usize;
            if got[at..end] != src[at..end] {
                return Err(RuntimeError::Bench(format!(
                    "the hot mode's producer kernel copied wrong bytes (range at {at}, {n} bytes): not timing with it"
                )));
            }
        }
        Ok(())
    }
}

/// Offsets of ranges of these sizes laid out one after another at 16-byte boundaries, and the
/// bytes they span (each range padded to a multiple of 16).
pub(super) fn aligned_layout(sizes: &[u64]) -> (Vec<u64>, u64) {
    let mut offsets = Vec::with_capacity(sizes.len());
    let mut end = 0u64;
    for &n in sizes {
        offsets.push(end);
        end += n.div_ceil(16) * 16;
    }
    (offsets, end)
}

/// Capture what `body` enqueues on `stream` into an instantiated graph. The capture is ended
/// on every path, so an error leaves the stream usable.
pub(super) fn capture(
    stream: &Arc<CudaStream>,
    body: impl FnOnce() -> Result<(), RuntimeError>,
) -> Result<CudaGraph, RuntimeError> {
    stream.synchronize()?;
    stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)?;
    let enqueued = body();
    let graph = stream.end_capture(sys::CUgraphInstantiate_flags(0));
    enqueued?;
    graph?.ok_or_else(|| RuntimeError::Bench("the capture recorded nothing".into()))
}

/// Median time of one replay of `graph` in microseconds over `replays` (after 3 untimed).
/// Every replay is enqueued before the first is waited for, so the GPU runs them back to back.
pub(super) fn replay_us(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    graph: &CudaGraph,
    replays: usize,
) -> Result<f64, RuntimeError> {
    graph.upload()?;
    for _ in 0..3 {
        graph.launch()?;
    }
    let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
    let mut events = Vec::with_capacity(replays.max(1));
    for _ in 0..replays.max(1) {
        let (a, b) = (ctx.new_event(flags)?, ctx.new_event(flags)?);
        a.record(stream)?;
        graph.launch()?;
        b.record(stream)?;
        events.push((a, b));
    }
    stream.synchronize()?;
    let times: Vec<f64> = events
        .iter()
        .map(|(a, b)| a.elapsed_ms(b).map(|ms| f64::from(ms) * 1e3))
        .collect::<Result<_, _>>()?;
    Ok(median(times))
}

/// Iterations per graph: enough that one replay keeps the GPU busy well past the host's cost
/// of launching it (20 for small shapes), fewer for large ones so that a replay stays near
/// 0.5 ms (at least 2). `bytes` is what X moves.
pub fn graph_iterations(bytes: u64) -> usize {
    // X at ~3 TB/s plus ~2 us of launch gap, the producer about as long again.
    let iteration_us = 2.0 * (bytes as f64 / 3e6 + 2.0);
    ((500.0 / iteration_us) as usize).clamp(2, 20)
}

/// Time `x` hot: R x [producer(ranges), x] minus R x [producer(ranges)], per iteration. Returns
/// (x's time, the producer's time), microseconds.
///
/// # Safety
/// As [`Producer::launch`] for `ranges`; whatever `x` enqueues reads and writes only memory
/// that stays allocated until this returns.
pub(super) unsafe fn hot_us(
    stream: &Arc<CudaStream>,
    producer: &Producer,
    ranges: &[Range],
    iterations: usize,
    replays: usize,
    producer_us: Option<f64>,
    mut x: impl FnMut() -> Result<(), RuntimeError>,
) -> Result<(f64, f64), RuntimeError> {
    let r = iterations.max(1);
    let pair = capture(stream, || {
        for _ in 0..r {
            // SAFETY: the caller's contract.
            unsafe { producer.launch(stream, ranges) }?;
            x()?;
        }
        Ok(())
    })?;
    let pair_us = replay_us(&producer.ctx, stream, &pair, replays)?;
    drop(pair);
    let prod_us = match producer_us {
        Some(p) => p * r as f64,
        None => {
            // SAFETY: the caller's contract.
            unsafe { producer_graph_us(stream, producer, ranges, r, replays) }? * r as f64
        }
    };
    Ok(((pair_us - prod_us) / r as f64, prod_us / r as f64))
}

/// The producer alone: per-iteration time of R x [producer(ranges)], microseconds.
///
/// # Safety
/// As [`Producer::launch`] for `ranges`.
pub(super) unsafe fn producer_graph_us(
    stream: &Arc<CudaStream>,
    producer: &Producer,
    ranges: &[Range],
    iterations: usize,
    replays: usize,
) -> Result<f64, RuntimeError> {
    let r = iterations.max(1);
    let alone = capture(stream, || {
        for _ in 0..r {
            // SAFETY: the caller's contract.
            unsafe { producer.launch(stream, ranges) }?;
        }
        Ok(())
    })?;
    Ok(replay_us(&producer.ctx, stream, &alone, replays)? / r as f64)
}

#[cfg(all(test, feature = "codegen"))]
mod tests {
    use super::*;

    /// producer.cu compiles to a CUBIN for each architecture the default spec serves (the bench
    /// compiles it for the GPU it runs on), naming the kernel the bench looks up, and ptxas
    /// takes it for sm_90 without spills.
    #[test]
    fn producer_compiles_for_every_default_arch_without_spills() {
        for arch in ["sm_80", "sm_90", "sm_100", "sm_120"] {
            let cubin = compile(arch).unwrap_or_else(|e| panic!("{e}"));
            let name = PRODUCER_NAME.as_bytes();
            assert!(
                cubin.windows(name.len()).any(|w| w == name),
                "{arch}: no {PRODUCER_NAME} in the CUBIN"
            );
        }
        let nvrtc = crate::nvrtc::load().expect("NVRTC (scripts/install-nvrtc.sh)");
        let mut verbose = options("sm_90");
        verbose.push("--ptxas-options=-v".to_string());
        let cubin = nvrtc
            .compile("producer.cu", PRODUCER_SOURCE, &verbose, false, true)
            .expect("NVRTC runs")
            .unwrap_or_else(|f| panic!("producer.cu for sm_90: {} {}", f.message, f.log));
        assert!(cubin.cubin.is_some_and(|c| !c.is_empty()));
        assert!(
            cubin.log.contains("0 bytes spill stores"),
            "ptxas: {}",
            cubin.log
        );
    }

    #[test]
    fn iterations_shrink_with_size_within_2_to_20() {
        assert_eq!(graph_iterations(1 << 20), 20);
        assert_eq!(graph_iterations(16 << 20), 20);
        assert_eq!(graph_iterations(64 << 20), 10);
        assert_eq!(graph_iterations(512 << 20), 2);
        assert_eq!(graph_iterations(16 << 30), 2);
        let mut last = 20;
        for mb in [1u64, 8, 64, 128, 256, 512, 1024, 4096] {
            let r = graph_iterations(mb << 20);
            assert!(r <= last && (2..=20).contains(&r));
            last = r;
        }
    }
}
