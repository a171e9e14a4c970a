//! Every argument that could make a kernel touch memory outside its tensors is refused before
//! launch: the pairwise merge (merge_attn_states, its FP8 outputs) and the run-time keys of every
//! family; tests/launch_validation_families.rs has the K-way and in-place merges and the lse mask.
//! Runs without a GPU: validation reads only the manifest. The refusals come from the one generic
//! check (docs/MANIFEST.md "The check"); tests/contract.rs runs the shared table.
#![cfg(feature = "runtime")]

#[path = "launch_validation/common.rs"]
mod common;

use common::*;
use mla_gen::dtype::Dtype;
use mla_gen::reference::Layout;
use mla_gen::runtime::{KernelView, ManifestView, MergeArgs};

#[test]
fn a_valid_call_yields_params_in_abi_order() {
    let k = kernel("merge_attn_states_bf16_d128_thr_lse");
    let c = validate(&k, &good()).unwrap();
    let values = c.values();
    assert_eq!(values.len(), k.params.len());
    assert_eq!(values[0], 0x1000_0000);
    assert_eq!(*values.last().unwrap(), (T / 2) as u64);
    let per = |a: &mla_gen::contract::GridAxis| a.per_block as usize;
    let (x, y) = (
        T.div_ceil(per(&k.launch.grid_x)),
        H.div_ceil(per(&k.launch.grid_y)),
    );
    assert_eq!(c.grid, Some([x as u32, y as u32, 1]));
    assert_eq!(c.block_threads, k.launch.block_threads);
    // No threshold given: n = T. T = 0: nothing to launch.
    let mut a = good();
    a.prefill_tokens_with_context = None;
    assert_eq!(
        *validate(&k, &a).unwrap().values().last().unwrap(),
        T as u64
    );
    a.num_tokens = 0;
    assert!(validate(&k, &a).unwrap().grid.is_none());
    // Padded heads (V of 128 inside 192) are fine.
    let mut a = good();
    a.prefix_layout = Layout {
        token_stride: H * 192,
        head_stride: 192,
    };
    a.prefix.len = T * H * 192;
    assert!(validate(&k, &a).is_ok());
    // Read-only inputs may alias themselves (only written tensors must be distinct): one prefix
    // row broadcast to every head, and both lse from one buffer. (The runtime's hand-written
    // check before the generic one refused a head stride below D on inputs too.)
    let mut a = good();
    a.prefix_layout = Layout {
        token_stride: D,
        head_stride: 0,
    };
    a.suffix_lse = a.prefix_lse;
    assert!(validate(&k, &a).is_ok());
}

#[test]
fn each_unsafe_argument_is_refused() {
    let k = kernel("merge_attn_states_bf16_d128_thr_lse");
    let mut a = good();
    a.prefix.dtype = Dtype::F16;
    refused(&k, &a, "prefix_output is f16, the kernel takes bf16");
    let mut a = good();
    a.suffix_lse.dtype = Dtype::Bf16;
    refused(&k, &a, "suffix_lse is bf16");
    let mut a = good();
    a.suffix.len -= 1;
    refused(
        &k,
        &a,
        "suffix_output: [T=10, H=4, D=128] with strides (512, 128, 1) needs 5120 elements, it has 5119",
    );
    let mut a = good();
    a.prefix_lse.len = T * H - 1;
    refused(
        &k,
        &a,
        "prefix_lse: [H=4, T=10] with strides (10, 1) needs 40 elements, it has 39",
    );
    let mut a = good();
    a.output_layout.head_stride = 120;
    refused(
        &k,
        &a,
        "output: [T=10, H=4, D=128] with strides (512, 120, 1) maps two elements to one address",
    );
    let mut a = good();
    a.suffix_layout = Layout {
        token_stride: H * 132,
        head_stride: 132,
    };
    a.suffix.len = T * H * 132;
    refused(
        &k,
        &a,
        "suffix_output: suffix_head_stride = 132 is not a multiple of 8 elements (the kernel's 16-byte access)",
    );
    let mut a = good();
    a.prefix.ptr += 2;
    refused(
        &k,
        &a,
        "prefix_output: pointer 0x30000002 is not aligned to 16 bytes",
    );
    let mut a = good();
    a.prefill_tokens_with_context = Some(T + 1);
    refused(
        &k,
        &a,
        "prefill_tokens_with_context = 11 exceeds its maximum num_tokens = 10",
    );
    let mut a = good();
    a.output.ptr = 0;
    refused(&k, &a, "output is a null pointer");
    let mut a = good();
    a.output = a.prefix;
    refused(
        &k,
        &a,
        "output overlaps prefix_output: the kernel writes output, which may share memory with no other argument",
    );
    let mut a = good();
    a.output_layout = Layout {
        token_stride: D,
        head_stride: D,
    };
    refused(
        &k,
        &a,
        "output: [T=10, H=4, D=128] with strides (128, 128, 1) maps two elements to one address",
    );
    let mut a = good();
    a.num_tokens = 1 << 40;
    a.output.len = usize::MAX / 4;
    a.prefix.len = usize::MAX / 4;
    a.suffix.len = usize::MAX / 4;
    a.prefix_lse.len = usize::MAX / 4;
    a.suffix_lse.len = usize::MAX / 4;
    a.output_lse = None;
    a.prefill_tokens_with_context = None;
    refused(&k, &a, "blocks in grid x, over CUDA's limit 2147483647");
}

