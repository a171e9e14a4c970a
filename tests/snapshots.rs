//! Every change to generated CUDA is a reviewed diff: rendered sources and the manifest are
//! insta snapshots (`cargo insta review` to accept a change).

use mla_gen::dtype::Dtype;
use mla_gen::render::Templates;
use mla_gen::spec::{self, LseLayout, MergeVariant, OutputKind};

fn variant(dtype: Dtype, head_size: u32, prefix_threshold: bool, output_lse: bool) -> MergeVariant {
    MergeVariant {
        prefix_threshold,
        output_lse,
        ..MergeVariant::merge_attn_states(dtype, head_size)
    }
}

#[test]
fn every_dtype_and_option_at_head_size_128() {
    let t = Templates::embedded().unwrap();
    for dtype in [Dtype::F32, Dtype::F16, Dtype::Bf16] {
        for threshold in [true, false] {
            for lse in [true, false] {
                let v = variant(dtype, 128, threshold, lse);
                let src = t.render("snapshot.toml", &v).unwrap();
                insta::assert_snapshot!(v.kernel_name(), src);
            }
        }
    }
}

#[test]
fn head_sizes_in_bf16() {
    let t = Templates::embedded().unwrap();
    for d in [1, 64, 80, 96, 192, 512, 576] {
        let v = variant(Dtype::Bf16, d, true, true);
        insta::assert_snapshot!(v.kernel_name(), t.render("snapshot.toml", &v).unwrap());
    }
}

/// A dense specialization and its general kernel's launch naming it.
#[test]
fn dense_specialization() {
    let t = Templates::embedded().unwrap();
    let general = MergeVariant {
        role: spec::Role::offering(&[spec::Twin::Dense, spec::Twin::AllContext]),
        ..variant(Dtype::Bf16, 128, true, true)
    };
    let twins = general.specialization_twins();
    for twin in &twins {
        insta::assert_snapshot!(twin.kernel_name(), t.render("snapshot.toml", twin).unwrap());
    }
    // With a threshold: the twin for calls where every token has context first, then the dense.
    let names: Vec<String> = twins.iter().map(|t| t.kernel_name()).collect();
    assert_eq!(
        names,
        [
            "merge_attn_states_bf16_d128_thr_lse_dense_nothr",
            "merge_attn_states_bf16_d128_thr_lse_dense"
        ]
    );
    let launch = mla_gen::abi::Launch::for_variant(&general);
    assert_eq!(launch.specializations, names);
}

#[test]
fn explicit_schedule() {
    let t = Templates::embedded().unwrap();
    let mut v = variant(Dtype::Bf16, 128, true, true);
    v.schedule = spec::Schedule {
        rows_per_thread: 4,
        min_blocks_per_sm: 2,
        block_threads: 128,
        heads_per_block: 4,
        vecs_per_thread: 0,
    };
    v.explicit_schedule = true;
    insta::assert_snapshot!(v.kernel_name(), t.render("snapshot.toml", &v).unwrap());
}

#[test]
fn fp8_output() {
    let t = Templates::embedded().unwrap();
    for d in [128, 3] {
        let mut v = variant(Dtype::Bf16, d, true, true);
        v.output = OutputKind::Fp8E4m3;
        insta::assert_snapshot!(v.kernel_name(), t.render("snapshot.toml", &v).unwrap());
    }
}

#[test]
fn per_token_group_fp8_output() {
    let spec = spec::parse(
        "snapshot.toml",
        "[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 128\noutput = \"fp8_e4m3_group\"\ngroup_size = 64\nue8m0 = [false, true]\n",
    )
    .unwrap();
    let t = Templates::embedded().unwrap();
    for v in &spec.variants {
        insta::assert_snapshot!(v.kernel_name(), t.render("snapshot.toml", v).unwrap());
    }
}

#[test]
fn token_major_lse() {
    let t = Templates::embedded().unwrap();
    let mut v = variant(Dtype::Bf16, 128, true, true);
    v.lse_layout = LseLayout::TokenMajor;
    insta::assert_snapshot!(v.kernel_name(), t.render("snapshot.toml", &v).unwrap());
}

