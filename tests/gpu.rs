//! GPU suite: every generated kernel against the float64 reference, on poisoned outputs.
//! Skips with a message where no CUDA driver is present (CI). On a GPU machine:
//! `scripts/gpu-check.sh` (see docs/GPU-VERIFICATION.md).
//!
//! Environment: MLA_GEN_GPU_KERNELS = the folder to check in place of the repo's generated/;
//! MLA_GEN_GPU_EXTRA = one more generated folder (token-major, no-threshold, no-lse
//! and odd head sizes, from tests/gpu-extra.toml); MLA_GEN_GPU_QUICK = 1 for the small subset run
//! under compute-sanitizer; MLA_GEN_GPU_REPORT = a file to append the counts to;
//! MLA_GEN_GPU_SHARD = i/n to run the merge suite on every n-th kernel only, starting at the i-th
//! (the whole suite outgrew one call of the GPU machine's time limit; same cases and seeds).
//!
//! This file holds the tests and the suite's loop; tests/gpu/ the rest: one file per family (a
//! case against the reference, and the options the suite cycles through), common.rs (the GPU,
//! folders, report, device buffers) and data.rs (random inputs, poison, layouts, the output
//! checks the families share).
#![cfg(feature = "runtime")]

#[path = "gpu/common.rs"]
mod common;
#[path = "gpu/data.rs"]
mod data;
#[path = "gpu/mask_empty_context_lse.rs"]
mod mask_empty_context_lse;
#[path = "gpu/merge_attn_states.rs"]
mod merge_attn_states;
#[path = "gpu/merge_state_in_place.rs"]
mod merge_state_in_place;
#[path = "gpu/merge_states.rs"]
mod merge_states;

use std::path::PathBuf;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use rayon::prelude::*;

use mla_gen::dtype::Dtype;
use mla_gen::host::manifest::ManifestView;
use mla_gen::reference::{self, Layout, LseBase};
use mla_gen::runtime::{DeviceBuffer, Kernel, MergeArgs, Runtime};
use mla_gen::spec::Family;

use common::*;
use data::padded_layouts;
use merge_attn_states::{run_case, takes_only_all_context};

#[test]
fn every_ptx_and_cubin_loads() {
    let Some(ctx) = gpu() else { return };
    let dir = dir_of(None).unwrap();
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    ctx.bind_to_thread().unwrap();
    let (mut ok, mut failed) = (0, Vec::new());
    for k in manifest["kernels"].as_array().unwrap() {
        for a in k["archs"].as_array().unwrap() {
            let arch = a["arch"].as_str().unwrap();
            let cc = ctx.compute_capability().unwrap();
            let dev = format!("sm_{}{}", cc.0, cc.1);
            // PTX JITs on its own architecture and newer ones (sm_100 PTX does not on an H200);
            // a CUBIN loads only on its own architecture family. (An arch of a `ptx = "newest"`
            // spec, such as the default's sm_80 and sm_90, has no PTX.)
            let number = |a: &str| -> u32 {
                a.trim_start_matches(|c: char| !c.is_ascii_digit())
                    .trim_end_matches('a')
                    .parse()
                    .unwrap()
            };
            let mut files = Vec::new();
            if let Some(ptx) = a["ptx"]["file"].as_str() {
                if number(arch) <= number(&dev) {
                    files.push(ptx.to_string());
                }
            }
            if arch == dev {
                files.push(a["cubin"]["file"].as_str().unwrap().to_string());
            }
            for f in files {
                let mut image = std::fs::read(dir.join(&f)).unwrap();
                if f.ends_with(".ptx") {
                    image.push(0);
                }
                // SAFETY: a complete image, alive for the call.
                match unsafe { cudarc::driver::result::module::load_data(image.as_ptr().cast()) } {
                    Ok(m) => {
                        ok += 1;
                        unsafe { cudarc::driver::result::module::unload(m) }.unwrap();
                    }
                    Err(e) => failed.push(format!("{f}: {e:?}")),
                }
            }
        }
    }
    report(&format!(
        "module load (cuModuleLoadData): {ok} loaded, {} failed{}",
        failed.len(),
        failed
            .iter()
            .map(|f| format!("\n  {f}"))
            .collect::<String>()
    ));
    assert!(failed.is_empty());
    assert!(ok > 0);
}

