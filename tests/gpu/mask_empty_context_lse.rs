//! The empty-context lse mask (mask_empty_context_lse) in the GPU suite: one case against the
//! reference mask, and the options the suite cycles through.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};

use mla_gen::dtype::Dtype;
use mla_gen::reference;
use mla_gen::runtime::{DeviceBuffer, Kernel, MaskLseArgs};

use crate::common::*;
use crate::data::*;

/// An lse-mask case: `requests` requests over the first ~90% of the tokens (some with no tokens),
/// ~40% with an empty context; the rest of the tokens belong to none. Masked (t, h) must read
/// -inf, every other lse value its exact bits.
fn run_mask_lse_case(
    k: &Kernel,
    stream: &Arc<CudaStream>,
    (t, h, requests): (usize, usize, usize),
    seed: u64,
) -> Result<u64, String> {
    let (qsl, csl) = start_locations(t, requests, seed);
    let (lse, _) = random_lse(t * h, seed ^ 0x77);
    let lse_dev: CudaSlice<f32> = stream.clone_htod(&lse).unwrap();
    let qsl_dev: CudaSlice<i32> = stream.clone_htod(&qsl).unwrap();
    let csl_dev: CudaSlice<i32> = stream.clone_htod(&csl).unwrap();
    let args = MaskLseArgs {
        lse: f32_buffer(raw(&lse_dev, stream), t * h),
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
    // SAFETY: this case's allocations above, alive until the synchronize.
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

/// One case of the suite: 1, 5, 64 or 1000 requests (at most one per token).
pub fn suite_case(
    k: &Kernel,
    stream: &Arc<CudaStream>,
    (t, h): (usize, usize),
    case: usize,
    seed: u64,
) -> (String, Result<u64, String>) {
    let requests = [1, 5, 64, 1000][case % 4].min(t);
    (
        format!("requests={requests}"),
        run_mask_lse_case(k, stream, (t, h, requests), seed),
    )
}