#[test]
fn manifest_with_versions_and_hashes_redacted() {
    let spec = spec::parse(
        "snapshot.toml",
        "arch = [\"sm_90\", \"compute_80\"]\n[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = [128, 576]\n",
    )
    .unwrap();
    let t = Templates::embedded().unwrap();
    let (_, manifest) = mla_gen::generate_files(&spec, &t, 1, false).unwrap();
    insta::assert_json_snapshot!(manifest, {
        ".generator.version" => "[version]",
        ".nvrtc.version" => "[nvrtc]",
        ".nvrtc.release" => "[nvrtc]",
        ".spec.sha256" => "[sha256]",
        ".templates_sha256" => "[sha256]",
        ".kernels[].inputs_sha256" => "[sha256]",
        ".kernels[].short_hash" => "[hash]",
        ".kernels[].source.sha256" => "[sha256]",
        ".kernels[].source.bytes" => "[bytes]",
        ".kernels[].archs[].ptx.sha256" => "[sha256]",
        ".kernels[].archs[].ptx.bytes" => "[bytes]",
        ".kernels[].archs[].cubin.sha256" => "[sha256]",
        ".kernels[].archs[].cubin.bytes" => "[bytes]",
        ".kernels[].archs[].resources" => "[ptxas report]",
    });
}

/// The K-way merge, in-place merge and lse mask, rendered from a spec as a user writes it.
#[test]
fn k_way_and_in_place_merges() {
    let spec = spec::parse(
        "snapshot.toml",
        "[[merge_states]]\ndtype = \"bf16\"\nhead_size = 128\nnum_states = [4, \"runtime\"]\n\
         [[merge_state_in_place]]\ndtype = \"f16\"\nhead_size = [128, 576]\nmask = [true, false]\n\
         [[mask_empty_context_lse]]\nlse_layout = [\"head_major\", \"token_major\"]\n",
    )
    .unwrap();
    let t = Templates::embedded().unwrap();
    let names = spec.kernel_names();
    assert_eq!(
        names,
        [
            "merge_states_bf16_d128_k4_lse",
            "merge_states_bf16_d128_kvar_lse",
            "merge_state_in_place_f16_d128_mask",
            "merge_state_in_place_f16_d576_mask",
            "merge_state_in_place_f16_d128",
            "merge_state_in_place_f16_d576",
            "mask_empty_context_lse",
            "mask_empty_context_lse_tm",
        ]
    );
    for v in &spec.variants {
        insta::assert_snapshot!(v.kernel_name(), t.render("snapshot.toml", v).unwrap());
    }
}

#[test]
fn fused_empty_context_mask() {
    let spec = spec::parse(
        "snapshot.toml",
        "[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 128\nmask_empty_context = true\nlse_layout = [\"head_major\", \"token_major\"]\n",
    )
    .unwrap();
    let t = Templates::embedded().unwrap();
    for v in &spec.variants {
        insta::assert_snapshot!(v.kernel_name(), t.render("snapshot.toml", v).unwrap());
    }
}