#[test]
fn options_the_variant_lacks_are_refused() {
    let text = "arch = [\"sm_90\"]\n[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 128\nprefix_threshold = false\noutput_lse = false\n";
    let spec = mla_gen::spec::parse("t.toml", text).unwrap();
    let t = mla_gen::render::Templates::embedded().unwrap();
    let (_, manifest) = mla_gen::generate_files(&spec, &t, 1, false).unwrap();
    let m = view(&manifest);
    let k = &m.kernels[0];
    let a = good();
    refused(
        k,
        &a,
        "output_lse given, but this kernel takes no output_lse",
    );
    let mut a = good();
    a.output_lse = None;
    refused(
        k,
        &a,
        "prefill_tokens_with_context = 5, but this kernel is built for prefill_tokens_with_context = num_tokens = 10",
    );
    a.prefill_tokens_with_context = Some(T);
    assert!(
        validate(k, &a).is_ok(),
        "n = T is what a kernel without threshold does"
    );
}

#[test]
fn the_grid_follows_the_manifest_launch_rule_for_every_schedule() {
    let text = "arch = [\"sm_90\"]\n[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = [80, 128]\nrows_per_thread = [1, 2]\nheads_per_block = [1, 4]\nblock_threads = 256\ndense = false\n";
    let spec = mla_gen::spec::parse("t.toml", text).unwrap();
    let t = mla_gen::render::Templates::embedded().unwrap();
    let (_, manifest) = mla_gen::generate_files(&spec, &t, 1, false).unwrap();
    let m = view(&manifest);
    assert_eq!(m.kernels.len(), 8);
    for (k, built) in m.kernels.iter().zip(&manifest.kernels) {
        let d = k.variant.head_size as usize;
        let (tt, hh) = (1000usize, 30usize);
        let mut a = good();
        let l = Layout::contiguous(hh, d);
        let n = tt * hh * d;
        a.num_tokens = tt;
        a.num_heads = hh;
        a.output_layout = l;
        a.prefix_layout = l;
        a.suffix_layout = l;
        a.output = buf(0x1_0000_0000, n, Dtype::Bf16);
        a.prefix = buf(0x2_0000_0000, n, Dtype::Bf16);
        a.suffix = buf(0x3_0000_0000, n, Dtype::Bf16);
        for lse in [&mut a.prefix_lse, &mut a.suffix_lse] {
            lse.len = tt * hh;
        }
        a.output_lse = None;
        a.prefill_tokens_with_context = None;
        let c = validate(k, &a).unwrap();
        let grid = c.grid.unwrap();
        // The rule as data is the schedule's: tokens per block times rows per thread, heads
        // per block.
        let l = &built.launch;
        assert_eq!(
            k.launch.grid_x.per_block,
            l.tokens_per_block * l.rows_per_thread
        );
        assert_eq!(k.launch.grid_y.per_block, l.heads_per_block);
        let per_block = (l.tokens_per_block * l.rows_per_thread) as usize;
        assert_eq!(grid[0] as usize, tt.div_ceil(per_block), "{}", k.name);
        assert_eq!(
            grid[1] as usize,
            hh.div_ceil(l.heads_per_block as usize),
            "{}",
            k.name
        );
        assert_eq!(c.block_threads, l.block_threads);
        assert_eq!(
            l.block_threads % (l.tokens_per_block * l.heads_per_block),
            0
        );
    }
}

