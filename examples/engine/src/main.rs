//! Merge two attention states (into bf16, then into FP8 with per-token-group scales), then four
//! (the kernel picked at run time by `select`), then mask the lse of requests without context
//! and merge in place, on the GPU through the module `build.rs` generated; check every element
//! against mla-gen's float64 reference. Prints "N passed, M failed".

use std::path::Path;
use std::process::ExitCode;

use mla_gen::cudarc::driver::CudaContext;
use mla_gen::dtype::Dtype;
use mla_gen::half::bf16;
use mla_gen::reference;
use mla_gen::runtime::{
    self, Call, Given, InPlaceShape, Launch, ManifestView, MaskLseShape, MergeShape, ScaleLayout,
    Selector, StatesShape,
};

mod kernels {
    include!(concat!(env!("OUT_DIR"), "/mla_gen_kernels.rs"));
}

const T: usize = 613;
const H: usize = 16;
const D: usize = 128;
const K: usize = 4;

/// The K-way step's call as selection sees it: every buffer the launch passes, by name, with its
/// element type and sizes (a buffer left out is a buffer the kernel would not get).
const KWAY_CALL: Call<'static> = Call {
    family: "merge_states",
    args: &[
        (
            "output",
            Given::buffer("bf16", &[T as i64, H as i64, D as i64]),
        ),
        ("output_lse", Given::buffer("f32", &[T as i64, H as i64])),
        (
            "states",
            Given::buffer("bf16", &[T as i64, K as i64, H as i64, D as i64]),
        ),
        (
            "states_lse",
            Given::buffer("f32", &[T as i64, K as i64, H as i64]),
        ),
    ],
    options: &[],
};

