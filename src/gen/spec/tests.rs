//! Unit tests of the parent module.

use super::*;

mod heads;
mod include_default;
mod tuned;

fn err(text: &str) -> String {
    match parse("t.toml", text) {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn the_fused_context_mask_is_a_pairwise_key() {
    let s = parse(
        "t.toml",
        "[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 128\nmask_empty_context = [false, true]\nsize_rule = false\ndense = false\n",
    )
    .unwrap();
    let names = s.kernel_names();
    assert_eq!(
        names,
        [
            "merge_attn_states_bf16_d128_thr_lse",
            "merge_attn_states_bf16_d128_thr_lse_ctxmask"
        ]
    );
    let p = crate::gen::abi::params(&s.variants[1]);
    let names: Vec<&str> = p.iter().map(|p| p.name.as_str()).collect();
    assert!(names.contains(&"query_start_loc") && names.contains(&"context_start_loc"));
    assert_eq!(names.last(), Some(&"num_requests"));
    for table in [
        "merge_states",
        "merge_state_in_place",
        "mask_empty_context_lse",
    ] {
        let text = format!("[[{table}]]\nmask_empty_context = true\n");
        let e = parse("t.toml", &text).unwrap_err().to_string();
        assert!(e.contains("`mask_empty_context` is not a key of"), "{e}");
    }
    let e = parse(
        "t.toml",
        "[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 128\nmask_empty_context = 1\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.starts_with("t.toml:4:"), "{e}");
}

#[test]
fn default_spec_serves_every_engine_call() {
    let s = default_spec().unwrap();
    assert_eq!(
        s.variants.len(),
        1227,
        "the count specs/default.toml's header states"
    );
    let called: Vec<&MergeVariant> = s.variants.iter().filter(|v| v.role.is_named()).collect();
    assert_eq!(called.len(), 564);
    let count = |f: &dyn Fn(&MergeVariant) -> bool| called.iter().filter(|v| f(v)).count();
    let pairwise = |v: &MergeVariant| v.family == Family::MergeAttnStates;
    // vLLM's merge_attn_states: 27 dtype x head size, each with the inputs' dtype and per-tensor
    // FP8 output, each plain and with the fused mask; threshold and output lse on, head-major.
    let vllm = |v: &MergeVariant| {
        pairwise(v) && v.prefix_threshold && v.output_lse && v.lse_layout == LseLayout::HeadMajor
    };
    for output in [OutputKind::Same, OutputKind::Fp8E4m3] {
        for mask in [false, true] {
            let n = count(&|v| vllm(v) && v.output == output && v.mask_empty_context == mask);
            assert_eq!(n, 27, "{output:?}, mask {mask}");
        }
    }
    // Its per-token-group FP8: 26 (dtype, head size, group of 128 or 64) x UE8M0 x fused mask.
    assert_eq!(count(&|v| vllm(v) && v.fp8_group.is_some()), 26 * 2 * 2);
    assert_eq!(count(&vllm), 108 + 104);
    // SGLang's (base e) and FlashInfer's (base 2) token-major merges without a threshold, on
    // the 7 head sizes of the new families (21 + 14), the K-way merges with runtime K (21 +
    // 14) and with K fixed (168), the in-place merges (84 + 28) and the lse mask (2).
    let token_major = |base| {
        count(&|v| {
            pairwise(v)
                && !v.prefix_threshold
                && v.lse_layout == LseLayout::TokenMajor
                && v.lse_base == base
        })
    };
    assert_eq!(
        (token_major(LseBase::E), token_major(LseBase::Two)),
        (21, 14)
    );
    let kway = |base| {
        count(&|v| {
            matches!(v.family, Family::MergeStates { num_states: None }) && v.lse_base == base
        })
    };
    assert_eq!((kway(LseBase::E), kway(LseBase::Two)), (21, 14));
    // Block 9: K fixed at 1, 2, 3, 4, 5, 8 for f16/bf16 on the same head sizes, in both bases,
    // where the runtime-K kernel's K = 8 body costs the small K (GPU runs 127, 186).
    for base in [LseBase::E, LseBase::Two] {
        let mut fixed: Vec<(u32, crate::dtype::Dtype, u32)> = called
            .iter()
            .filter(|v| v.lse_base == base)
            .filter_map(|v| match v.family {
                Family::MergeStates {
                    num_states: Some(k),
                } => Some((k, v.dtype, v.head_size)),
                _ => None,
            })
            .collect();
        fixed.sort();
        let mut want = Vec::new();
        for k in [1, 2, 3, 4, 5, 8] {
            for dtype in [crate::dtype::Dtype::F16, crate::dtype::Dtype::Bf16] {
                for head_size in [64, 96, 128, 192, 256, 512, 576] {
                    want.push((k, dtype, head_size));
                }
            }
        }
        want.sort();
        assert_eq!(fixed, want, "{base:?}");
    }
    let in_place = |base| {
        count(&|v| matches!(v.family, Family::MergeStateInPlace { .. }) && v.lse_base == base)
    };
    assert_eq!((in_place(LseBase::E), in_place(LseBase::Two)), (84, 28));
    assert_eq!(count(&|v| v.family == Family::MaskEmptyContextLse), 2);
    assert!(s.variants.iter().all(|v| !v.pdl));
    // Twins only where block 1 has them: the new pairwise blocks, K-way and in-place have none.
    for v in &called {
        assert_eq!(!v.role.twins.is_empty(), vllm(v), "{}", v.kernel_name());
    }
    // vLLM's kernels: each general kernel (size rules' included), then its dense twins in the
    // order hosts try them: first the `_flat` one for fewer heads where the kernel has no fused
    // mask and its blocks hold several heads (every FP8 output: 8; 21 of the inputs' dtype's),
    // then `_dense_nothr` (all context: no threshold test) and `_dense`, the same pair under
    // `_flat`. The all-context twins came back after runs 142-143 (HISTORY.md, session 21).
    let with_flat = |output| {
        s.variants
            .iter()
            .filter(|v| v.role.twins.contains(Twin::FewHeads) && v.output == output)
            .count()
    };
    assert_eq!(with_flat(OutputKind::Fp8E4m3), 27);
    assert_eq!(with_flat(OutputKind::Fp8E4m3Group), 52);
    assert_eq!(with_flat(OutputKind::Same), 21);
    assert!(s
        .variants
        .iter()
        .all(|v| !(v.role.twins.contains(Twin::FewHeads) && v.mask_empty_context)));
    let rule_kernels: usize = called.iter().map(|v| v.size_rule.len()).sum();
    let flat_twins = 27 + 52 + 21;
    let twinned = s.variants.iter().filter(|v| vllm(v)).count();
    assert_eq!(twinned, 3 * (212 + rule_kernels) + 2 * flat_twins);
    let mut rest = &s.variants[..];
    while let Some((general, after)) = rest.split_first() {
        let name = general.kernel_name();
        assert!(general.role.twin_of.is_empty(), "{name}");
        let twins: &[&str] = if general.role.twins.contains(Twin::FewHeads) {
            &["_dense_nothr_flat", "_dense_flat", "_dense_nothr", "_dense"]
        } else if general.role.twins.contains(Twin::Dense) {
            assert!(general.prefix_threshold, "{name}");
            &["_dense_nothr", "_dense"]
        } else {
            &[]
        };
        for (twin, tag) in after.iter().zip(twins) {
            assert_eq!(twin.kernel_name(), format!("{name}{tag}"));
            let is = |kind| twin.role.twin_of.contains(kind);
            assert!(is(Twin::Dense) && twin.size_rule.is_empty());
            assert_eq!(is(Twin::AllContext), tag.contains("nothr"), "{name}{tag}");
            assert_eq!(is(Twin::FewHeads), tag.ends_with("_flat"), "{name}{tag}");
        }
        rest = &after[twins.len()..];
    }
    assert_eq!(
        s.archs.iter().map(Arch::name).collect::<Vec<_>>(),
        ["sm_80", "sm_90", "sm_100", "sm_120"]
    );
    // CUBIN for each, PTX for sm_120 alone; no .cu files.
    let with_ptx: Vec<String> = s
        .archs
        .iter()
        .filter(|a| s.carries_ptx(a))
        .map(Arch::name)
        .collect();
    assert_eq!(with_ptx, ["sm_120"]);
    assert!(!s.sources);
    let heads = |f: &dyn Fn(&MergeVariant) -> bool| {
        let set: std::collections::BTreeSet<u32> = called
            .iter()
            .filter(|v| f(v))
            .map(|v| v.head_size)
            .collect();
        set.into_iter().collect::<Vec<_>>()
    };
    assert_eq!(heads(&vllm), [64, 80, 96, 112, 128, 192, 256, 512, 576]);
    let others = |v: &MergeVariant| !vllm(v) && v.family != Family::MaskEmptyContextLse;
    assert_eq!(heads(&others), [64, 96, 128, 192, 256, 512, 576]);
}

#[test]
fn lists_expand_to_their_cross_product_in_order() {
    let s = parse(
        "t.toml",
        "[[merge_attn_states]]\ndtype = [\"f16\", \"bf16\"]\nhead_size = [64, 128]\nprefix_threshold = [true, false]\nsize_rule = false\ndense = false\n",
    )
    .unwrap();
    let names = s.kernel_names();
    assert_eq!(names.len(), 8);
    assert_eq!(names[0], "merge_attn_states_f16_d64_thr_lse");
    assert_eq!(names[1], "merge_attn_states_f16_d64_lse");
    assert_eq!(names[7], "merge_attn_states_bf16_d128_lse");
    assert_eq!(s.archs.len(), 2, "default archs");
}

#[test]
fn errors_name_the_place_the_key_and_the_allowed_values() {
    assert_eq!(
        err("[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 0\n"),
        "t.toml:3:13: `head_size`: 0 is out of range; allowed: 1..=1024"
    );
    assert!(
        err("[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 64\noutput = \"fp4\"\n")
            .contains("\"fp4\" is not allowed; allowed: same")
    );
    assert!(err("[[merge_attn_states]]\ndtype = []\nhead_size = 64\n").contains("empty list"));
    assert!(
        err("[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = [64, 64]\n")
            .contains("lists 64 twice")
    );
    assert!(
        err("[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 64\noutput_lse = \"yes\"\n")
            .contains("expected true or false")
    );
    assert!(
        err("arch = [\"sm_9x\"]\n[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 64\n")
            .contains("must be digits")
    );
    assert!(
        err("arch = [\"gfx90a\"]\n[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 64\n")
            .contains("not an architecture")
    );
    assert!(err("").contains("names no kernels"));
    assert!(err("[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 64\n[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 64\n")
        .contains("also produced by the table at line 1"));
}

#[test]
fn fp8_is_an_output_kind_not_an_input_dtype() {
    let e = err("[[merge_attn_states]]\ndtype = \"fp8_e4m3\"\nhead_size = 64\n");
    assert!(e.contains("write output = \"fp8_e4m3\""), "{e}");
    let s = parse(
        "t.toml",
        "[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 64\noutput = [\"same\", \"fp8_e4m3\"]\nsize_rule = false\ndense = false\n",
    )
    .unwrap();
    assert_eq!(
        s.kernel_names(),
        [
            "merge_attn_states_bf16_d64_thr_lse",
            "merge_attn_states_bf16_d64_thr_lse_fp8"
        ]
    );
}

#[test]
fn k_way_and_in_place_tables() {
    let s = parse(
        "t.toml",
        "[[merge_states]]\ndtype = \"f32\"\nhead_size = 64\nnum_states = [2, 16, \"runtime\"]\noutput_lse = [true, false]\n\
         [[merge_state_in_place]]\ndtype = \"bf16\"\nhead_size = 64\nmask = [true, false]\nlse_layout = \"token_major\"\n",
    )
    .unwrap();
    assert_eq!(
        s.kernel_names(),
        [
            "merge_states_f32_d64_k2_lse",
            "merge_states_f32_d64_k2",
            "merge_states_f32_d64_k16_lse",
            "merge_states_f32_d64_k16",
            "merge_states_f32_d64_kvar_lse",
            "merge_states_f32_d64_kvar",
            "merge_state_in_place_bf16_d64_mask_tm",
            "merge_state_in_place_bf16_d64_tm",
        ]
    );
    assert!(s.variants.iter().all(|v| !v.prefix_threshold));
    let e = err("[[merge_states]]\ndtype = \"f32\"\nhead_size = 64\n");
    assert!(e.contains("missing the required key `num_states`"), "{e}");
    for bad in ["0", "17", "\"any\"", "2.0"] {
        let e = err(&format!(
            "[[merge_states]]\ndtype = \"f32\"\nhead_size = 64\nnum_states = {bad}\n"
        ));
        assert!(
            e.contains("allowed: integers 1..=16, or \"runtime\""),
            "{e}"
        );
    }
    // Keys of another family are refused where they would be silently ignored.
    for (table, key) in [
        ("merge_states", "prefix_threshold = true"),
        ("mask_empty_context_lse", "rows_per_thread = 2"),
        ("merge_states", "lse_layout = \"head_major\""),
        ("merge_state_in_place", "output_lse = false"),
        ("merge_state_in_place", "output = \"fp8_e4m3\""),
        ("merge_attn_states", "num_states = 4"),
        ("merge_attn_states", "mask = true"),
    ] {
        let required = match table {
            "merge_states" => "dtype = \"f32\"\nhead_size = 64\nnum_states = 4\n",
            "mask_empty_context_lse" => "",
            _ => "dtype = \"f32\"\nhead_size = 64\n",
        };
        let e = err(&format!("[[{table}]]\n{required}{key}\n"));
        let name = key.split(' ').next().unwrap();
        assert!(
            e.contains(&format!("`{name}` is not a key of [[{table}]]")),
            "{e}"
        );
    }
}

#[test]
fn per_token_group_fp8_keys() {
    let s = parse(
        "t.toml",
        "[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 128\noutput = [\"fp8_e4m3\", \"fp8_e4m3_group\"]\ngroup_size = [16, 128]\nue8m0 = [false, true]\ndense = false\n",
    )
    .unwrap();
    assert_eq!(
        s.kernel_names(),
        [
            "merge_attn_states_bf16_d128_thr_lse_fp8",
            "merge_attn_states_bf16_d128_thr_lse_fp8g16",
            "merge_attn_states_bf16_d128_thr_lse_fp8g16_ue8m0",
            "merge_attn_states_bf16_d128_thr_lse_fp8g128",
            "merge_attn_states_bf16_d128_thr_lse_fp8g128_ue8m0",
        ]
    );
    let base = "[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 128\n";
    let e = err(&format!("{base}output = \"fp8_e4m3_group\"\n"));
    assert!(e.contains("needs `group_size`"), "{e}");
    let e = err(&format!("{base}group_size = 64\n"));
    assert!(
        e.contains("`group_size` applies only with output = \"fp8_e4m3_group\""),
        "{e}"
    );
    let e = err(&format!("{base}ue8m0 = true\n"));
    assert!(e.contains("`ue8m0` applies only with"), "{e}");
    let e = err(&format!(
        "{base}output = \"fp8_e4m3_group\"\ngroup_size = 48\n"
    ));
    assert!(
        e.contains("48 is not allowed; allowed: 16, 32, 64, 128"),
        "{e}"
    );
    // f32 d576 has 72 threads per row, two vectors each: a 64-element group (16 lanes) would
    // straddle them.
    let e = err(
        "[[merge_attn_states]]\ndtype = \"f32\"\nhead_size = 576\noutput = \"fp8_e4m3_group\"\ngroup_size = 64\n",
    );
    assert!(
        e.contains("`group_size` = 64 does not fit f32 d576") && e.contains("allowed here: 16, 32"),
        "{e}"
    );
    let e =
        err("[[merge_states]]\ndtype = \"f32\"\nhead_size = 64\nnum_states = 2\ngroup_size = 16\n");
    assert!(
        e.contains("`group_size` is not a key of [[merge_states]]"),
        "{e}"
    );
}

#[test]
fn expansion_is_capped() {
    let heads: Vec<String> = (1..=1024).map(|n| n.to_string()).collect();
    let text = format!(
        "[[merge_attn_states]]\ndtype = [\"f16\", \"bf16\", \"f32\"]\nhead_size = [{}]\nprefix_threshold = [true, false]\n",
        heads.join(", ")
    );
    assert!(err(&text).contains("more than 4096 kernels"));
}

#[test]
fn arch_names_round_trip() {
    for a in ["sm_80", "sm_90a", "compute_90", "sm_120"] {
        assert_eq!(Arch::parse(a).unwrap().name(), a);
    }
    assert_eq!(Arch::parse("sm_90").unwrap().virtual_name(), "compute_90");
    assert_eq!(Arch::parse("compute_90").unwrap().real_name(), None);
}

#[test]
fn pdl_is_a_key_of_every_table_and_names_its_kernels() {
    let s = parse(
        "t.toml",
        "arch = [\"sm_80\", \"sm_90\"]\n[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 128\npdl = [false, true]\nsize_rule = false\ndense = false\n[[merge_states]]\ndtype = \"bf16\"\nhead_size = 128\nnum_states = 4\npdl = true\n[[merge_state_in_place]]\ndtype = \"f16\"\nhead_size = 64\npdl = true\n[[mask_empty_context_lse]]\npdl = true\n",
    )
    .unwrap();
    assert_eq!(
        s.kernel_names(),
        [
            "merge_attn_states_bf16_d128_thr_lse",
            "merge_attn_states_bf16_d128_thr_lse_pdl",
            "merge_states_bf16_d128_k4_lse_pdl",
            "merge_state_in_place_f16_d64_pdl",
            "mask_empty_context_lse_pdl",
        ]
    );
    let e = err("[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 128\npdl = \"yes\"\n");
    assert_eq!(e, "t.toml:4:7: `pdl`: expected true or false, got \"yes\"");
}

#[test]
fn pdl_without_an_sm_90_target_is_refused_with_the_fix() {
    let spec = |arch: &str| {
        format!(
            "arch = {arch}\n[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 128\npdl = true\n"
        )
    };
    assert_eq!(
        err(&spec("[\"sm_80\"]")),
        "t.toml:5:7: `pdl` = true needs a target of sm_90 or newer (programmatic dependent launch and griddepcontrol exist from sm_90 on), and this spec targets only sm_80: add \"sm_90\" to `arch` (older targets may stay; they launch without it), or remove `pdl`"
    );
    assert!(err(&spec("[\"compute_80\", \"sm_86\"]")).contains("targets only compute_80, sm_86"));
    // sm_100 alone above an sm_80 PTX: a 9.0 device would run the sm_80 PTX.
    let e = err(&spec("[\"sm_80\", \"sm_100\"]"));
    assert!(
        e.contains("would run the compute_80 PTX") && e.contains("add \"sm_90\""),
        "{e}"
    );
    assert!(err(&spec("[\"sm_80\", \"sm_90a\"]")).contains("compute_80 PTX"));
    for ok in [
        "[\"sm_80\", \"sm_90\"]",
        "[\"sm_90\"]",
        "[\"compute_90\"]",
        "[\"sm_100\"]",
        "[\"sm_90a\"]",
        "[\"compute_80\", \"compute_90\", \"sm_100\"]",
    ] {
        assert!(parse("t.toml", &spec(ok)).is_ok(), "{ok}");
    }
    // Without a pdl kernel any archs do; with `pdl = false` too.
    assert!(parse(
        "t.toml",
        &spec("[\"sm_80\"]").replace("pdl = true", "pdl = false")
    )
    .is_ok());
}

#[test]
fn ptx_every_or_newest_decides_which_targets_carry_ptx() {
    let table = "[[mask_empty_context_lse]]\n";
    let carrying = |text: &str| {
        let s = parse("t.toml", text).unwrap();
        let names: Vec<String> = s
            .archs
            .iter()
            .filter(|a| s.carries_ptx(a))
            .map(Arch::name)
            .collect();
        names
    };
    let archs = "arch = [\"sm_80\", \"sm_90a\", \"sm_90\", \"compute_86\", \"sm_100a\"]\n";
    // Absent = "every": today's behaviour.
    assert_eq!(carrying(&format!("{archs}{table}")).len(), 5);
    assert_eq!(
        carrying(&format!("{archs}ptx = \"every\"\n{table}")).len(),
        5
    );
    // "newest": the newest target that is not arch-specific (sm_90: sm_100a's PTX runs on
    // 10.0 alone), and every compute_ target, which is nothing but PTX.
    assert_eq!(
        carrying(&format!("{archs}ptx = \"newest\"\n{table}")),
        ["sm_90", "compute_86"]
    );
    // An arch override keeps the choice and finds the newest among the new targets.
    let mut s = parse("t.toml", &format!("{archs}ptx = \"newest\"\n{table}")).unwrap();
    override_archs(&mut s, &["sm_80".into(), "sm_120".into()], "--arch").unwrap();
    assert!(!s.carries_ptx(&s.archs[0]) && s.carries_ptx(&s.archs[1]));

    assert_eq!(
        err(&format!("ptx = \"oldest\"\n{table}")),
        "t.toml:1:7: `ptx`: \"oldest\" is not allowed; allowed: every, newest"
    );
    assert_eq!(
        err(&format!("ptx = true\n{table}")),
        "t.toml:1:7: `ptx`: expected a string, got true; allowed: every, newest"
    );
}

#[test]
fn sources_false_leaves_out_the_cu_files() {
    let table = "[[mask_empty_context_lse]]\n";
    assert!(parse("t.toml", table).unwrap().sources, "default: written");
    assert!(
        !parse("t.toml", &format!("sources = false\n{table}"))
            .unwrap()
            .sources
    );
    assert_eq!(
        err(&format!("sources = \"no\"\n{table}")),
        "t.toml:1:11: `sources`: expected true or false, got \"no\""
    );
}

#[test]
fn an_arch_override_is_refused_where_it_would_drop_the_sm_90_target() {
    let mut s = parse(
        "t.toml",
        "[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 128\npdl = true\n",
    )
    .unwrap();
    let e = override_archs(&mut s, &["sm_80".to_string()], "--arch")
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("--arch: `pdl` = true needs a target of sm_90"),
        "{e}"
    );
    assert_eq!(s.archs.len(), 2, "the spec keeps its archs");
    override_archs(&mut s, &["sm_90".to_string()], "--arch").unwrap();
}

#[test]
fn an_arch_override_names_its_origin_and_refuses_an_empty_item() {
    let mut s = parse("t.toml", "[[mask_empty_context_lse]]\n").unwrap();
    assert_eq!(s.archs_from, "the spec");
    let e = override_archs(&mut s, &["bogus".to_string()], ENV_ARCH)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("MLA_GEN_ARCH: `bogus` is not an architecture"),
        "{e}"
    );
    // `sm_90,` as clap splits it: the empty item is refused, wherever the list came from.
    let e = override_archs(&mut s, &["sm_90".into(), "".into()], "--arch")
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "--arch: an empty architecture in the list (a stray comma?)"
    );
    assert_eq!(
        s.archs_from, "the spec",
        "a refused override changes nothing"
    );
    override_archs(&mut s, &[" sm_90".into()], ENV_ARCH).unwrap();
    assert_eq!(
        (s.archs[0].name(), s.archs_from.as_str()),
        ("sm_90".to_string(), ENV_ARCH)
    );
}

