//! Cold L2, eager: each launch timed with CUDA events right after a 512 MB memset that flushes
//! the L2; the median of `reps`.

use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, CudaStream};

use super::buffers::Buffers;
use crate::host::runtime::{Kernel, MergeArgs, RuntimeError};

/// The median of a list of times (NaN when empty).
pub(super) fn median(mut times: Vec<f64>) -> f64 {
    times.sort_by(f64::total_cmp);
    times.get(times.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Median time in microseconds over `reps` runs of `launch`, each after an L2 flush.
fn time_flushed(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    bufs: &Buffers,
    reps: usize,
    mut launch: impl FnMut() -> Result<(), RuntimeError>,
) -> Result<f64, RuntimeError> {
    let reps = reps.max(1);
    for _ in 0..3 {
        launch()?;
    }
    let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
    let mut events = Vec::with_capacity(reps);
    for _ in 0..reps {
        let (a, b) = (
            ctx.new_event(flags).map_err(RuntimeError::from)?,
            ctx.new_event(flags).map_err(RuntimeError::from)?,
        );
        bufs.flush_l2(stream)?;
        a.record(stream).map_err(RuntimeError::from)?;
        launch()?;
        b.record(stream).map_err(RuntimeError::from)?;
        events.push((a, b));
    }
    stream.synchronize().map_err(RuntimeError::from)?;
    let times: Vec<f64> = events
        .iter()
        .map(|(a, b)| a.elapsed_ms(b).map(|ms| f64::from(ms) * 1e3))
        .collect::<Result<_, _>>()
        .map_err(RuntimeError::from)?;
    Ok(median(times))
}

/// Median kernel time in microseconds over `reps` launches, each after an L2 flush.
pub(super) fn time_kernel(
    ctx: &Arc<CudaContext>,
    k: &Kernel,
    stream: &Arc<CudaStream>,
    bufs: &Buffers,
    args: &MergeArgs,
    reps: usize,
) -> Result<f64, RuntimeError> {
    time_flushed(ctx, stream, bufs, reps, || {
        // SAFETY: the arguments are the bench's own buffers (Buffers), allocated for the largest
        // shape and alive until the stream is synchronized.
        unsafe { k.launch(stream, &args.args()) }
    })
}

/// Median time of a device-to-device copy (`cuMemcpyDtoDAsync`, what torch's `copy_` of a
/// contiguous tensor runs) of `bytes` from `src` to `dst`, each after an L2 flush.
pub(super) fn time_copy(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    bufs: &Buffers,
    (src, dst): (u64, u64),
    bytes: usize,
    reps: usize,
) -> Result<f64, RuntimeError> {
    time_flushed(ctx, stream, bufs, reps, || {
        // SAFETY: the bench's copy buffers hold at least `bytes` bytes each (CopyBuffers).
        unsafe { result::memcpy_dtod_async(dst, src, bytes, stream.cu_stream()) }
            .map_err(RuntimeError::from)
    })
}
