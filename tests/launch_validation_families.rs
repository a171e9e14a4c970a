//! Every argument that could make a kernel touch memory outside its tensors is refused before
//! launch: the K-way merge (merge_states), the in-place merge and the lse mask (the pairwise
//! merge: tests/launch_validation.rs). Runs without a GPU: validation reads only the manifest.
#![cfg(feature = "runtime")]

#[path = "launch_validation/common.rs"]
mod common;

use common::*;
use mla_gen::dtype::Dtype;
use mla_gen::reference::Layout;
use mla_gen::runtime::{InPlaceArgs, MaskLseArgs, StatesArgs, StatesLayout};

const K: usize = 4;

fn good_states() -> StatesArgs {
    StatesArgs {
        output: buf(0x1000_0000, T * H * D, Dtype::Bf16),
        output_lse: Some(buf(0x2000_0000, T * H, Dtype::F32)),
        states: buf(0x3000_0000, T * K * H * D, Dtype::Bf16),
        states_lse: buf(0x4000_0000, T * K * H, Dtype::F32),
        num_tokens: T,
        num_heads: H,
        num_states: K,
        output_layout: Layout::contiguous(H, D),
        states_layout: StatesLayout::contiguous(K, H, D),
    }
}

#[test]
fn k_way_launches_are_checked_like_pairwise_ones() {
    let ks = kernels_of(
        "[[merge_states]]\ndtype = \"bf16\"\nhead_size = 128\nnum_states = [4, \"runtime\"]\n",
    );
    let (fixed, runtime_k) = (&ks[0], &ks[1]);
    let c = validate(fixed, &good_states()).unwrap();
    let (values, grid) = (c.values(), c.grid.unwrap());
    assert_eq!(values[0], 0x1000_0000);
    assert_eq!(values[2], 0x3000_0000);
    assert_eq!(values[values.len() - 2], (H * D) as u64, "state stride");
    assert_eq!(
        grid[1] as usize,
        H.div_ceil(fixed.launch.grid_y.per_block as usize)
    );
    // The runtime-K kernel takes K as an argument, after states_lse.
    let c = validate(runtime_k, &good_states()).unwrap();
    assert_eq!(c.values()[4], K as u64);

    let mut a = good_states();
    a.num_states = 3;
    refused(
        fixed,
        &a,
        "num_states = 3, but this kernel is built for num_states = 4",
    );
    a.num_states = 0;
    refused(runtime_k, &a, "num_states = 0 is below its minimum 1");
    let mut a = good_states();
    a.states.len -= 1;
    refused(
        fixed,
        &a,
        "states: [T=10, K=4, H=4, D=128] with strides (2048, 512, 128, 1) needs 20480 elements, it has 20479",
    );
    let mut a = good_states();
    a.states_lse.len = T * H;
    refused(
        fixed,
        &a,
        "states_lse: [T=10, K=4, H=4] with strides (16, 4, 1) needs 160 elements, it has 40",
    );
    let mut a = good_states();
    a.output.ptr = a.states.ptr + 256;
    refused(fixed, &a, "output overlaps states");
    let mut a = good_states();
    a.states_layout.state_stride += 1;
    refused(
        fixed,
        &a,
        "states: states_state_stride = 513 is not a multiple of 8 elements",
    );
    let mut a = good_states();
    a.states.dtype = Dtype::F16;
    refused(fixed, &a, "states is f16, the kernel takes bf16");
    // A pairwise kernel is not launched with K-way arguments, nor a K-way one with pairwise ones.
    refused(
        &kernel("merge_attn_states_bf16_d128_thr_lse"),
        &good_states(),
        "states given, but this kernel takes no states",
    );
    refused(
        fixed,
        &good(),
        "prefix_output given, but this kernel takes no prefix_output",
    );
}

