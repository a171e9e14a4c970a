//! Fuzzing parse + validate + expand: no panic, no hang, bounded output, for arbitrary bytes and
//! for structure-aware TOML built from the spec's own keys with values of every type.
//! Cases per property: PROPTEST_CASES (CI default below; the longer run is in docs/RELIABILITY.md).

use std::time::{Duration, Instant};

use proptest::prelude::*;

use mla_gen::spec::{self, MAX_VARIANTS};

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(512);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Parse must return (Ok or a located error) quickly, and an Ok spec must be sane; the spec, or
/// the error text where it refused.
fn check(text: &str) -> Result<spec::Spec, String> {
    let started = Instant::now();
    let result = spec::parse("fuzz.toml", text);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "slow parse: {text:?}"
    );
    match result {
        Ok(s) => {
            assert!(!s.variants.is_empty() && s.variants.len() <= MAX_VARIANTS);
            assert!(!s.archs.is_empty());
            let mut names = s.kernel_names();
            names.sort();
            names.dedup();
            assert_eq!(names.len(), s.variants.len(), "duplicate kernel names");
            // A pdl kernel is never accepted without a target that has griddepcontrol.
            if s.variants.iter().any(|v| v.pdl) {
                assert!(
                    s.archs.iter().any(|a| a.major_minor >= 90),
                    "pdl without sm_90+: {text:?}"
                );
            }
            // Every size rule's kernels are in the spec, without a rule of their own.
            for v in s.variants.iter().filter(|v| !v.size_rule.is_empty()) {
                for r in &v.size_rule {
                    let alt = s.find(&v.range_kernel(r).kernel_name());
                    let alt = alt.unwrap_or_else(|| panic!("rule kernel missing: {text:?}"));
                    assert!(alt.size_rule.is_empty() && alt.role.rows_below == Some(r.below_rows));
                }
            }
            for n in &names {
                assert!(
                    n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                    "{n}"
                );
            }
            Ok(s)
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.starts_with("fuzz.toml"), "{msg}");
            Err(msg)
        }
    }
}

const KEYS: [&str; 21] = [
    "pdl",
    "size_rule",
    "dense",
    "mask_empty_context",
    "group_size",
    "ue8m0",
    "num_states",
    "mask",
    "dtype",
    "head_size",
    "prefix_threshold",
    "output_lse",
    "output",
    "lse_layout",
    "rows_per_thread",
    "min_blocks_per_sm",
    "block_threads",
    "heads_per_block",
    "arch",
    "head_sise",
    "\"quoted key\"",
];

fn scalar() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        (0i64..1100).prop_map(|n| n.to_string()),
        any::<bool>().prop_map(|b| b.to_string()),
        any::<f64>().prop_map(|f| format!("{f:?}")),
        prop::sample::select(vec![
            "\"bf16\"",
            "\"f16\"",
            "\"f32\"",
            "\"fp8\"",
            "\"same\"",
            "\"head_major\"",
            "\"token_major\"",
            "\"runtime\"",
            "\"fp8_e4m3_group\"",
            "\"sm_90\"",
            "\"sm_80\"",
            "\"sm_100\"",
            "\"compute_90\"",
            "\"sm_9x\"",
            "\"\"",
            "\"*/\"",
            "\"{{ x }}\"",
            "\"\\n\"",
            "inf",
            "nan",
            "-0",
        ])
        .prop_map(str::to_string),
        "[a-z_\"{}*/#\\\\ ]{0,12}".prop_map(|s| format!("{s:?}")),
    ]
}

fn value() -> impl Strategy<Value = String> {
    let leaf = scalar();
    leaf.prop_recursive(3, 24, 8, |inner| {
        prop::collection::vec(inner, 0..8).prop_map(|v| format!("[{}]", v.join(", ")))
    })
}