/// No GPU needed: the bases read from the variant fields of generated/manifest.json agree with
/// what hosts select by (the `select` block names `lse_base = "2"` for base 2 alone), and the
/// default has kernels of both bases, so the suite runs base-2 kernels against their reference.
#[test]
fn lse_bases_come_from_the_variant_fields() {
    let dir = generated_dir();
    let path = dir.join("manifest.json");
    let manifest = ManifestView::parse(&path, &std::fs::read(&path).unwrap()).unwrap();
    let bases = lse_bases(&dir);
    let mut count = [0usize; 2];
    for k in &manifest.kernels {
        let base = bases.named(&k.name);
        let selected = k.select.get("lse_base").map(String::as_str);
        assert_eq!(base == LseBase::Two, selected == Some("2"), "{}", k.name);
        count[usize::from(base == LseBase::Two)] += 1;
    }
    assert!(
        count[0] > 0 && count[1] > 0,
        "kernels of base e, of base 2: {count:?}"
    );
}

#[derive(Default)]
struct Counts {
    cases: usize,
    passed: usize,
    failed: Vec<String>,
    elements: u64,
    /// Kernels of FlashInfer's base-2 lse among those run.
    base2: usize,
}

/// Run one case of kernel `k` (lse in `base`), whatever its family; `case` picks the options it
/// cycles through.
fn run_any(
    k: &Kernel,
    base: LseBase,
    stream: &Arc<CudaStream>,
    t: usize,
    h: usize,
    case: usize,
    seed: u64,
) -> (String, Result<u64, String>) {
    match k.meta.variant.family {
        Family::MergeAttnStates => {
            merge_attn_states::suite_case(k, base, stream, (t, h), case, seed)
        }
        Family::MergeStates { num_states } => {
            merge_states::suite_case(k, base, stream, (t, h), num_states, case, seed)
        }
        Family::MaskEmptyContextLse => {
            mask_empty_context_lse::suite_case(k, stream, (t, h), case, seed)
        }
        Family::MergeStateInPlace { mask } => {
            merge_state_in_place::suite_case(k, base, stream, (t, h), mask, case, seed)
        }
        // A family added to mla-gen fails here until it gets its check.
        other => (
            format!("{other:?}"),
            Err(format!("no GPU check for the family {other:?}")),
        ),
    }
}

/// The most elements (rows x head size) one case takes: a (T, H) case past it takes fewer heads,
/// the most that fit (4096 tokens: 128 heads at D = 64, 64 at D = 128, 14 at D = 576; 613
/// tokens: 95 heads at D = 576). The host's random inputs and float64 reference are the suite's
/// time, and uncapped the whole suite (857 kernels) needs about a session of the GPU machine,
/// half of it in the 4096 x 128 cases of the large head sizes (docs/HISTORY.md, session 14).
/// Capped, each case still spans up to 2^18 rows (thousands of blocks: every block order and
/// index path), and the odd head counts exercise the flat rows' division.
const MAX_CASE_ELEMENTS: usize = 1 << 25;

fn heads_within_cap(t: usize, h: usize, head_size: usize) -> usize {
    if t * h * head_size.max(1) <= MAX_CASE_ELEMENTS {
        h
    } else {
        (MAX_CASE_ELEMENTS / (t * head_size.max(1))).max(1)
    }
}