fn good_in_place() -> InPlaceArgs {
    InPlaceArgs {
        state: buf(0x1000_0000, T * H * D, Dtype::F16),
        state_lse: buf(0x2000_0000, T * H, Dtype::F32),
        other: buf(0x3000_0000, T * H * D, Dtype::F16),
        other_lse: buf(0x4000_0000, T * H, Dtype::F32),
        mask: Some(buf(0x5000_0000, T, Dtype::U8)),
        num_tokens: T,
        num_heads: H,
        state_layout: Layout::contiguous(H, D),
        other_layout: Layout::contiguous(H, D),
    }
}

#[test]
fn in_place_launches_refuse_aliasing_and_a_short_mask() {
    let ks = kernels_of(
        "[[merge_state_in_place]]\ndtype = \"f16\"\nhead_size = 128\nmask = [true, false]\n",
    );
    let (masked, plain) = (&ks[0], &ks[1]);
    let c = validate(masked, &good_in_place()).unwrap();
    assert_eq!(
        c.values()[..5],
        [
            0x1000_0000,
            0x2000_0000,
            0x3000_0000,
            0x4000_0000,
            0x5000_0000
        ]
    );
    let mut a = good_in_place();
    a.mask = None;
    assert!(
        validate(masked, &a).unwrap().grid.is_some(),
        "null mask = every token"
    );
    assert!(validate(plain, &a).unwrap().grid.is_some());
    refused(
        plain,
        &good_in_place(),
        "mask given, but this kernel takes no mask",
    );

    let mut a = good_in_place();
    a.mask = Some(buf(0x5000_0000, T - 1, Dtype::U8));
    refused(
        masked,
        &a,
        "mask: [T=10] with strides (1) needs 10 elements, it has 9",
    );
    let mut a = good_in_place();
    a.other.ptr = a.state.ptr;
    refused(masked, &a, "state overlaps other: the kernel writes state");
    let mut a = good_in_place();
    a.mask = Some(buf(a.state_lse.ptr + 4, T, Dtype::U8));
    refused(masked, &a, "state_lse overlaps mask");
    let mut a = good_in_place();
    a.state_lse.ptr = a.state.ptr + 64;
    refused(masked, &a, "state overlaps state_lse");
    let mut a = good_in_place();
    a.state_layout.token_stride = D;
    refused(
        masked,
        &a,
        "state: [T=10, H=4, D=128] with strides (128, 128, 1) maps two elements to one address",
    );
}

#[test]
fn lse_mask_launches_check_the_start_locations_buffers() {
    let ks =
        kernels_of("[[mask_empty_context_lse]]\nlse_layout = [\"head_major\", \"token_major\"]\n");
    assert_eq!(ks[0].name, "mask_empty_context_lse");
    assert_eq!(ks[1].name, "mask_empty_context_lse_tm");
    let good = || MaskLseArgs {
        lse: buf(0x1000_0000, T * H, Dtype::F32),
        query_start_loc: buf(0x2000_0000, 4, Dtype::I32),
        context_start_loc: buf(0x3000_0000, 4, Dtype::I32),
        num_requests: 3,
        num_tokens: T,
        num_heads: H,
    };
    let c = validate(&ks[0], &good()).unwrap();
    let (grid, block) = (c.grid.unwrap(), c.block_threads);
    assert_eq!(
        c.values()[..],
        [0x1000_0000, 0x2000_0000, 0x3000_0000, 3, T as u64, H as u64]
    );
    // One thread per token; each masks 16 heads of it.
    assert_eq!((grid, block), ([1, H.div_ceil(16) as u32, 1], 256));
    let refused = |a: MaskLseArgs, needle: &str| match validate(&ks[1], &a) {
        Ok(_) => panic!("accepted; expected {needle:?}"),
        Err(e) => assert!(e.to_string().contains(needle), "{e}"),
    };
    let mut a = good();
    a.context_start_loc.len = 3;
    refused(
        a,
        "context_start_loc: [B+1=4] with strides (1) needs 4 elements, it has 3",
    );
    let mut a = good();
    a.query_start_loc.ptr += 2;
    refused(
        a,
        "query_start_loc: pointer 0x20000002 is not aligned to 4 bytes",
    );
    let mut a = good();
    a.lse.len -= 1;
    refused(
        a,
        "lse: [T=10, H=4] with strides (4, 1) needs 40 elements, it has 39",
    );
    let mut a = good();
    a.query_start_loc.ptr = a.lse.ptr + 8;
    refused(a, "lse overlaps query_start_loc");
    let mut a = good();
    a.lse.dtype = Dtype::F16;
    refused(a, "lse is f16, the kernel takes f32");
}