#[test]
fn a_manifest_from_a_newer_tool_is_refused_not_misread() {
    // Another schema is not read at all.
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/generated/manifest.json"
    ))
    .unwrap()
    .replacen("\"schema_version\": 2", "\"schema_version\": 3", 1);
    let e = ManifestView::parse(std::path::Path::new("manifest.json"), text.as_bytes())
        .unwrap_err()
        .to_string();
    assert!(e.contains("schema_version 3"), "{e}");
    // Within the schema, a parameter the caller does not name, or an element type it does not
    // pass, is refused by the contract itself.
    let mut k = kernel("merge_attn_states_bf16_d128_thr_lse");
    k.params[3].name = "prefix_lse_scale".to_string();
    refused(
        &k,
        &good(),
        "merge_attn_states_bf16_d128_thr_lse: prefix_lse given, but this kernel takes no prefix_lse",
    );
    let mut k = kernel("merge_attn_states_bf16_d128_thr_lse");
    k.params[2].elem = Some("fp4".to_string());
    refused(&k, &good(), "prefix_output is bf16, the kernel takes fp4");
    // A contract naming what is neither a parameter nor a constant is a manifest error.
    let mut k = kernel("merge_attn_states_bf16_d128_thr_lse");
    k.constants.clear();
    let e = mla_gen::runtime::validate(&k, &good().args())
        .unwrap_err()
        .to_string();
    assert!(e.contains("names `head_size`"), "{e}");
}

#[test]
fn fp8_kernels_need_their_scale_and_a_byte_output() {
    let text = "arch = [\"sm_90\"]\n[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 128\noutput = \"fp8_e4m3\"\n";
    let spec = mla_gen::spec::parse("t.toml", text).unwrap();
    let t = mla_gen::render::Templates::embedded().unwrap();
    let (_, manifest) = mla_gen::generate_files(&spec, &t, 1, false).unwrap();
    let m = view(&manifest);
    let k = &m.kernels[0];
    let align = |name: &str| {
        let p = k.params.iter().find(|p| p.name == name).unwrap();
        p.tensor.as_ref().unwrap().align_bytes
    };
    assert_eq!((align("output"), align("prefix_output")), (8, 16));
    let fp8 = || {
        let mut a = good();
        a.output.dtype = Dtype::Fp8E4m3;
        a.output_scale = Some(buf(0x7000_0000, 1, Dtype::F32));
        a
    };
    let c = validate(k, &fp8()).unwrap();
    assert!(
        c.values().contains(&0x7000_0000),
        "the scale pointer is passed"
    );
    let mut a = fp8();
    a.output_scale = None;
    refused(k, &a, "output_scale is required");
    let mut a = fp8();
    a.output.dtype = Dtype::Bf16;
    refused(k, &a, "output is bf16, the kernel takes fp8_e4m3");
    let mut a = fp8();
    a.output.ptr += 8; // 8-byte aligned is enough for 8 one-byte codes
    assert!(validate(k, &a).is_ok());
    a.output.ptr += 4;
    refused(
        k,
        &a,
        "output: pointer 0x1000000c is not aligned to 8 bytes",
    );
    let mut a = fp8();
    a.output_scale = Some(buf(0x7000_0002, 1, Dtype::F32));
    refused(
        k,
        &a,
        "output_scale: pointer 0x70000002 is not aligned to 4 bytes",
    );
    let mut a = fp8();
    a.output_scale = Some(buf(0x7000_0000, 0, Dtype::F32));
    refused(
        k,
        &a,
        "output_scale: [] with strides () needs 1 elements, it has 0",
    );
    // And a same-dtype kernel refuses a scale.
    let same = kernel("merge_attn_states_bf16_d128_thr_lse");
    let mut a = good();
    a.output_scale = Some(buf(0x7000_0000, 1, Dtype::F32));
    refused(
        &same,
        &a,
        "output_scale given, but this kernel takes no output_scale",
    );
}

#[test]
fn group_fp8_kernels_need_distinct_in_bounds_scales() {
    use mla_gen::runtime::GroupScales;
    let ks = kernels_of(
        "[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 128\noutput = \"fp8_e4m3_group\"\ngroup_size = 64\nue8m0 = true\n",
    );
    let k = &ks[0];
    assert_eq!(k.name, "merge_attn_states_bf16_d128_thr_lse_fp8g64_ue8m0");
    let refused = |k: &KernelView, a: &MergeArgs, needle: &str| refused(k, a, needle);
    let groups = H * D / 64;
    let scales = |ts: usize, gs: usize, len: usize| GroupScales {
        buf: buf(0x7000_0000, len, Dtype::F32),
        token_stride: ts,
        group_stride: gs,
    };
    let with = |sc: Option<GroupScales>| {
        let mut a = good();
        a.output.dtype = Dtype::Fp8E4m3;
        a.output_scales = sc;
        a
    };
    // Row-major, padded and column-major layouts are all accepted, in ABI order.
    for (ts, gs) in [(groups, 1), (groups + 3, 1), (1, T)] {
        let len = (T - 1) * ts + (groups - 1) * gs + 1;
        let c = validate(k, &with(Some(scales(ts, gs, len)))).unwrap();
        let values = c.values();
        let names: Vec<&str> = k.params.iter().map(|p| p.name.as_str()).collect();
        let at = |n: &str| values[names.iter().position(|&x| x == n).unwrap()];
        assert_eq!(
            (
                at("output_scales"),
                at("scale_token_stride"),
                at("scale_group_stride")
            ),
            (0x7000_0000, ts as u64, gs as u64)
        );
    }
    refused(k, &with(None), "output_scales is required");
    let len = T * groups;
    refused(
        k,
        &with(Some(scales(groups, 1, len - 1))),
        "needs 80 elements, it has 79",
    );
    refused(
        k,
        &with(Some(scales(groups - 1, 1, len))),
        "maps two elements to one address",
    );
    let mut a = with(Some(scales(groups, 1, len)));
    a.output_scales.as_mut().unwrap().buf.ptr = a.output_lse.unwrap().ptr;
    refused(k, &a, "output_lse overlaps output_scales");
    let mut a = with(Some(scales(groups, 1, len)));
    a.output_scale = Some(buf(0x7100_0000, 1, Dtype::F32));
    refused(
        k,
        &a,
        "output_scale given, but this kernel takes no output_scale",
    );
    // ... and a kernel without group scales refuses them.
    let plain = kernel("merge_attn_states_bf16_d128_thr_lse");
    let mut a = good();
    a.output_scales = Some(scales(groups, 1, len));
    refused(
        &plain,
        &a,
        "output_scales given, but this kernel takes no output_scales",
    );
}