fn table() -> impl Strategy<Value = String> {
    prop::collection::vec((prop::sample::select(KEYS.to_vec()), value()), 0..8).prop_map(|kvs| {
        kvs.iter()
            .map(|(k, v)| format!("{k} = {v}\n"))
            .collect::<String>()
    })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = check(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn structured_specs_never_panic(
        top in prop::option::of(value()),
        tables in prop::collection::vec(table(), 0..4),
        header in prop::sample::select(vec![
            "[[merge_attn_states]]", "[merge_attn_states]", "[[merge_attn_statez]]",
            "[[merge_states]]", "[[merge_state_in_place]]", "[[mask_empty_context_lse]]",
        ]),
    ) {
        let mut text = String::new();
        if let Some(v) = top {
            text.push_str(&format!("arch = {v}\n"));
        }
        for t in tables {
            text.push_str(header);
            text.push('\n');
            text.push_str(&t);
        }
        let _ = check(&text);
    }

    /// Random tables rarely pass validation, so `check`'s accepted-spec branch (size rules, pdl
    /// targets, unique names) gets specs built to pass, with and without rules and pdl.
    #[test]
    fn accepted_specs_keep_their_size_rules_and_pdl_targets(
        dtypes in prop::sample::subsequence(vec!["f32", "f16", "bf16"], 1..=3),
        heads in prop::sample::subsequence(vec![64u32, 80, 96, 128, 256, 512], 1..=3),
        pdl in any::<bool>(),
        rule in any::<bool>(),
        arch in prop::sample::select(vec![r#"["sm_90"]"#, r#"["sm_90", "sm_100"]"#, r#"["sm_100"]"#]),
    ) {
        let text = format!(
            "arch = {arch}\n[[merge_attn_states]]\ndtype = {dtypes:?}\nhead_size = {heads:?}\n\
             pdl = {pdl}\nsize_rule = {rule}\n"
        );
        let s = check(&text);
        prop_assert!(s.is_ok(), "{}: {:?}", text, s.err());
        let s = s.unwrap();
        // bf16 at 64 has a tuned rule (specs/tuned.toml); without `size_rule`, no kernel has one.
        let bf16_64 = dtypes.contains(&"bf16") && heads.contains(&64);
        let ruled = s.variants.iter().any(|v| !v.size_rule.is_empty());
        prop_assert!(if rule { ruled || !bf16_64 } else { !ruled }, "{}", text);
        prop_assert!(s.variants.iter().all(|v| v.pdl == pdl), "{}", text);
    }

    #[test]
    fn valid_specs_expand_to_the_product_of_their_lists(
        dtypes in prop::sample::subsequence(vec!["f32", "f16", "bf16"], 1..=3),
        heads in prop::collection::btree_set(1u32..=1024, 1..6),
        thr in prop::sample::subsequence(vec![true, false], 1..=2),
    ) {
        let text = format!(
            "[[merge_attn_states]]\ndtype = {:?}\nhead_size = {:?}\nprefix_threshold = {:?}\n",
            dtypes, heads.iter().collect::<Vec<_>>(), thr
        );
        let s = spec::parse("fuzz.toml", &text).unwrap();
        // The kernels callers name; size rules add kernels of their own (rows_below), and each
        // of those kernels has its dense specialization, and with the threshold a second one
        // (the all-context twin); where its blocks hold several heads, the `_flat` ones too.
        let called = s.variants.iter().filter(|v| v.role.is_named()).count();
        prop_assert_eq!(called, dtypes.len() * heads.len() * thr.len());
        let general = s.variants.iter().filter(|v| v.role.twin_of.is_empty());
        let expected: usize = general
            .map(|v| {
                let twins = if v.prefix_threshold { 2 } else { 1 };
                1 + twins * if v.role.twins.contains(spec::Twin::FewHeads) { 2 } else { 1 }
            })
            .sum();
        prop_assert_eq!(s.variants.len(), expected);
    }
}

/// docs/MANIFEST.md's artifact rule over arch names: the arch whose image a device of `cc` runs.
fn picked(archs: &[mla_gen::spec::Arch], cc: u32) -> Option<u32> {
    let cubin = archs
        .iter()
        .filter(|a| a.real)
        .filter(|a| {
            if a.arch_specific {
                a.major_minor == cc
            } else {
                a.major_minor / 10 == cc / 10 && a.major_minor <= cc
            }
        })
        .map(|a| a.major_minor)
        .max();
    cubin.or_else(|| {
        archs
            .iter()
            .filter(|a| !a.arch_specific && a.major_minor <= cc)
            .map(|a| a.major_minor)
            .max()
    })
}

proptest! {
    #![proptest_config(config())]

    /// A spec with a pdl kernel is accepted only where every device of compute capability 9.0 or
    /// newer that has an image runs one built for sm_90+ (the one that waits): hosts decide the
    /// launch attribute by the device alone.
    #[test]
    fn pdl_specs_never_give_a_new_device_an_image_without_the_wait(
        archs in prop::sample::subsequence(
            vec!["sm_80", "compute_80", "sm_86", "sm_89", "sm_90", "compute_90", "sm_90a", "sm_100", "compute_100", "sm_100a", "sm_120"],
            1..=4,
        ),
    ) {
        let text = format!(
            "arch = {archs:?}\n[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 128\npdl = true\n"
        );
        if let Ok(s) = spec::parse("fuzz.toml", &text) {
            for cc in [90, 100, 103, 110, 120, 121] {
                if let Some(arch) = picked(&s.archs, cc) {
                    prop_assert!(arch >= 90, "{archs:?}: cc {cc} runs an sm_{arch} image");
                }
            }
        } else {
            // Refused only with no sm_90+ target, or a PTX below sm_90 without a plain sm_90 or
            // compute_90 beside it (conservative: a future 9.x device could run that PTX).
            let parsed: Vec<_> = archs.iter().map(|a| mla_gen::spec::Arch::parse(a).unwrap()).collect();
            let plain = |a: &&mla_gen::spec::Arch| !a.arch_specific;
            prop_assert!(
                parsed.iter().all(|a| a.major_minor < 90)
                    || (parsed.iter().filter(plain).any(|a| a.major_minor < 90)
                        && !parsed.iter().filter(plain).any(|a| a.major_minor == 90)),
                "{archs:?} refused"
            );
        }
    }
}

#[test]
fn deep_nesting_and_huge_lists_are_refused_quickly() {
    // check() bounds the time and the error's form; each of these must also be an error.
    let refused = |text: &str| {
        let e = check(text)
            .err()
            .unwrap_or_else(|| panic!("accepted: {}...", &text[..text.len().min(80)]));
        println!("refused: {}", e.lines().next().unwrap_or(""));
    };
    refused(&format!(
        "arch = {}{}\n",
        "[".repeat(5000),
        "]".repeat(5000)
    ));
    let many: Vec<String> = (1..=1024).map(|n| n.to_string()).collect();
    refused(&format!(
        "[[merge_attn_states]]\ndtype = [\"f32\", \"f16\", \"bf16\"]\nhead_size = [{}]\nrows_per_thread = [1, 2, 4, 8]\nblock_threads = [128, 256, 512, 1024]\nheads_per_block = [1, 2, 4, 8]\n",
        many.join(", ")
    ));
    refused(&"[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 64\n".repeat(3000));
}
