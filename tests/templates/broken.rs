//! The embedded templates with one compile error, for tests of what a failed compile reports
//! and leaves behind (tests/compile.rs, tests/reliability.rs).

use std::path::Path;

/// Writes every embedded template into `dir`, merge_attn_states's with an undefined symbol
/// (`undefined_symbol`) in its kernel body.
pub fn write_with_undefined_symbol(dir: &Path) {
    for (name, text) in mla_gen::render::EMBEDDED_TEMPLATES {
        let text = if name == "merge_attn_states.cu.tera" {
            let line = "if (h >= heads) return;";
            assert!(text.contains(line), "the test's anchor left {name}");
            text.replace(line, "if (h >= heads + undefined_symbol) return;")
        } else {
            text.to_string()
        };
        std::fs::write(dir.join(name), text).unwrap();
    }
}
