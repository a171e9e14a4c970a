//! The bench's device buffers: the merge's tensors for the largest shape, filled once with
//! random values (never zeros); for the hot mode, pristine copies of the inputs that the producer
//! kernel rewrites them from, and the copy's three buffers.

use std::sync::Arc;

use cudarc::driver::{result, CudaSlice, CudaStream, DevicePtr};

use crate::dtype::Dtype;
use crate::host::runtime::{DeviceBuffer, MergeArgs, RuntimeError};
use crate::reference::Layout;

/// Device buffers big enough for the largest shape, filled once with random values.
pub(super) struct Buffers {
    pub(super) dtype: Dtype,
    prefix: CudaSlice<u8>,
    suffix: CudaSlice<u8>,
    output: CudaSlice<u8>,
    prefix_lse: CudaSlice<f32>,
    suffix_lse: CudaSlice<f32>,
    output_lse: CudaSlice<f32>,
    flush: CudaSlice<u8>,
    /// The hot mode's producer sources: prefix, suffix and both lse as they were filled.
    pristine: Option<[CudaSlice<u8>; 4]>,
}

pub(super) fn random_bytes(dtype: Dtype, n_elems: usize, seed: u64) -> Vec<u8> {
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

/// Fill `buf` with a 64 MB random chunk of `dtype` values, repeated.
fn fill_random(
    stream: &Arc<CudaStream>,
    buf: &mut CudaSlice<u8>,
    dtype: Dtype,
    seed: u64,
) -> Result<(), RuntimeError> {
    let bytes = buf.len();
    let max_elems = bytes / dtype.size_bytes() as usize;
    let chunk_elems = (64 << 20) / dtype.size_bytes() as usize;
    let chunk = random_bytes(dtype, chunk_elems.min(max_elems), seed);
    let mut off = 0;
    while off < bytes {
        let len = chunk.len().min(bytes - off);
        let mut view = buf.slice_mut(off..off + len);
        stream
            .memcpy_htod(&chunk[..len], &mut view)
            .map_err(RuntimeError::from)?;
        off += len;
    }
    Ok(())
}

fn ptr<T>(s: &CudaSlice<T>, stream: &CudaStream) -> u64 {
    s.device_ptr(stream).0
}

impl Buffers {
    pub(super) fn new(
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
        for (i, buf) in [&mut prefix, &mut suffix].into_iter().enumerate() {
            fill_random(stream, buf, dtype, 0x9e37 + i as u64)?;
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
            pristine: None,
        })
    }

    pub(super) fn args(
        &self,
        stream: &CudaStream,
        t: usize,
        h: usize,
        d: usize,
        n: Option<usize>,
    ) -> MergeArgs {
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
            output: buf(ptr(&self.output, stream)),
            output_lse: Some(lbuf(ptr(&self.output_lse, stream))),
            prefix: buf(ptr(&self.prefix, stream)),
            prefix_lse: lbuf(ptr(&self.prefix_lse, stream)),
            suffix: buf(ptr(&self.suffix, stream)),
            suffix_lse: lbuf(ptr(&self.suffix_lse, stream)),
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

    pub(super) fn flush_l2(&self, stream: &CudaStream) -> Result<(), RuntimeError> {
        let (p, _s) = self.flush.device_ptr(stream);
        // SAFETY: writes inside our own 512 MB allocation.
        unsafe { result::memset_d8_async(p, 1, self.flush.len(), stream.cu_stream()) }
            .map_err(RuntimeError::from)
    }

    /// The producer's ranges for a `t x h x d` merge: (source, destination, bytes) for the
    /// prefix, the suffix and both lse, each from its pristine copy (made on first use, on the
    /// buffers' own `stream`, which is synchronized before returning).
    pub(super) fn producer_ranges(
        &mut self,
        stream: &Arc<CudaStream>,
        t: usize,
        h: usize,
        d: usize,
    ) -> Result<[(u64, u64, u64); 4], RuntimeError> {
        if self.pristine.is_none() {
            let copies = [
                stream.clone_dtod(&self.prefix)?,
                stream.clone_dtod(&self.suffix)?,
                copy_lse(stream, &self.prefix_lse)?,
                copy_lse(stream, &self.suffix_lse)?,
            ];
            stream.synchronize()?;
            self.pristine = Some(copies);
        }
        let Some(src) = self.pristine.as_ref() else {
            return Err(RuntimeError::Bench("no pristine inputs".into()));
        };
        let rows = (t * h) as u64;
        let row_bytes = rows * (d as u64) * u64::from(self.dtype.size_bytes());
        let dst = [
            ptr(&self.prefix, stream),
            ptr(&self.suffix, stream),
            ptr(&self.prefix_lse, stream),
            ptr(&self.suffix_lse, stream),
        ];
        let bytes = [row_bytes, row_bytes, rows * 4, rows * 4];
        Ok(std::array::from_fn(|i| {
            (ptr(&src[i], stream), dst[i], bytes[i])
        }))
    }
}

/// An lse buffer's bytes, copied.
fn copy_lse(stream: &Arc<CudaStream>, lse: &CudaSlice<f32>) -> Result<CudaSlice<u8>, RuntimeError> {
    let bytes = lse.len() * 4;
    // SAFETY: written in full by the copy below before anything reads it.
    let out = unsafe { stream.alloc::<u8>(bytes) }?;
    let (src, dst) = (ptr(lse, stream), ptr(&out, stream));
    // SAFETY: both allocations hold `bytes` bytes.
    unsafe { result::memcpy_dtod_async(dst, src, bytes, stream.cu_stream()) }?;
    Ok(out)
}

/// The buffers for `dtype`, reallocated (the old ones freed first) when the dtype changes.
pub(super) fn buffers_for<'a>(
    current: &'a mut Option<Buffers>,
    stream: &Arc<CudaStream>,
    dtype: Dtype,
    max_elems: usize,
    max_rows: usize,
) -> Result<&'a mut Buffers, RuntimeError> {
    if current.as_ref().map(|b| b.dtype) != Some(dtype) {
        drop(current.take());
        *current = Some(Buffers::new(stream, dtype, max_elems, max_rows)?);
    }
    current
        .as_mut()
        .ok_or_else(|| RuntimeError::Bench("no buffers".into()))
}