#[test]
fn every_kernel_a_call_can_reach_is_what_a_call_giving_all_its_parameters_selects() {
    use mla_gen::contract::{Expr, ParamKind};
    use mla_gen::runtime::{Call, Given, Selector};
    let ks = kernels_of(
        "[[merge_attn_states]]\ndtype = [\"bf16\", \"f16\"]\nhead_size = [64, 128]\noutput = [\"same\", \"fp8_e4m3\"]\nmask_empty_context = [false, true]\nprefix_threshold = [true, false]\noutput_lse = [true, false]\n\
         [[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 128\noutput = \"fp8_e4m3_group\"\ngroup_size = [64, 128]\nue8m0 = [true, false]\nlse_layout = [\"head_major\", \"token_major\"]\n\
         [[merge_states]]\ndtype = \"bf16\"\nhead_size = 128\nnum_states = [4, \"runtime\"]\noutput_lse = [true, false]\n\
         [[merge_state_in_place]]\ndtype = \"f16\"\nhead_size = 128\nmask = [true, false]\n\
         [[mask_empty_context_lse]]\nlse_layout = [\"head_major\", \"token_major\"]\n",
    );
    let selector = Selector::new(ks.iter().map(Into::into)).unwrap();
    // A size rule's kernels and the dense specializations are reached through their kernel.
    let reached: Vec<&str> = ks
        .iter()
        .flat_map(|k| {
            let rule = k.launch.size_rule.iter().flat_map(|r| &r.ranges);
            rule.map(|r| r.kernel.as_str())
                .chain(k.launch.specializations.iter().map(String::as_str))
        })
        .collect();
    let ints = |k: &KernelView, name: &str| match name {
        "num_states" => 3, // no kernel is built for K = 3: only the runtime-K one takes it
        n => k.constants.get(n).map_or(2, |c| c.parse().unwrap_or(2)),
    };
    let mut selected = 0;
    for k in ks.iter().filter(|k| !reached.contains(&k.name.as_str())) {
        let shapes: Vec<Vec<i64>> = k
            .params
            .iter()
            .map(|p| {
                let dims = p.tensor.iter().flat_map(|t| &t.dims);
                dims.map(|d| {
                    let e = Expr::parse(&d.size).unwrap();
                    e.factors.iter().map(|f| ints(k, f)).product::<i64>() * e.mul + e.add
                })
                .collect()
            })
            .collect();
        let args: Vec<(&str, Given)> = k
            .params
            .iter()
            .zip(&shapes)
            .filter_map(|(p, shape)| match p.kind {
                ParamKind::Pointer => Some((
                    p.name.as_str(),
                    Given::Buffer {
                        elem: p.elem.as_deref(),
                        shape: Some(shape),
                    },
                )),
                // Defaulted integers given, their values left to each call.
                ParamKind::I64 => {
                    p.bounds.as_ref()?.default.as_ref()?;
                    Some((p.name.as_str(), Given::Int(None)))
                }
                _ => None,
            })
            .collect();
        let options: Vec<(&str, &str)> = k
            .select
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        let call = Call {
            family: &k.family,
            args: &args,
            options: &options,
        };
        let got = selector.select(&call).expect("a kernel");
        assert_eq!(selector.name(got.index), k.name);
        assert!(got.serves, "{}", k.name);
        selected += 1;
    }
    assert!(
        selected > 30 && reached.len() > 10,
        "{selected}, {}",
        reached.len()
    );
}
