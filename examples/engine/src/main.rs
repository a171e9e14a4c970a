//! Merge two attention states on the GPU through the bindings `build.rs` generated, and check
//! every element against mla-gen's float64 reference. Prints "N passed, M failed".

use std::process::ExitCode;

use mla_gen::cudarc::driver::CudaContext;
use mla_gen::dtype::Dtype;
use mla_gen::half::bf16;
use mla_gen::reference;
use mla_gen::runtime::{self, MergeShape, MergeSlices};

mod kernels {
    include!(concat!(env!("OUT_DIR"), "/mla_gen_kernels.rs"));
}

const T: usize = 613;
const H: usize = 16;
const D: usize = 128;

fn main() -> ExitCode {
    if !runtime::driver_present() {
        eprintln!("SKIPPED: no CUDA driver on this machine; run on a GPU machine");
        return ExitCode::SUCCESS;
    }
    match run() {
        Ok(0) => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<usize, Box<dyn std::error::Error>> {
    let ctx = CudaContext::new(0)?;
    let stream = ctx.default_stream();
    let rt = kernels::load(ctx.clone())?;

    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut uniform = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 11) as f64 / (1u64 << 53) as f64
    };
    let prefix: Vec<bf16> = (0..T * H * D)
        .map(|_| bf16::from_f64(uniform() * 8.0 - 4.0))
        .collect();
    let suffix: Vec<bf16> = (0..T * H * D)
        .map(|_| bf16::from_f64(uniform() * 8.0 - 4.0))
        .collect();
    let mut lse = |inf_share: f64| -> Vec<f32> {
        (0..T * H)
            .map(|_| {
                let u = uniform();
                if u < inf_share {
                    f32::INFINITY
                } else if u < 2.0 * inf_share {
                    f32::NEG_INFINITY
                } else {
                    (uniform() * 30.0 - 15.0) as f32
                }
            })
            .collect()
    };
    let (prefix_lse, suffix_lse) = (lse(0.1), lse(0.05));

    let d_prefix = stream.clone_htod(&prefix)?;
    let d_suffix = stream.clone_htod(&suffix)?;
    let d_plse = stream.clone_htod(&prefix_lse)?;
    let d_slse = stream.clone_htod(&suffix_lse)?;
    let mut d_out = stream.clone_htod(&vec![bf16::NAN; T * H * D])?;
    let mut d_olse = stream.clone_htod(&vec![f32::NAN; T * H])?;
    let n = T / 2;
    kernels::merge_attn_states_bf16_d128_thr_lse(
        &rt,
        &stream,
        MergeSlices {
            output: &mut d_out,
            output_lse: Some(&mut d_olse),
            prefix: &d_prefix,
            prefix_lse: &d_plse,
            suffix: &d_suffix,
            suffix_lse: &d_slse,
            output_scale: None,
        },
        MergeShape::contiguous(T, H, D),
        Some(n),
    )?;
    let out = stream.clone_dtoh(&d_out)?;
    let out_lse = stream.clone_dtoh(&d_olse)?;

    let (mut passed, mut failed) = (0usize, 0usize);
    for t in 0..T {
        for h in 0..H {
            let li = reference::lse_index(true, T, H, t, h);
            let row = reference::merge_row(prefix_lse[li], suffix_lse[li], t < n);
            for e in 0..D {
                let i = (t * H + h) * D + e;
                let ok = reference::element_matches(
                    Dtype::Bf16,
                    &row,
                    f64::from(prefix[i]),
                    f64::from(suffix[i]),
                    f64::from(out[i]),
                );
                if ok {
                    passed += 1
                } else {
                    failed += 1
                }
            }
            if reference::lse_matches(row.lse(), out_lse[li]) {
                passed += 1
            } else {
                failed += 1
            }
        }
    }
    println!("{passed} passed, {failed} failed");
    Ok(failed)
}
