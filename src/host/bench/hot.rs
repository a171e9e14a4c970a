//! Hot L2 timings of a merge and of a copy of the same bytes, on a stream of their own (graphs
//! cannot be captured on the legacy default stream the cold mode uses).

use std::sync::Arc;

use cudarc::driver::{result, CudaContext, CudaStream};

use super::buffers::{Buffers, CopyBuffers};
use super::graph::{self, Producer, Range};
use crate::host::runtime::{Kernel, RuntimeError};

/// A hot-mode time: X's time per iteration, the producer's, and the iterations per graph.
#[derive(Debug, Clone, Copy)]
pub(super) struct HotTime {
    pub us: f64,
    pub producer_us: f64,
    pub iterations: usize,
}

pub(super) struct HotState {
    pub(super) stream: Arc<CudaStream>,
    producer: Producer,
}

impl HotState {
    pub(super) fn new(
        ctx: &Arc<CudaContext>,
        default: &Arc<CudaStream>,
    ) -> Result<HotState, RuntimeError> {
        // Whatever the default stream has queued is done before the new stream starts.
        default.synchronize()?;
        let stream = ctx.new_stream()?;
        let producer = Producer::load(ctx, &stream)?;
        Ok(HotState { stream, producer })
    }

    /// The producer's ranges for a merge of `(t, h, d)` on `bufs`.
    pub(super) fn ranges(
        &self,
        bufs: &mut Buffers,
        (t, h, d): (usize, usize, usize),
    ) -> Result<[Range; 4], RuntimeError> {
        bufs.producer_ranges(&self.stream, t, h, d)
    }

    /// The producer alone for these ranges: microseconds per launch, in a graph of
    /// `iterations`.
    pub(super) fn producer_us(
        &self,
        ranges: &[Range],
        iterations: usize,
        replays: usize,
    ) -> Result<f64, RuntimeError> {
        // SAFETY: the ranges lie in the bench's buffers (Buffers::producer_ranges), alive
        // until the synchronize that ends the timing.
        unsafe {
            graph::producer_graph_us(&self.stream, &self.producer, ranges, iterations, replays)
        }
    }

    /// `k` hot on `(t, h, d, n)`; `producer_us` when already measured for these ranges (the
    /// tuner measures it once per shape for all candidates).
    pub(super) fn merge_with(
        &self,
        k: &Kernel,
        bufs: &mut Buffers,
        (t, h, d, n): (usize, usize, usize, usize),
        bytes: u64,
        replays: usize,
        producer_us: Option<f64>,
    ) -> Result<HotTime, RuntimeError> {
        let ranges = self.ranges(bufs, (t, h, d))?;
        let args = bufs.args(&self.stream, t, h, d, Some(n));
        // Checked once, before the capture: a refusal is reported, not captured.
        let checked = k.check(&args.args())?;
        let iterations = graph::graph_iterations(bytes);
        // SAFETY: the ranges and the merge's arguments are the bench's own buffers, allocated
        // for the largest shape and alive until the timing's synchronize.
        let (us, producer_us) = unsafe {
            graph::hot_us(
                &self.stream,
                &self.producer,
                &ranges,
                iterations,
                replays,
                producer_us,
                || k.launch_checked(&self.stream, &checked),
            )
        }?;
        Ok(HotTime {
            us,
            producer_us,
            iterations,
        })
    }

    pub(super) fn merge(
        &self,
        k: &Kernel,
        bufs: &mut Buffers,
        shape: (usize, usize, usize, usize),
        bytes: u64,
        replays: usize,
    ) -> Result<HotTime, RuntimeError> {
        self.merge_with(k, bufs, shape, bytes, replays, None)
    }

    /// A copy of `bytes` (cuMemcpyDtoDAsync) right after the producer rewrote its source.
    pub(super) fn copy(
        &self,
        c: &CopyBuffers,
        bytes: usize,
        replays: usize,
    ) -> Result<HotTime, RuntimeError> {
        if bytes > c.len() {
            return Err(RuntimeError::Bench(format!(
                "copy of {bytes} bytes: the copy buffers hold {}",
                c.len()
            )));
        }
        let (a, b, pristine) = c.ptrs(&self.stream);
        // The producer copies whole 4-byte words; the copy moves the exact byte count.
        let ranges = [(pristine, a, (bytes as u64).div_ceil(4) * 4)];
        let iterations = graph::graph_iterations(2 * bytes as u64);
        let stream = &self.stream;
        // SAFETY: a, b and the pristine buffer each hold c.len() >= bytes rounded up to 16
        // bytes, alive until the timing's synchronize.
        let (us, producer_us) = unsafe {
            graph::hot_us(
                stream,
                &self.producer,
                &ranges,
                iterations,
                replays,
                None,
                || {
                    result::memcpy_dtod_async(b, a, bytes, stream.cu_stream())
                        .map_err(RuntimeError::from)
                },
            )
        }?;
        Ok(HotTime {
            us,
            producer_us,
            iterations,
        })
    }
}