/// Programmatic dependent launch: the whole pairwise kernel, and for every family the lines pdl
/// adds (the rest of each source is the kernel without it, byte for byte, name aside).
#[test]
fn pdl_kernels() {
    let t = Templates::embedded().unwrap();
    let mut v = variant(Dtype::Bf16, 128, true, true);
    v.pdl = true;
    insta::assert_snapshot!(v.kernel_name(), t.render("snapshot.toml", &v).unwrap());

    let spec = spec::parse(
        "snapshot.toml",
        "[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 128\noutput = \"fp8_e4m3\"\npdl = true\n\
         [[merge_states]]\ndtype = \"bf16\"\nhead_size = 128\nnum_states = [4, \"runtime\"]\npdl = true\n\
         [[merge_state_in_place]]\ndtype = \"f16\"\nhead_size = 128\nmask = true\npdl = true\n\
         [[mask_empty_context_lse]]\npdl = true\n",
    )
    .unwrap();
    let mut added = String::new();
    for v in &spec.variants {
        let with = t.render("snapshot.toml", v).unwrap();
        let without = t
            .render(
                "snapshot.toml",
                &MergeVariant {
                    pdl: false,
                    ..v.clone()
                },
            )
            .unwrap();
        let name = v.kernel_name();
        let with = with.replace(&name, name.trim_end_matches("_pdl"));
        // pdl only inserts lines: walk both, collecting the lines `without` lacks.
        let mut rest = without.lines().peekable();
        added.push_str(&format!("== {name}\n"));
        for line in with.lines() {
            if rest.peek() == Some(&line) {
                rest.next();
            } else {
                added.push_str(line);
                added.push('\n');
            }
        }
        assert_eq!(rest.next(), None, "{name}: pdl removed a line");
    }
    insta::assert_snapshot!("pdl_added_lines", added);
}

/// A size rule as the manifest states it (`launch.size_rule`), and its range's kernel: the same
/// source but for the schedule and the name.
#[test]
fn size_rule_in_the_manifest() {
    let plain = spec::Schedule {
        rows_per_thread: 1,
        min_blocks_per_sm: 1,
        block_threads: 128,
        heads_per_block: 1,
        vecs_per_thread: 0,
    };
    let mut v = variant(Dtype::Bf16, 128, true, true);
    v.size_rule = vec![spec::SizeRange {
        below_rows: 4096,
        schedule: plain,
    }];
    let launch = mla_gen::abi::Launch::for_variant(&v);
    insta::assert_snapshot!(
        "size_rule_launch",
        serde_json::to_string_pretty(&launch.size_rule).unwrap()
    );
    let alt = v.range_kernel(&v.size_rule[0]);
    assert_eq!((alt.schedule, alt.role.rows_below), (plain, Some(4096)));
    assert_eq!(
        alt.kernel_name(),
        "merge_attn_states_bf16_d128_thr_lse_below4096"
    );
    let t = Templates::embedded().unwrap();
    insta::assert_snapshot!(alt.kernel_name(), t.render("snapshot.toml", &alt).unwrap());
}

/// `lse_base = "2"` (FlashInfer's): for each family that reads lse, the lines base 2 changes,
/// as (-) base e and (+) base 2; the rest of each source is the base-e kernel's, name aside.
#[test]
fn lse_base_2_kernels() {
    let t = Templates::embedded().unwrap();
    let spec = spec::parse(
        "snapshot.toml",
        "[[merge_attn_states]]\ndtype = [\"bf16\", \"f32\"]\nhead_size = 128\nlse_layout = \"token_major\"\nlse_base = \"2\"\nsize_rule = false\ndense = false\n\
         [[merge_states]]\ndtype = \"bf16\"\nhead_size = 128\nnum_states = 4\nlse_base = \"2\"\n\
         [[merge_state_in_place]]\ndtype = \"f16\"\nhead_size = 128\nlse_layout = \"token_major\"\nlse_base = \"2\"\n",
    )
    .unwrap();
    let mut changed = String::new();
    for v in &spec.variants {
        let name = v.kernel_name();
        let base_e = MergeVariant {
            lse_base: spec::LseBase::E,
            ..v.clone()
        };
        let with = t.render("snapshot.toml", v).unwrap();
        let with = with.replace(&name, &base_e.kernel_name());
        let without = t.render("snapshot.toml", &base_e).unwrap();
        let (with, without): (Vec<&str>, Vec<&str>) =
            (with.lines().collect(), without.lines().collect());
        changed.push_str(&format!("== {name}\n"));
        for line in without.iter().filter(|l| !with.contains(l)) {
            changed.push_str(&format!("- {line}\n"));
        }
        for line in with.iter().filter(|l| !without.contains(l)) {
            changed.push_str(&format!("+ {line}\n"));
        }
    }
    insta::assert_snapshot!("lse_base_2_changes", changed);
}
