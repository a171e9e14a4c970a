//! CPU-only cost of the launch check `mla-gen bench` times on its host line (`k.check(&args.args())`
//! for T = 1, H = 1, D = 128 bf16 with output lse and threshold 1), without a GPU: the Plan is
//! built from generated/manifest.json and the buffers are fake addresses. Prints the median of
//! 20 rounds of 5000 calls; a measurement, not a test.
//!
//! `cargo run --release --no-default-features --features runtime --example check_cost`

use std::hint::black_box;
use std::time::Instant;

use mla_gen::dtype::Dtype;
use mla_gen::runtime::{DeviceBuffer, Layout, ManifestView, MergeArgs, Plan};

const KERNEL: &str = "merge_attn_states_bf16_d128_thr_lse";
const ROUNDS: usize = 20;
const CALLS: usize = 5000;

/// Median microseconds per call of `f` over ROUNDS rounds of CALLS calls.
fn median_us(mut f: impl FnMut()) -> f64 {
    let mut rounds: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..CALLS {
                f();
            }
            start.elapsed().as_secs_f64() * 1e6 / CALLS as f64
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    rounds[ROUNDS / 2]
}

fn main() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/generated/manifest.json");
    let text = std::fs::read(path).expect("generated/manifest.json");
    let manifest = ManifestView::parse(std::path::Path::new(path), &text).expect("manifest");
    let kernel = manifest.kernels.iter().find(|k| k.name == KERNEL);
    let plan: Plan = kernel
        .expect("the kernel is in the manifest")
        .plan()
        .expect("plan");
    // As the bench's buffers: sized for a large shape, the call T = 1, H = 1.
    let elems = 1 << 20;
    let buf = |ptr: u64, len: usize, dtype| DeviceBuffer { ptr, len, dtype };
    let layout = Layout::contiguous(1, 128);
    let args = MergeArgs {
        output: buf(0x7f00_0000_0000, elems, Dtype::Bf16),
        output_lse: Some(buf(0x7f00_1000_0000, elems / 128, Dtype::F32)),
        prefix: buf(0x7f00_2000_0000, elems, Dtype::Bf16),
        prefix_lse: buf(0x7f00_3000_0000, elems / 128, Dtype::F32),
        suffix: buf(0x7f00_4000_0000, elems, Dtype::Bf16),
        suffix_lse: buf(0x7f00_5000_0000, elems / 128, Dtype::F32),
        output_scale: None,
        output_scales: None,
        num_tokens: 1,
        num_heads: 1,
        output_layout: layout,
        prefix_layout: layout,
        suffix_layout: layout,
        prefill_tokens_with_context: Some(1),
    };
    plan.check(&args.args()).expect("the bench's call passes");

    let named = args.args();
    let naming = median_us(|| {
        black_box(black_box(&args).args());
    });
    let check_only = median_us(|| {
        black_box(plan.check(black_box(&named)).is_ok());
    });
    let bench_call = median_us(|| {
        black_box(plan.check(&black_box(&args).args()).is_ok());
    });
    // Two layouts in turn: no call has the layout of the one before.
    let mut other = args.clone();
    other.num_tokens = 2;
    let mut turn = false;
    let alternating = median_us(|| {
        turn = !turn;
        let call = if turn { &args } else { &other };
        black_box(plan.check(&black_box(call).args()).is_ok());
    });
    println!("{KERNEL}, T=1 H=1 D=128, threshold 1, median of {ROUNDS} x {CALLS} calls:");
    for (what, us) in [
        ("args() alone", naming),
        ("Plan::check of prebuilt args", check_only),
        ("args() + Plan::check (the bench's call)", bench_call),
        ("the same, T = 1 and 2 in turn", alternating),
    ] {
        println!("  {:<42}{us:.3} us", format!("{what}:"));
    }
}