fn suite(dirs: &[PathBuf], tokens: &[usize], heads: &[usize]) -> Counts {
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.default_stream();
    let mut c = Counts::default();
    let (shard, shards) = shard();
    let started = std::time::Instant::now();
    let mut seen = 0usize;
    for dir in dirs {
        let rt =
            Runtime::load(ctx.clone(), dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let bases = lse_bases(dir);
        for (ki, k) in rt.kernels().iter().enumerate() {
            seen += 1;
            if (seen - 1) % shards != shard - 1 {
                continue;
            }
            let base = bases.of(k);
            if base == LseBase::Two {
                c.base2 += 1;
            }
            if seen % 100 < shards {
                say(&format!(
                    "  ... kernel {seen} ({}), {} cases, {:.0}s",
                    dir.display(),
                    c.cases,
                    started.elapsed().as_secs_f64()
                ));
            }
            let mut case = 0usize;
            // Cases within the kernel's own bounds (the `_flat` twins: few heads, some many
            // tokens; past the fewest by t, so the last block is partial as before).
            let (fewest, most) = (fewest_tokens(k), most_heads(k));
            for &t in tokens {
                let t = if t < fewest { fewest + t } else { t };
                for &h in heads {
                    let h = heads_within_cap(t, h, k.meta.variant.head_size as usize).min(most);
                    let which = case + ki;
                    case += 1;
                    let seed = 0x5eed
                        ^ ((ki as u64) << 32)
                        ^ ((t as u64) << 8)
                        ^ h as u64
                        ^ (case as u64) << 48;
                    c.cases += 1;
                    let (options, result) = run_any(k, base, &stream, t, h, which, seed);
                    match result {
                        Ok(n) => {
                            c.passed += 1;
                            c.elements += n;
                        }
                        Err(why) => c.failed.push(format!(
                            "{} T={t} H={h} {options} seed={seed:#x}: {why}",
                            k.meta.name
                        )),
                    }
                }
            }
        }
    }
    c
}

#[test]
fn every_kernel_matches_the_float64_reference() {
    let Some(_ctx) = gpu() else { return };
    let quick = std::env::var_os("MLA_GEN_GPU_QUICK").is_some();
    let (tokens, heads): (&[usize], &[usize]) = if quick {
        (&[1, 7, 613], &[1, 4])
    } else {
        (&[1, 7, 256, 613, 4096], &[1, 4, 16, 128])
    };
    let mut dirs = vec![dir_of(None).unwrap()];
    match dir_of(Some("MLA_GEN_GPU_EXTRA")) {
        Some(extra) => dirs.push(extra),
        None => say(
            "note: MLA_GEN_GPU_EXTRA unset: token-major / no-threshold / odd head sizes not run",
        ),
    }
    let started = std::time::Instant::now();
    let c = suite(&dirs, tokens, heads);
    report(&format!(
        "merge suite{}{}: {} cases, {} passed, {} failed ({:.2e} output elements checked; {} kernels of base-2 lse among them) in {:.0}s",
        if quick { " (quick subset)" } else { "" },
        match shard() {
            (_, 1) => String::new(),
            (i, n) => format!(" (shard {i} of {n})"),
        },
        c.cases,
        c.passed,
        c.failed.len(),
        c.elements as f64,
        c.base2,
        started.elapsed().as_secs_f64()
    ));
    for f in c.failed.iter().take(20) {
        report(&format!("  FAILED {f}"));
    }
    assert!(c.failed.is_empty());
    assert!(c.cases > 0, "the merge suite ran no case");
}

/// Boundary shapes, run under compute-sanitizer memcheck by scripts/gpu-check.sh: one token and
/// one head, one head of many tokens, the last row ending exactly at its buffer's end (every
/// buffer is allocated to its extent), and token strides far larger than a row.
#[test]
fn boundary_shapes_stay_inside_their_buffers() {
    let Some(ctx) = gpu() else { return };
    let stream = ctx.default_stream();
    let dir = dir_of(None).unwrap();
    let rt = Runtime::load(ctx.clone(), &dir).unwrap();
    let bases = lse_bases(&dir);
    let (mut cases, mut failed) = (0usize, Vec::new());
    // The pairwise merges (run_case's family), either base; the other families' bounds are the
    // merge suite's.
    let pairwise = |k: &&Arc<Kernel>| k.meta.variant.family == Family::MergeAttnStates;
    for k in rt.kernels().iter().filter(pairwise) {
        let base = bases.of(k);
        let d = k.meta.variant.head_size as usize;
        let vec = vec_elems(k);
        let wide = |h: usize, gap: usize| Layout {
            head_stride: d,
            token_stride: h * d + gap * vec,
        };
        for (t, h, layouts) in [
            (1, 1, None),
            (1, 1, Some((wide(1, 4096), wide(1, 1), wide(1, 65536)))),
            (1, 128, None),
            (4097, 1, None),
            (3, 2, Some((wide(2, 1 << 20), wide(2, 0), wide(2, 1 << 18)))),
        ] {
            // A dense specialization takes dense tensors only: its own cases are the dense ones.
            if k.meta.variant.dense && layouts.is_some() {
                continue;
            }
            // The `_flat` twins take few heads (their most, not 128), some many tokens.
            let (t, h) = (t.max(fewest_tokens(k)), h.min(most_heads(k)));
            // A kernel without the threshold takes none (it merges every token); an all-context
            // twin takes only n = T.
            let thresholds: &[Option<usize>] = if k.meta.variant.prefix_threshold {
                &[None, Some(0), Some(t)]
            } else {
                &[None]
            };
            for &threshold in thresholds {
                if threshold == Some(0) && t > 0 && takes_only_all_context(k) {
                    continue;
                }
                cases += 1;
                let seed = 0xb0 ^ ((t * 131 + h) as u64) ^ ((cases as u64) << 20);
                if let Err(why) = run_case(k, base, &stream, t, h, threshold, true, seed, layouts) {
                    failed.push(format!("{} T={t} H={h} {threshold:?}: {why}", k.meta.name));
                }
            }
        }
    }
    report(&format!(
        "boundary shapes: {cases} cases, {} passed, {} failed",
        cases - failed.len(),
        failed.len()
    ));
    for f in failed.iter().take(10) {
        report(&format!("  FAILED {f}"));
    }
    assert!(failed.is_empty());
    assert!(cases > 0, "no boundary shape ran");
}

/// Strides past 2^31 elements: the general pairwise kernel's 64-bit body (its 32-bit one serves
/// every call whose sizes and strides stay below 2^31). One bf16 and one f32 kernel of the
/// default folder, prefix rows 2^31 + 64 elements apart (a 4 or 8 GB buffer), against the float64
/// reference with the other tensors dense and padded.
#[test]
fn strides_past_2_31_take_the_64_bit_path() {
    let Some(ctx) = gpu() else { return };
    let stream = ctx.default_stream();
    let dir = dir_of(None).unwrap();
    let rt = Runtime::load(ctx.clone(), &dir).unwrap();
    let bases = lse_bases(&dir);
    let mut cases = 0;
    for name in [
        "merge_attn_states_bf16_d128_thr_lse",
        "merge_attn_states_f32_d64_thr_lse",
    ] {
        let Some(k) = rt.kernel(name) else {
            say(&format!("note: {name} not in the folder: skipped"));
            continue;
        };
        let d = k.meta.variant.head_size as usize;
        let far = Layout {
            head_stride: d,
            token_stride: (1usize << 31) + 64,
        };
        let (_, _, padded_out) = padded_layouts(d, 1, vec_elems(k));
        for threshold in [None, Some(1)] {
            cases += 1;
            let layouts = (far, Layout::contiguous(1, d), padded_out);
            run_case(
                k,
                bases.of(k),
                &stream,
                2,
                1,
                threshold,
                true,
                0x64b1 ^ cases,
                Some(layouts),
            )
            .unwrap_or_else(|why| panic!("{name} threshold={threshold:?}: {why}"));
        }
    }
    // The default folder holds both kernels; another (MLA_GEN_GPU_KERNELS) may hold neither.
    assert!(
        cases > 0 || std::env::var_os("MLA_GEN_GPU_KERNELS").is_some(),
        "the default folder lacks both 64-bit-path kernels: the test ran nothing"
    );
    report(&format!("strides past 2^31: {cases} cases passed"));
}

/// The safe `Launch` refuses a buffer the kernel writes passed as an input (a shared borrow,
/// whose use cudarc would record as a read), before any check or launch.
#[test]
fn a_written_buffer_passed_as_an_input_is_refused() {
    let Some(ctx) = gpu() else { return };
    let stream = ctx.default_stream();
    let dir = dir_of(None).unwrap();
    let rt = Runtime::load(ctx.clone(), &dir).unwrap();
    let k = rt
        .kernels()
        .iter()
        .find(|k| k.meta.variant.family == Family::MergeAttnStates)
        .expect("a merge_attn_states kernel");
    let out: CudaSlice<f32> = stream.alloc_zeros(64).unwrap();
    let mut l = mla_gen::runtime::Launch::new(k, &stream);
    l.input("output", &out);
    let e = l
        .run()
        .expect_err("output passed with Launch::input")
        .to_string();
    assert!(e.contains("pass it with Launch::output"), "{e}");
}

/// The FP8 conversion against the reference on every float32 bit pattern (2^32), through the
/// per-tensor FP8 kernel's copy path: threshold 0, so every row is the suffix multiplied by the
/// reciprocal of the scale 1.0 (exact for every float32, subnormals included; NaN stays NaN) and
/// converted. On sm_89+ this also checks the NaN fix-up after the conversion instruction. Runs each folder of
/// MLA_GEN_GPU_FP8 (colon-separated): scripts/gpu-check.sh builds one for compute_80 (the integer
/// conversion, JIT-compiled here) and one for sm_90 (the cvt.rn.satfinite instruction).
#[test]
fn fp8_conversion_matches_the_reference_on_every_float32() {
    let Some(ctx) = gpu() else { return };
    let Some(dirs) = std::env::var_os("MLA_GEN_GPU_FP8") else {
        say("SKIPPED fp8_conversion test: MLA_GEN_GPU_FP8 unset (scripts/gpu-check.sh sets it)");
        return;
    };
    let stream = ctx.default_stream();
    const D: usize = 128;
    const H: usize = 16;
    const CHUNK: usize = 1 << 28; // float32 patterns per launch (1 GiB in, 256 MiB out)
    let t = CHUNK / (H * D);
    for dir in std::env::split_paths(&dirs) {
        let rt = Runtime::load(ctx.clone(), &dir).unwrap();
        let k = rt
            .kernels()
            .iter()
            .find(|k| {
                let v = &k.meta.variant;
                v.dtype == Dtype::F32
                    && v.head_size == D as u32
                    && v.output == mla_gen::variant::OutputKind::Fp8E4m3
                    && v.prefix_threshold
            })
            .unwrap_or_else(|| panic!("{}: no f32 d128 per-tensor FP8 kernel", dir.display()));
        let scale: CudaSlice<f32> = stream.clone_htod(&[1.0f32]).unwrap();
        let prefix: CudaSlice<u32> = stream.alloc_zeros(CHUNK).unwrap();
        let lse: CudaSlice<f32> = stream.alloc_zeros(t * H).unwrap();
        let row_major = Layout {
            token_stride: H * D,
            head_stride: D,
        };
        let (mut checked, mut mismatches, mut first) = (0u64, 0u64, None);
        for chunk in 0..(1usize << 32) / CHUNK {
            let base = (chunk * CHUNK) as u32;
            let bits: Vec<u32> = (0..CHUNK as u32).map(|i| base.wrapping_add(i)).collect();
            let suffix: CudaSlice<u32> = stream.clone_htod(&bits).unwrap();
            let out: CudaSlice<u8> = stream.clone_htod(&vec![0xffu8; CHUNK]).unwrap();
            let buf = |p: u64, len: usize, dtype: Dtype| DeviceBuffer { ptr: p, len, dtype };
            let args = MergeArgs {
                output: buf(raw(&out, &stream), CHUNK, Dtype::Fp8E4m3),
                output_lse: None,
                prefix: buf(raw(&prefix, &stream), CHUNK, Dtype::F32),
                prefix_lse: buf(raw(&lse, &stream), t * H, Dtype::F32),
                suffix: buf(raw(&suffix, &stream), CHUNK, Dtype::F32),
                suffix_lse: buf(raw(&lse, &stream), t * H, Dtype::F32),
                output_scale: Some(buf(raw(&scale, &stream), 1, Dtype::F32)),
                output_scales: None,
                num_tokens: t,
                num_heads: H,
                output_layout: row_major,
                prefix_layout: row_major,
                suffix_layout: row_major,
                prefill_tokens_with_context: Some(0),
            };
            // SAFETY: this chunk's allocations above, alive until the copy back synchronizes.
            unsafe { k.launch(&stream, &args.args()) }.unwrap();
            let codes: Vec<u8> = stream.clone_dtoh(&out).unwrap();
            let wrong: Vec<(u32, u8)> = bits
                .par_iter()
                .zip(codes.par_iter())
                .filter(|(&b, &c)| reference::fp8::e4m3_from_f32(f32::from_bits(b)) != c)
                .map(|(&b, &c)| (b, c))
                .collect();
            checked += CHUNK as u64;
            mismatches += wrong.len() as u64;
            if first.is_none() {
                first = wrong.first().copied();
            }
        }
        report(&format!(
            "fp8 conversion, {} ({}): {checked} float32 patterns, {mismatches} differ from the reference{}",
            k.meta.name,
            dir.display(),
            first.map_or(String::new(), |(b, c)| format!(
                "; first: {b:#010x} gave {c:#04x}, want {:#04x}",
                reference::fp8::e4m3_from_f32(f32::from_bits(b))
            ))
        ));
        assert_eq!(mismatches, 0);
    }
}
