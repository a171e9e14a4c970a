//! The integration snippets of the host pages README.md links (docs/RUST.md, docs/C.md,
//! docs/PYTHON.md) are files the tests build: this keeps them verbatim in those pages, so a snippet
//! cannot drift from code that compiles. (examples/engine/build.rs is built by CI;
//! examples/c/snippet.c by tests/c_launcher.rs; the Python snippet is byte-compiled here.) The
//! spec blocks of docs/SPEC.md must parse.

const README: &str = include_str!("../README.md");
const RUST_PAGE: &str = include_str!("../docs/RUST.md");
const C_PAGE: &str = include_str!("../docs/C.md");
const PYTHON_PAGE: &str = include_str!("../docs/PYTHON.md");
const SPEC_PAGE: &str = include_str!("../docs/SPEC.md");

#[test]
fn the_pages_hold_the_compiled_snippets_verbatim() {
    for (page, text, file, snippet) in [
        (
            "docs/RUST.md",
            RUST_PAGE,
            "examples/engine/build.rs",
            include_str!("../examples/engine/build.rs"),
        ),
        (
            "docs/PYTHON.md",
            PYTHON_PAGE,
            "python/examples/snippet.py",
            include_str!("../python/examples/snippet.py"),
        ),
        (
            "docs/C.md",
            C_PAGE,
            "examples/c/snippet.c",
            include_str!("../examples/c/snippet.c"),
        ),
    ] {
        assert!(
            text.contains(snippet),
            "{page} must contain {file} verbatim"
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

/// A page's fenced blocks, as (language, text).
fn blocks(page: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut current: Option<(String, String)> = None;
    for line in page.lines() {
        match (&mut current, line.strip_prefix("```")) {
            (None, Some(lang)) => current = Some((lang.trim().to_string(), String::new())),
            (Some(_), Some(_)) => out.extend(current.take()),
            (Some((_, text)), None) => {
                text.push_str(line);
                text.push('\n');
            }
            (None, None) => {}
        }
    }
    out
}

/// Every Rust and C block of README.md, docs/RUST.md, docs/SPEC.md and docs/PYTHON.md is made of
/// lines of files that CI compiles (the example engine, the C examples); every Python block
/// byte-compiles; every spec block parses; other blocks (shell, cmake, untagged) are not read.
/// (docs/C.md's snippet is checked verbatim above, its API block against the header below.)
#[test]
fn every_block_is_compiled_code_or_a_valid_spec() {
    let root = env!("CARGO_MANIFEST_DIR");
    let read = |f: &str| std::fs::read_to_string(format!("{root}/{f}")).unwrap();
    let rust = read("examples/engine/src/main.rs") + &read("examples/engine/build.rs");
    let mut c = String::new();
    for e in std::fs::read_dir(format!("{root}/examples/c")).unwrap() {
        let path = e.unwrap().path();
        if path.extension().is_some_and(|x| x == "c") {
            c += &std::fs::read_to_string(path).unwrap();
        }
    }
    let (mut checked, mut python) = (0, 0);
    for (page, text_of_page) in [
        ("README.md", README),
        ("docs/RUST.md", RUST_PAGE),
        ("docs/SPEC.md", SPEC_PAGE),
        ("docs/PYTHON.md", PYTHON_PAGE),
    ] {
        for (i, (lang, text)) in blocks(text_of_page).into_iter().enumerate() {
            let sources = match lang.as_str() {
                "rust" => &rust,
                "c" => &c,
                "python" => {
                    let name = format!("mla-gen-{}-{i}.py", page.replace(['/', '.'], "-"));
                    let file = std::env::temp_dir().join(name);
                    std::fs::write(&file, &text).unwrap();
                    let o = std::process::Command::new("python3")
                        .args(["-m", "py_compile"])
                        .arg(&file)
                        .output()
                        .unwrap();
                    assert!(
                        o.status.success(),
                        "{page} python block {i} does not compile:\n{text}\n{}",
                        String::from_utf8_lossy(&o.stderr)
                    );
                    python += 1;
                    continue;
                }
                "toml" if text.contains("[[") => {
                    if let Err(e) = mla_gen::spec::parse(page, &text) {
                        panic!("{page} spec block {i} does not parse: {e}\n{text}");
                    }
                    checked += 1;
                    continue;
                }
                _ => continue,
            };
            for line in text.lines().map(str::trim) {
                if line.is_empty() || line.starts_with("//") || line.starts_with("/*") {
                    continue;
                }
                assert!(
                    sources.lines().any(|l| l.trim() == line),
                    "{page} {lang} block {i}: `{line}` is in no file CI compiles"
                );
            }
            checked += 1;
        }
    }
    // README: a Rust and a C block; docs/RUST.md: two Rust blocks; docs/SPEC.md: two spec blocks;
    // a Python block in README and in docs/PYTHON.md.
    assert!(
        checked >= 6 && python >= 2,
        "{checked} blocks, {python} python"
    );
}

/// Without a CUDA driver cudarc panics at `CudaContext::new`, before `Runtime::load` can return
/// an error: the page asks `driver_present()` before the first context it shows.
#[test]
fn the_rust_page_checks_for_a_driver_before_making_a_context() {
    // In the code that makes it, not in the prose around it.
    let context = RUST_PAGE
        .find("let ctx = CudaContext::new(0)")
        .expect("docs/RUST.md's code makes the context");
    let block = RUST_PAGE[..context]
        .rfind("```rust")
        .expect("the context is made inside a ```rust block");
    assert!(
        RUST_PAGE[block..context].contains("runtime::driver_present()"),
        "docs/RUST.md's code must ask runtime::driver_present() before CudaContext::new(0)"
    );
}

/// docs/C.md's API block against the header template every C launcher is rendered from: each
/// status value and each function it declares (the fixed names, not `mla_<kernel>`).
#[test]
fn the_c_pages_api_block_is_what_the_header_declares() {
    let header = include_str!("../templates/c/mla_kernels.h.tera");
    let api = &C_PAGE[C_PAGE.find("## API").expect("docs/C.md has an API section")..];
    let (_, block) = blocks(api)
        .into_iter()
        .find(|(lang, _)| lang == "c")
        .expect("a c block under ## API");
    let (mut values, mut functions) = (0, 0);
    for word in block.split([',', '\n', '{', '}']).map(str::trim) {
        // `MLA_OK = 0` -> the template's `{{ P }}_OK = 0`
        if let Some((name, value)) = word.split_once(" = ") {
            if let Some(rest) = name.strip_prefix("MLA_") {
                let value = value.split_whitespace().next().unwrap_or_default();
                let want = format!("{{{{ P }}}}_{rest} = {value}");
                assert!(
                    header.contains(&want),
                    "docs/C.md says MLA_{rest} = {value}; the header lacks {want}"
                );
                values += 1;
            }
        }
    }
    for line in block.lines() {
        // `const char* mla_status_string(...)` -> `{{ p }}_status_string(`
        let Some(at) = line.find(" mla_") else {
            continue;
        };
        let Some((name, _)) = line[at + 5..].split_once('(') else {
            continue;
        };
        if name.contains(['<', ' ']) {
            continue; // mla_<kernel>: one per kernel, not in the template by name
        }
        let want = format!("{{{{ p }}}}_{name}(");
        assert!(
            header.contains(&want),
            "docs/C.md declares mla_{name}; the header lacks {want}"
        );
        functions += 1;
    }
    assert!(
        values >= 5 && functions >= 6,
        "{values} values, {functions} functions read"
    );
}