/// The copy's buffers (bench only): `a` the copy's source, `b` its destination, `c` the pristine
/// random bytes the hot mode's producer rewrites `a` from. Grown when a larger copy is asked.
pub(super) struct CopyBuffers {
    a: CudaSlice<u8>,
    b: CudaSlice<u8>,
    c: CudaSlice<u8>,
}

impl CopyBuffers {
    pub(super) fn new(stream: &Arc<CudaStream>, bytes: usize) -> Result<CopyBuffers, RuntimeError> {
        let bytes = bytes.div_ceil(16).max(1) * 16;
        // SAFETY: `c` is filled here, `a` copied from it, `b` is only written.
        let alloc = |n: usize| unsafe { stream.alloc::<u8>(n) }.map_err(RuntimeError::from);
        let (a, b, mut c) = (alloc(bytes)?, alloc(bytes)?, alloc(bytes)?);
        fill_random(stream, &mut c, Dtype::Bf16, 0xc0b1)?;
        let (pa, pc) = (ptr(&a, stream), ptr(&c, stream));
        // SAFETY: both hold `bytes` bytes.
        unsafe { result::memcpy_dtod_async(pa, pc, bytes, stream.cu_stream()) }?;
        stream.synchronize()?;
        Ok(CopyBuffers { a, b, c })
    }

    /// (source, destination, pristine) addresses, for a copy of at most `self.len()` bytes.
    pub(super) fn ptrs(&self, stream: &CudaStream) -> (u64, u64, u64) {
        (
            ptr(&self.a, stream),
            ptr(&self.b, stream),
            ptr(&self.c, stream),
        )
    }

    pub(super) fn len(&self) -> usize {
        self.a.len()
    }
}
