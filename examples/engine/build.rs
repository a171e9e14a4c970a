fn main() {
    // Kernels for engine.toml into OUT_DIR, plus the Rust module src/main.rs includes.
    // Unchanged inputs reuse the previous output and compile nothing.
    match mla_gen::Builder::new().spec_file("engine.toml").build() {
        Ok(built) if built.compiled => {
            println!("cargo:warning=mla-gen: compiled {} kernels", built.kernels)
        }
        Ok(_) => {}
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}
