//! The shared selection table (tests/contract/select.json) through the generated C launcher:
//! the launcher for tests/contract/select.toml, and a C program with one block per case that
//! asks `mla_select` for the call and compares the kernel's name and `serves` with the table;
//! where the case launches, it fills the family's argument struct (every buffer given, in
//! memory of its own and long enough; the case's integers), launches through `mla_launch`
//! against the stub driver and compares the kernel launched. Then the artifact rule's table, one
//! stub device a case. The Rust selector (tests/contract.rs) and the Python package
//! (python/tests/test_select.py) run the same tables.

#[path = "c/common.rs"]
mod common;

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/contract");

/// End `program`'s main, build and run it: all `cases` must pass.
fn run(dir: &Path, launcher: &Path, stem: &str, mut program: String, cases: usize) {
    program.push_str(
        "    printf(\"%d cases, %d failed\\n\", cases, failures);\n    return failures != 0;\n}\n",
    );
    let stdout = common::run_program(dir, launcher, stem, &program);
    assert!(
        stdout.contains(&format!("{cases} cases, 0 failed")),
        "{stdout}"
    );
}

/// tests/contract/select.json.
fn select_table() -> Value {
    let text = std::fs::read_to_string(Path::new(DIR).join("select.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// A C string literal of the table's text (names and kernel names: no escapes needed).
fn c_string(s: &str) -> String {
    assert!(!s.contains(['"', '\\']), "{s}");
    format!("\"{s}\"")
}

/// A C array initializer of `items`, or of `empty` alone (C has no empty initializer).
fn initializer(items: &[String], empty: &str) -> String {
    if items.is_empty() {
        format!("{{ {empty} }}")
    } else {
        format!("{{ {} }}", items.join(", "))
    }
}

/// One block of the C program: the call, its selection, and where the case says, its launch.
fn block(case: &Value) -> String {
    let why = case["why"].as_str().unwrap();
    let family = case["family"].as_str().unwrap();
    let args = case["args"].as_object().unwrap();
    let mut b = String::new();
    writeln!(b, "    {{ /* {why} */").unwrap();
    let mut given = Vec::new();
    for (i, (name, a)) in args.iter().enumerate() {
        if let Some(v) = a.get("int") {
            given.push(format!(
                "{{ {}, 1, {}, INT64_C({}), NULL, 0, NULL }}",
                c_string(name),
                u8::from(!v.is_null()),
                v.as_i64().unwrap_or(0)
            ));
            continue;
        }
        let elem = a["elem"].as_str().map_or("NULL".into(), c_string);
        match a["shape"].as_array() {
            Some(shape) => {
                let sizes: Vec<String> = shape
                    .iter()
                    .map(|n| format!("INT64_C({})", n.as_i64().unwrap()))
                    .collect();
                // (A zero-length array is not C: a scalar's sizes point at a dummy.)
                let list = initializer(&sizes, "0");
                writeln!(b, "        static const int64_t shape{i}[] = {list};").unwrap();
                given.push(format!(
                    "{{ {}, 0, 0, 0, {elem}, {}, shape{i} }}",
                    c_string(name),
                    sizes.len()
                ));
            }
            None => given.push(format!(
                "{{ {}, 0, 0, 0, {elem}, 0, NULL }}",
                c_string(name)
            )),
        }
    }
    let options: Vec<String> = case["options"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| format!("{{ {}, {} }}", c_string(k), c_string(v.as_str().unwrap())))
        .collect();
    let (args_list, options_list) = (
        initializer(&given, "{ 0 }"),
        initializer(&options, "{ NULL, NULL }"),
    );
    writeln!(b, "        const mla_given args[] = {args_list};").unwrap();
    writeln!(b, "        const mla_option options[] = {options_list};").unwrap();
    let want = case["expect"].as_str().map_or("NULL".into(), c_string);
    let serves = case.get("serves").and_then(Value::as_bool).unwrap_or(true);
    writeln!(
        b,
        "        int serves = -1;\n        const char* got = mla_select({}, args, {}, options, {}, &serves);\n        selected({}, got, serves, {want}, {});",
        c_string(family),
        given.len(),
        options.len(),
        c_string(why),
        u8::from(serves)
    )
    .unwrap();
    if let Some(launch) = case.get("launch") {
        writeln!(
            b,
            "        mla_{family}_args a = MLA_{}_ARGS_INIT;",
            family.to_ascii_uppercase()
        )
        .unwrap();
        for (i, (name, a)) in args.iter().enumerate() {
            if a.get("int").is_none() {
                writeln!(
                    b,
                    "        a.{name} = (void*)(uintptr_t)(UINT64_C({}) << 40); a.{name}_numel = INT64_C(1) << 34;",
                    i + 1
                )
                .unwrap();
            }
        }
        for (name, v) in launch["ints"].as_object().unwrap() {
            writeln!(b, "        a.{name} = INT64_C({});", v.as_i64().unwrap()).unwrap();
        }
        writeln!(
            b,
            "        ran({}, got ? mla_launch(got, NULL, &a) : MLA_INVALID_ARGUMENT, {});",
            c_string(why),
            c_string(launch["runs"].as_str().unwrap())
        )
        .unwrap();
    }
    writeln!(b, "    }}").unwrap();
    b
}

const PRELUDE: &str = r#"/* Generated by tests/c_select.rs from tests/contract/select.json. */
#include "mla_kernels.h"

#include <stdio.h>
#include <string.h>

#include "driver_stub.h"

static int cases, failures;

static void selected(const char* why, const char* got, int serves, const char* want, int want_serves) {
    cases++;
    if (want ? got && strcmp(got, want) == 0 && serves == want_serves : got == NULL) return;
    failures++;
    printf("FAILED %s: want %s (serves %d), got %s (serves %d)\n", why, want ? want : "none", want_serves,
           got ? got : "none", serves);
}

static void ran(const char* why, mla_status s, const char* want) {
    if (s == MLA_OK && strcmp(last_kernel, want) == 0) return;
    failures++;
    printf("FAILED %s: want a launch of %s, got %s '%s', last kernel %s\n", why, want, mla_status_string(s),
           s == MLA_OK ? "" : mla_last_error(), last_kernel);
}

int main(void) {
"#;

#[test]
fn the_c_launcher_selects_every_call_of_the_shared_table_alike() {
    let table = select_table();
    let tmp = tempfile::tempdir().unwrap();
    let spec = std::fs::read_to_string(Path::new(DIR).join("select.toml")).unwrap();
    let c = common::generate_c(tmp.path(), &spec, None);
    let mut program = String::from(PRELUDE);
    let cases = table["cases"].as_array().unwrap();
    for case in cases {
        program.push_str(&block(case));
    }
    program.push_str(NULL_NAMES);
    run(tmp.path(), &c, "select", program, cases.len() + 3);
}

/// Calls with a NULL argument name, option key or option value: no kernel, not a crash.
const NULL_NAMES: &str = r#"    {
        const int64_t shape[3] = { 8, 4, 128 };
        const mla_given args[] = { { NULL, 0, 0, 0, "bf16", 3, shape } };
        const mla_option no_key[] = { { NULL, "head_major" } }, no_value[] = { { "lse_layout", NULL } };
        int serves = -1;
        selected("a NULL argument name", mla_select("merge_attn_states", args, 1, NULL, 0, &serves), serves, NULL, 0);
        selected("a NULL option key", mla_select("merge_attn_states", NULL, 0, no_key, 1, &serves), serves, NULL, 0);
        selected("a NULL option value", mla_select("merge_attn_states", NULL, 0, no_value, 1, &serves), serves, NULL,
                 0);
    }
"#;

const ARTIFACT_PRELUDE: &str = r#"/* Generated by tests/c_select.rs from the artifacts of tests/contract/select.json. */
#include "mla_kernels.h"

#include <stdio.h>

#include "driver_stub.h"

int main(void) {
    int cases = 0, failures = 0;
"#;

/// The artifact rule's tables (`artifacts` of select.json) through the C launcher: one stub
/// device a case, of the case's compute capability; the image its launch loads.
#[test]
fn the_c_launcher_loads_the_artifact_of_the_shared_table_on_every_device() {
    let table = select_table();
    for t in table["artifacts"]["tables"].as_array().unwrap() {
        artifact_table(t);
    }
}

fn artifact_table(t: &Value) {
    // The table's archs are TOML strings as they are JSON ones.
    let ptx = t.get("ptx").and_then(Value::as_str).unwrap_or("every");
    let spec = format!(
        "arch = {}\nptx = \"{ptx}\"\n[[mask_empty_context_lse]]\n",
        t["archs"]
    );
    let tmp = tempfile::tempdir().unwrap();
    let c = common::generate_c(tmp.path(), &spec, None);
    let cases = t["cases"].as_array().unwrap();
    assert!(cases.len() <= 5, "the stub driver has 5 devices");
    let mut program = String::from(ARTIFACT_PRELUDE);
    for (device, case) in cases.iter().enumerate() {
        let cc = case["cc"].as_i64().unwrap();
        // Want: a launch that loaded one image of this arch and kind, or no image at all.
        let want = match case["expect"].as_object() {
            Some(e) => {
                let arch = e["arch"].as_str().unwrap();
                let number: String = arch.chars().filter(char::is_ascii_digit).collect();
                let cubin = e["cubin"].as_bool().unwrap();
                format!(
                    "s == MLA_OK && last_loaded_arch == {number} && cubins_loaded - cubins == {} && ptx_loaded - ptx == {}",
                    u8::from(cubin),
                    u8::from(!cubin)
                )
            }
            None => "s == MLA_NO_IMAGE_FOR_DEVICE".into(),
        };
        write!(
            program,
            r#"    {{ /* cc {cc} */
        mla_mask_empty_context_lse_args a = MLA_MASK_EMPTY_CONTEXT_LSE_ARGS_INIT;
        a.lse = (float*)(uintptr_t)0x1000000; a.lse_numel = 32;
        a.query_start_loc = (const int32_t*)(uintptr_t)0x2000000; a.query_start_loc_numel = 3;
        a.context_start_loc = (const int32_t*)(uintptr_t)0x3000000; a.context_start_loc_numel = 3;
        a.num_requests = 2; a.num_tokens = 8; a.num_heads = 4;
        stub_cc[{device}] = {cc};
        stub_device = {device};
        mla_unload();
        const int cubins = cubins_loaded, ptx = ptx_loaded;
        const mla_status s = mla_mask_empty_context_lse(NULL, &a);
        cases++;
        if (!({want})) {{
            failures++;
            printf("FAILED cc {cc}: %s '%s', last loaded %d\n", mla_status_string(s), mla_last_error(), last_loaded_arch);
        }}
        (void)cubins; (void)ptx;
    }}
"#
        )
        .unwrap();
    }
    run(tmp.path(), &c, "artifacts", program, cases.len());
}