/// Every kernel this example picks at run time with `select`, replayed from the manifest on a
/// machine without a GPU (CI), so that a call no kernel serves fails there too.
const SELECTIONS: &[(&str, Call<'static>)] = &[("the K-way step", KWAY_CALL)];

fn main() -> ExitCode {
    if !runtime::driver_present() {
        let failed = replay_selections();
        println!(
            "{} passed, {failed} failed: selections replayed without a GPU",
            SELECTIONS.len() - failed
        );
        eprintln!("SKIPPED: no CUDA driver on this machine; the GPU part runs on a GPU machine");
        return if failed == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
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

/// Select every call of [`SELECTIONS`] from the embedded manifest, as `run` does on the GPU;
/// prints why for each that no kernel serves and returns how many.
fn replay_selections() -> usize {
    let manifest = match ManifestView::parse(Path::new("engine.toml"), kernels::MANIFEST.as_bytes())
    {
        Ok(m) => m,
        Err(e) => {
            eprintln!("error: {e}");
            return SELECTIONS.len();
        }
    };
    let selector = match Selector::of_manifest(&manifest) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: the manifest's kernels: {e}");
            return SELECTIONS.len();
        }
    };
    let mut failed = 0;
    for (step, call) in SELECTIONS {
        match selector.serving(call) {
            Ok(i) => println!("{step}: {}", selector.name(i)),
            Err(why) => {
                eprintln!("error: {step}: {why}");
                failed += 1;
            }
        }
    }
    failed
}

fn run() -> Result<usize, Box<dyn std::error::Error>> {
    let ctx = CudaContext::new(0)?;
    let stream = ctx.default_stream();
    // Every kernel loaded once, one handle each.
    let k = kernels::load(ctx.clone())?;

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
    // Views work as well as whole slices: the suffix as a view of all its rows.
    k.merge_attn_states_bf16_d128_thr_lse(
        &stream,
        &mut d_out,
        Some(&mut d_olse),
        &d_prefix,
        &d_plse,
        &d_suffix.slice(..),
        &d_slse,
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
    // The same two states into FP8 e4m3 codes with one UE8M0 scale per 64 elements, the scales
    // column-major (scale of group gi of token t at gi * T + t).
    const G: usize = 64;
    let groups = H * D / G;
    let mut d_codes = stream.clone_htod(&vec![0xffu8; T * H * D])?;
    let mut d_scales = stream.clone_htod(&vec![f32::NAN; T * groups])?;
    k.merge_attn_states_bf16_d128_thr_lse_fp8g64_ue8m0(
        &stream,
        &mut d_codes,
        None,
        &d_prefix,
        &d_plse,
        &d_suffix,
        &d_slse,
        &mut d_scales,
        MergeShape::contiguous(T, H, D),
        ScaleLayout {
            token_stride: 1,
            group_stride: T,
        },
        Some(n),
    )?;
    let codes = stream.clone_dtoh(&d_codes)?;
    let scales = stream.clone_dtoh(&d_scales)?;
    for t in 0..T {
        for h in 0..H {
            let li = reference::lse_index(true, T, H, t, h);
            let row = reference::merge_row(prefix_lse[li], suffix_lse[li], t < n);
            for g in 0..D / G {
                let scale = scales[(h * D / G + g) * T + t];
                let first = (t * H + h) * D + g * G;
                let values: Vec<f64> = (first..first + G)
                    .map(|i| row.value(f64::from(prefix[i]), f64::from(suffix[i])))
                    .collect();
                if reference::fp8_group_scale_matches(&row, &values, true, scale) {
                    passed += 1
                } else {
                    failed += 1
                }
                for i in first..first + G {
                    let (p, s) = (f32::from(prefix[i]), f32::from(suffix[i]));
                    if reference::fp8_element_matches(&row, p, s, scale, codes[i]) {
                        passed += 1
                    } else {
                        failed += 1
                    }
                }
            }
        }
    }
    // Four states per token, [T, 4, H, D], merged in one pass by the kernel `select` picks for
    // this call at run time (from the manifest's contracts), launched through the generic `Launch`.
    let states: Vec<bf16> = (0..T * K * H * D)
        .map(|_| bf16::from_f64(uniform() * 8.0 - 4.0))
        .collect();
    let states_lse: Vec<f32> = (0..T * K * H)
        .map(|_| (uniform() * 30.0 - 15.0) as f32)
        .collect();
    let d_states = stream.clone_htod(&states)?;
    let d_states_lse = stream.clone_htod(&states_lse)?;
    let mut d_out = stream.clone_htod(&vec![bf16::NAN; T * H * D])?;
    let mut d_olse = stream.clone_htod(&vec![f32::NAN; T * H])?;
    let kway = k.select(&KWAY_CALL)?;
    let mut launch = Launch::new(kway, &stream);
    launch
        .output("output", &mut d_out)
        .output("output_lse", &mut d_olse)
        .input("states", &d_states)
        .input("states_lse", &d_states_lse)
        .shape(&StatesShape::contiguous(T, K, H, D));
    launch.run()?;
    let out = stream.clone_dtoh(&d_out)?;
    let out_lse = stream.clone_dtoh(&d_olse)?;
    for t in 0..T {
        for h in 0..H {
            let lse: Vec<f32> = (0..K).map(|k| states_lse[(t * K + k) * H + h]).collect();
            let row = reference::merge_states_row(&lse);
            for e in 0..D {
                let values: Vec<f64> = (0..K)
                    .map(|k| f64::from(states[((t * K + k) * H + h) * D + e]))
                    .collect();
                let got = f64::from(out[(t * H + h) * D + e]);
                if reference::states_element_matches(Dtype::Bf16, &row, &values, got) {
                    passed += 1
                } else {
                    failed += 1
                }
            }
            if reference::lse_matches(row.lse(), out_lse[t * H + h]) {
                passed += 1
            } else {
                failed += 1
            }
        }
    }
    // Two requests over the T tokens, the second without context: its prefix lse becomes -inf,
    // then prefix := merge(prefix, suffix) in place for the tokens the mask keeps (even ones).
    let split = T / 3;
    let query_start_loc = stream.clone_htod(&[0i32, split as i32, T as i32])?;
    let context_start_loc = stream.clone_htod(&[0i32, 100, 100])?;
    let mut d_state = stream.clone_htod(&prefix)?;
    let mut d_state_lse = stream.clone_htod(&prefix_lse)?;
    k.mask_empty_context_lse(
        &stream,
        &mut d_state_lse,
        &query_start_loc,
        &context_start_loc,
        MaskLseShape {
            num_requests: 2,
            num_tokens: T,
            num_heads: H,
        },
    )?;
    let mask: Vec<u8> = (0..T).map(|t| u8::from(t % 2 == 0)).collect();
    let d_mask = stream.clone_htod(&mask)?;
    k.merge_state_in_place_bf16_d128_mask(
        &stream,
        &mut d_state,
        &mut d_state_lse,
        &d_suffix,
        &d_slse,
        Some(&d_mask),
        InPlaceShape::contiguous(T, H, D),
    )?;
    let state = stream.clone_dtoh(&d_state)?;
    let state_lse = stream.clone_dtoh(&d_state_lse)?;
    let mut masked_lse = prefix_lse.clone();
    reference::mask_empty_context(
        &mut masked_lse,
        true,
        (T, H),
        &[0, split as i32, T as i32],
        &[0, 100, 100],
    );
    for (t, &keep) in mask.iter().enumerate() {
        for h in 0..H {
            let li = reference::lse_index(true, T, H, t, h);
            let row = reference::merge_row(masked_lse[li], suffix_lse[li], true);
            let kept = keep != 0;
            for e in 0..D {
                let i = (t * H + h) * D + e;
                let ok = if kept {
                    reference::element_matches(
                        Dtype::Bf16,
                        &row,
                        f64::from(prefix[i]),
                        f64::from(suffix[i]),
                        f64::from(state[i]),
                    )
                } else {
                    state[i].to_bits() == prefix[i].to_bits()
                };
                if ok {
                    passed += 1
                } else {
                    failed += 1
                }
            }
            let lse_ok = if kept {
                reference::lse_matches(row.lse(), state_lse[li])
            } else {
                state_lse[li].to_bits() == masked_lse[li].to_bits()
            };
            if lse_ok {
                passed += 1
            } else {
                failed += 1
            }
        }
    }
    println!("{passed} passed, {failed} failed");
    Ok(failed)
}
