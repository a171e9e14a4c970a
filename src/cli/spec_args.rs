//! The spec a command reads (`[SPEC] [--arch ..] [--templates DIR]`), shared by the commands of
//! main.rs and check.rs.

use std::path::PathBuf;

use clap::Args;
use mla_gen::render::Templates;
use mla_gen::spec::{self, Spec};

use crate::failure::Failure;

#[derive(Args, Clone)]
pub struct SpecArgs {
    /// Spec file (TOML); the embedded default spec when omitted.
    pub spec: Option<PathBuf>,
    /// Architectures to build for, replacing the spec's (e.g. --arch sm_90 or --arch sm_80,sm_90).
    #[arg(long, value_delimiter = ',')]
    pub arch: Vec<String>,
    /// Read templates from this folder instead of the embedded ones (template development).
    #[arg(long, value_name = "DIR")]
    pub templates: Option<PathBuf>,
}

pub fn load_spec(args: &SpecArgs) -> Result<Spec, Failure> {
    let mut spec = match &args.spec {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| Failure(format!("cannot read spec {}: {e}", path.display()), 1))?;
            spec::parse(&path.display().to_string(), &text)?
        }
        None => spec::default_spec()?,
    };
    // A bad `--arch` or `MLA_GEN_ARCH` is a usage error (exit 2), as clap's own are.
    spec::apply_arch_override(&mut spec, Some(&args.arch), "--arch")
        .map_err(|e| Failure(e.to_string(), 2))?;
    Ok(spec)
}

pub fn load_templates(args: &SpecArgs) -> Result<Templates, Failure> {
    Ok(match &args.templates {
        Some(dir) => Templates::from_dir(dir)?,
        None => Templates::embedded()?,
    })
}