#[test]
fn lse_base_is_a_key_of_the_merges_and_names_its_kernels() {
    let s = parse(
        "t.toml",
        "[[merge_state_in_place]]\ndtype = \"bf16\"\nhead_size = 128\nlse_base = [\"e\", \"2\"]\n\
         [[merge_states]]\ndtype = \"bf16\"\nhead_size = 128\nnum_states = 4\nlse_base = \"2\"\n",
    )
    .unwrap();
    assert_eq!(
        s.kernel_names(),
        [
            "merge_states_bf16_d128_k4_lse_base2",
            "merge_state_in_place_bf16_d128",
            "merge_state_in_place_bf16_d128_base2",
        ]
    );
    // Only base 2 names it: a base-e call states no lse_base (docs/MANIFEST.md, "Selection").
    let select = |i: usize| crate::gen::abi::contract(&s.variants[i]).select;
    assert_eq!(select(0).get("lse_base").map(String::as_str), Some("2"));
    assert_eq!(select(1).get("lse_base"), None);
    let e = err("[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 128\nlse_base = \"10\"\n");
    assert!(
        e.starts_with("t.toml:4:12: `lse_base`: \"10\" is not allowed; allowed: e, 2"),
        "{e}"
    );
    let e = err("[[mask_empty_context_lse]]\nlse_base = \"2\"\n");
    assert!(
        e.contains("`lse_base` is not a key of [[mask_empty_context_lse]]"),
        "{e}"
    );
}
