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

/// The README's fenced blocks, as (language, text).
fn blocks() -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut current: Option<(String, String)> = None;
    for line in README.lines() {
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

/// Every Rust and C block is made of lines of files that CI compiles (the example engine, the C
/// examples); every Python block byte-compiles; every spec block parses.
#[test]
fn every_readme_block_is_compiled_code_or_a_valid_spec() {
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
    for (i, (lang, text)) in blocks().into_iter().enumerate() {
        let sources = match lang.as_str() {
            "rust" => &rust,
            "c" => &c,
            "python" => {
                let file = std::env::temp_dir().join(format!("mla-gen-readme-{i}.py"));
                std::fs::write(&file, &text).unwrap();
                let o = std::process::Command::new("python3")
                    .args(["-m", "py_compile"])
                    .arg(&file)
                    .output()
                    .unwrap();
                assert!(
                    o.status.success(),
                    "README python block {i} does not compile:\n{text}\n{}",
                    String::from_utf8_lossy(&o.stderr)
                );
                python += 1;
                continue;
            }
            "toml" if text.contains("[[") => {
                if let Err(e) = mla_gen::spec::parse("README.md", &text) {
                    panic!("README spec block {i} does not parse: {e}\n{text}");
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
                "README {lang} block {i}: `{line}` is in no file CI compiles"
            );
        }
        checked += 1;
    }
    assert!(
        checked >= 5 && python >= 3,
        "{checked} blocks, {python} python"
    );
}