/// Where no kernel serves a call, selection says why, per kernel of the family: the buffers the
/// call lacks, an element type or a size the kernel fixes, options it is built for, or a family
/// the manifest lacks (the example engine's K-way call once gave two buffers of four and got
/// only `None`).
#[test]
fn selection_says_why_no_kernel_serves() {
    use mla_gen::runtime::{Call, Given, Selector};
    let ks = kernels_of(concat!(
        "[[merge_states]]\ndtype = \"bf16\"\nhead_size = 128\nnum_states = 4\n",
        "[[merge_state_in_place]]\ndtype = \"bf16\"\nhead_size = 128\n",
    ));
    let selector =
        Selector::new(ks.iter().map(mla_gen::host::select::Entry::from)).expect("a selector");
    let (t, k, h, d) = (T as i64, K as i64, H as i64, D as i64);
    let (thd, tkh, tkhd, t3hd) = ([t, h, d], [t, k, h], [t, k, h, d], [t, 3, h, d]);
    let why = |family: &str, args: &[(&str, Given)], options: &[(&str, &str)]| {
        let call = Call {
            family,
            args,
            options,
        };
        selector
            .serving(&call)
            .map(|i| selector.name(i).to_string())
    };
    let out = ("output", Given::buffer("bf16", &thd));
    let lse = ("states_lse", Given::buffer("f32", &tkh));
    let states = ("states", Given::buffer("bf16", &tkhd));
    assert_eq!(
        why("merge_states", &[out, states, lse], &[]).unwrap(),
        "merge_states_bf16_d128_k4_lse"
    );
    let e = why("merge_states", &[states], &[]).unwrap_err().to_string();
    assert_eq!(
        e,
        "no merge_states kernel serves this call:\n  merge_states_bf16_d128_k4_lse needs \
         `output`, `states_lse`, which the call does not give"
    );
    let three = ("states", Given::buffer("bf16", &t3hd));
    let e = why("merge_states", &[out, three, lse], &[]).unwrap_err();
    assert!(
        e.to_string().contains("takes `states` with K = 4, not 3"),
        "{e}"
    );
    let f16 = ("states", Given::buffer("f16", &tkhd));
    let e = why("merge_states", &[out, f16, lse], &[]).unwrap_err();
    assert!(
        e.to_string().contains("takes `states` as bf16, not f16"),
        "{e}"
    );
    let extra = ("output_scale", Given::buffer("f32", &[1]));
    let e = why("merge_states", &[out, states, lse, extra], &[]).unwrap_err();
    assert!(
        e.to_string().contains("takes no buffer `output_scale`"),
        "{e}"
    );
    let e = why(
        "merge_state_in_place",
        &[],
        &[("lse_layout", "token_major")],
    )
    .unwrap_err();
    assert!(
        e.to_string().contains(
            "merge_state_in_place_bf16_d128 is built for options lse_layout = head_major; \
             the call states lse_layout = token_major"
        ),
        "{e}"
    );
    let e = why("merge_attn_states", &[out], &[]).unwrap_err();
    assert!(
        e.to_string().starts_with(
            "the manifest has no merge_attn_states kernel (it has: merge_states, \
             merge_state_in_place)"
        ),
        "{e}"
    );
}
