//! Compile: rendered sources -> PTX (every arch the spec's `ptx` keeps it for) and CUBIN (every
//! `sm_` arch) through NVRTC, with ptxas' resource report. Variants compile in parallel; results
//! keep the spec's order, so the output never depends on the thread count.

use std::io::IsTerminal;

use rayon::prelude::*;
use serde::Serialize;

use crate::gen::nvrtc::{self, Nvrtc, NvrtcError};
use crate::gen::render::{RenderError, Templates};
use crate::gen::spec::{Arch, MergeVariant, Spec};

/// Options every compilation gets, before the architecture.
pub const BASE_OPTIONS: [&str; 1] = ["-std=c++17"];

/// Registers, spills and memory of one kernel on one real architecture (from ptxas -v).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct Resources {
    pub registers: u32,
    pub spill_store_bytes: u32,
    pub spill_load_bytes: u32,
    pub stack_frame_bytes: u32,
    pub shared_mem_bytes: u32,
}

#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ArchOutput {
    pub arch: Arch,
    pub options: Vec<String>,
    /// Absent where the spec's `ptx = "newest"` leaves it out.
    pub ptx: Option<Vec<u8>>,
    pub cubin: Option<Vec<u8>>,
    pub resources: Option<Resources>,
}

#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct CompiledKernel {
    pub variant: MergeVariant,
    pub name: String,
    pub source: String,
    pub archs: Vec<ArchOutput>,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CompileError {
    #[error(transparent)]
    Nvrtc(#[from] NvrtcError),
    #[error(transparent)]
    Render(#[from] RenderError),
    #[error(transparent)]
    Failed(Box<FailedCompile>),
    #[error("could not start {jobs} compile threads: {detail}")]
    Threads { jobs: usize, detail: String },
}

/// A kernel NVRTC rejected: which, how, and the source lines its log points at.
#[derive(Debug, thiserror::Error)]
#[error(
    "NVRTC failed to compile {kernel} for {arch} ({message})\noptions: {options}\n{log}{context}"
)]
#[non_exhaustive]
pub struct FailedCompile {
    pub kernel: String,
    pub arch: String,
    pub message: String,
    pub options: String,
    pub log: String,
    pub context: String,
}

pub fn options_for(arch: &Arch) -> Vec<String> {
    let mut o: Vec<String> = BASE_OPTIONS.iter().map(|s| s.to_string()).collect();
    match arch.real_name() {
        Some(real) => {
            o.push(format!("--gpu-architecture={real}"));
            o.push("--ptxas-options=-v".to_string());
        }
        None => o.push(format!("--gpu-architecture={}", arch.virtual_name())),
    }
    o
}

/// Parse ptxas' `-v` report for one entry.
pub(crate) fn parse_resources(log: &str) -> Option<Resources> {
    let mut r = Resources::default();
    let mut seen = false;
    for line in log.lines() {
        if let Some(rest) = line.split("Used ").nth(1) {
            if let Some(n) = rest.split_whitespace().next().and_then(|n| n.parse().ok()) {
                r.registers = n;
                seen = true;
            }
        }
        if line.contains("stack frame") {
            for part in line.split(',') {
                let n: Option<u32> = part.split_whitespace().find_map(|w| w.parse().ok());
                let Some(n) = n else { continue };
                if part.contains("stack frame") {
                    r.stack_frame_bytes = n;
                } else if part.contains("spill stores") {
                    r.spill_store_bytes = n;
                } else if part.contains("spill loads") {
                    r.spill_load_bytes = n;
                }
            }
        }
        if let Some(i) = line.find(" bytes smem") {
            if let Some(n) = line[..i]
                .rsplit([' ', ','])
                .next()
                .and_then(|n| n.parse().ok())
            {
                r.shared_mem_bytes = n;
            }
        }
    }
    seen.then_some(r)
}

/// The source lines an NVRTC log points at (`name.cu(12): error: ...`), with one line around each.
fn source_context(program_name: &str, source: &str, log: &str) -> String {
    let lines: Vec<&str> = source.lines().collect();
    let mut shown = Vec::new();
    let mut out = String::new();
    let prefix = format!("{program_name}(");
    for l in log.lines() {
        let Some(rest) = l.strip_prefix(&prefix) else {
            continue;
        };
        let Some(n) = rest.split(')').next().and_then(|n| n.parse::<usize>().ok()) else {
            continue;
        };
        if n == 0 || shown.contains(&n) {
            continue;
        }
        shown.push(n);
        out.push_str(&format!("\nsource around {program_name}:{n}:\n"));
        for i in n.saturating_sub(1).max(1)..=(n + 1).min(lines.len()) {
            let mark = if i == n { ">" } else { " " };
            out.push_str(&format!("{mark}{i:5} | {}\n", lines[i - 1]));
        }
    }
    out
}

