//! `include_default = true`: a spec that adds kernels to the embedded default spec's.

use super::*;

const EXTRA: &str = "[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 128\noutput = \"fp8_e4m3_group\"\ngroup_size = 32\nsize_rule = false\ndense = false\n";

#[test]
fn the_default_kernels_come_first_then_the_specs_own() {
    let default = default_spec().unwrap();
    let s = parse("mine.toml", &format!("include_default = true\n{EXTRA}")).unwrap();
    let names = s.kernel_names();
    assert_eq!(names[..default.variants.len()], default.kernel_names()[..]);
    assert_eq!(
        names[default.variants.len()..],
        ["merge_attn_states_bf16_d128_thr_lse_fp8g32"]
    );
    // The default's top-level keys where the spec leaves them out; the spec's own where it
    // sets them.
    assert_eq!(s.archs, default.archs);
    assert_eq!((s.ptx, s.sources), (default.ptx, default.sources));
    assert_eq!(s.origin, "mine.toml");
    let s = parse(
        "mine.toml",
        &format!("include_default = true\narch = [\"sm_90\"]\nsources = true\n{EXTRA}"),
    )
    .unwrap();
    assert_eq!(
        s.archs.iter().map(Arch::name).collect::<Vec<_>>(),
        ["sm_90"]
    );
    assert!(s.sources && s.ptx == default.ptx);
    // Alone, it is the default spec; false is as if absent.
    let alone = parse("mine.toml", "include_default = true\n").unwrap();
    assert_eq!(alone.kernel_names(), default.kernel_names());
    let without = parse("mine.toml", &format!("include_default = false\n{EXTRA}")).unwrap();
    assert_eq!(
        without.kernel_names(),
        ["merge_attn_states_bf16_d128_thr_lse_fp8g32"]
    );
    assert_eq!(without.archs.len(), DEFAULT_ARCHS.len());
}

#[test]
fn a_default_kernel_listed_again_is_kept_once_unless_its_options_differ() {
    let default = default_spec().unwrap();
    // The same kernel (block 8 of the default: FlashInfer's K-way merge), with its twins (none).
    let same = "include_default = true\n[[merge_states]]\ndtype = \"bf16\"\nhead_size = [128, 100]\nnum_states = \"runtime\"\nlse_base = \"2\"\n";
    let s = parse("mine.toml", same).unwrap();
    assert_eq!(s.variants.len(), default.variants.len() + 1);
    assert_eq!(
        s.kernel_names().last().map(String::as_str),
        Some("merge_states_bf16_d100_kvar_lse_base2")
    );
    // A default kernel by name with other twins (dense on where the default has it off).
    let other = "include_default = true\n\n[[merge_attn_states]]\ndtype = \"bf16\"\nhead_size = 128\nprefix_threshold = false\nlse_layout = \"token_major\"\n";
    let e = err(other);
    assert!(
        e.starts_with("t.toml:3:1: kernel `merge_attn_states_bf16_d128_lse_tm` is also in the embedded default spec (`include_default = true`)"),
        "{e}"
    );
    // Within the spec's own tables a repeat stays an error, as without the default.
    let e = err(&format!("include_default = true\n{EXTRA}{EXTRA}"));
    assert!(e.contains("is also produced by the table at line 2"), "{e}");
}

#[test]
fn include_default_takes_a_boolean() {
    let e = err("include_default = \"yes\"\n");
    assert!(e.starts_with("t.toml:1:19: `include_default`"), "{e}");
}
