//! The README's integration snippets are files the tests build: this keeps them verbatim in the
//! README, so a snippet cannot drift from code that compiles. (examples/engine/build.rs is
//! built by CI; examples/c/snippet.c by tests/c_launcher.rs; the Python snippet is
//! byte-compiled here.)

const README: &str = include_str!("../README.md");

#[test]
fn readme_holds_the_compiled_snippets_verbatim() {
    for (file, text) in [
        (
            "examples/engine/build.rs",
            include_str!("../examples/engine/build.rs"),
        ),
        (
            "examples/c/snippet.c",
            include_str!("../examples/c/snippet.c"),
        ),
        (
            "python/examples/snippet.py",
            include_str!("../python/examples/snippet.py"),
        ),
    ] {
        assert!(
            README.contains(text),
            "README.md must contain {file} verbatim"
        );
    }
}

#[test]
fn the_python_snippet_byte_compiles() {
    let o = std::process::Command::new("python3")
        .args([
            "-m",
            "py_compile",
            concat!(env!("CARGO_MANIFEST_DIR"), "/python/examples/snippet.py"),
        ])
        .output()
        .expect("python3 is installed");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}