fn compile_one(
    nvrtc: &Nvrtc,
    templates: &Templates,
    origin: &str,
    variant: &MergeVariant,
    archs: &[(Arch, bool)],
) -> Result<CompiledKernel, CompileError> {
    let name = variant.kernel_name();
    let source = templates.render(origin, variant)?;
    let program_name = format!("{name}.cu");
    let mut outs = Vec::with_capacity(archs.len());
    for (arch, want_ptx) in archs {
        let options = options_for(arch);
        let compiled = nvrtc.compile(&program_name, &source, &options, *want_ptx, arch.real)?;
        let compiled = compiled.map_err(|f| {
            CompileError::Failed(Box::new(FailedCompile {
                kernel: name.clone(),
                arch: arch.name(),
                message: f.message,
                options: options.join(" "),
                context: source_context(&program_name, &source, &f.log),
                log: f.log,
            }))
        })?;
        let resources = if arch.real {
            parse_resources(&compiled.log)
        } else {
            None
        };
        outs.push(ArchOutput {
            arch: arch.clone(),
            options,
            ptx: compiled.ptx,
            cubin: compiled.cubin,
            resources,
        });
    }
    Ok(CompiledKernel {
        variant: variant.clone(),
        name,
        source,
        archs: outs,
    })
}

/// Threads for `work` compile jobs when `jobs` were asked (0 = one per core): never more than
/// there are jobs, since each idle thread still costs a start (`-j 100000` would take minutes).
fn pool_threads(jobs: usize, work: usize) -> usize {
    let wanted = match jobs {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    wanted.min(work).max(1)
}

/// Compile every variant of `spec` for every arch, with `jobs` threads (0 = one per core).
pub fn compile_spec(
    nvrtc: &Nvrtc,
    templates: &Templates,
    spec: &Spec,
    jobs: usize,
    progress: bool,
) -> Result<Vec<CompiledKernel>, CompileError> {
    for arch in &spec.archs {
        nvrtc.check_arch(arch.major_minor, &arch.name(), &spec.archs_from)?;
    }
    let origin = spec.source_name();
    let targets: Vec<(Arch, bool)> = spec
        .archs
        .iter()
        .map(|a| (a.clone(), spec.carries_ptx(a)))
        .collect();
    let threads = pool_threads(jobs, spec.variants.len());
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| CompileError::Threads {
            jobs: threads,
            detail: e.to_string(),
        })?;
    let bar = (progress && spec.variants.len() > 4 && std::io::stderr().is_terminal()).then(|| {
        let bar = indicatif::ProgressBar::new(spec.variants.len() as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "compiling {bar:30} {pos}/{len} kernels x {msg} [{elapsed}]",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar.set_message(format!("{} arch", spec.archs.len()));
        bar
    });
    let result: Result<Vec<CompiledKernel>, CompileError> = pool.install(|| {
        spec.variants
            .par_iter()
            .map(|v| {
                let r = compile_one(nvrtc, templates, &origin, v, &targets);
                if let Some(b) = &bar {
                    b.inc(1);
                }
                r
            })
            .collect()
    });
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    result
}

/// Load NVRTC and compile: the compile stage's one entry point.
pub fn compile(
    templates: &Templates,
    spec: &Spec,
    jobs: usize,
    progress: bool,
) -> Result<(Vec<CompiledKernel>, &'static Nvrtc), CompileError> {
    let nvrtc = nvrtc::load()?;
    let kernels = compile_spec(nvrtc, templates, spec, jobs, progress)?;
    Ok((kernels, nvrtc))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptxas_report_is_parsed() {
        let log = "ptxas info    : 0 bytes gmem\nptxas info    : Compiling entry function 'k' for 'sm_90'\nptxas info    : Function properties for k\nptxas         .     8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\nptxas info    : Used 17 registers, used 0 barriers, 64 bytes smem\n";
        let r = parse_resources(log).expect("report present");
        assert_eq!(
            r,
            Resources {
                registers: 17,
                spill_store_bytes: 4,
                spill_load_bytes: 12,
                stack_frame_bytes: 8,
                shared_mem_bytes: 64
            }
        );
        assert_eq!(parse_resources("nothing here"), None);
    }

    #[test]
    fn pool_never_outnumbers_the_kernels() {
        assert_eq!(pool_threads(2000, 1), 1);
        assert_eq!(pool_threads(100_000, 3), 3);
        assert_eq!(pool_threads(2, 40), 2);
        assert_eq!(pool_threads(5, 0), 1);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(pool_threads(0, 1), 1);
        assert_eq!(pool_threads(0, 100_000), cores);
    }

    #[test]
    fn error_context_shows_the_pointed_line() {
        let src = "a\nb\nc\nd\n";
        let ctx = source_context("k.cu", src, "k.cu(3): error: bad\n");
        assert!(ctx.contains(">    3 | c"), "{ctx}");
        assert!(ctx.contains("     2 | b"));
        assert!(ctx.contains("     4 | d"));
    }
}
