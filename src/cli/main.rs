//! The `mla-gen` command line: renders errors, sets exit codes (0 ok, 1 failure, 2 usage).
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use failure::Failure;
use spec_args::{load_spec, load_templates, SpecArgs};

use mla_gen::emit::{self, WriteOutcome};

mod check;
mod doctor;
mod failure;
mod gpu;
mod report;
mod spec_args;

const ABOUT: &str =
    "Spec-driven, ahead-of-time CUDA for attention-state merges (merge_attn_states).

A TOML spec names the kernels an engine needs; mla-gen renders each one's CUDA from templates with
every choice fixed at compile time, compiles it with NVRTC (no nvcc, no GPU) to PTX and CUBIN, and
writes the files with a manifest that describes each kernel's parameters and launch rule.

Spec tables: [[merge_attn_states]] (pairwise, with threshold; output same, fp8_e4m3 or
fp8_e4m3_group), [[merge_states]] (K states in one pass), [[merge_state_in_place]] (optional
per-token mask) and [[mask_empty_context_lse]]. Every key is documented in docs/SPEC.md;
`mla-gen list SPEC` shows what a spec expands to.

Without a SPEC argument, the embedded default spec is used: the merges vLLM, SGLang and FlashInfer
call through the mla_gen package (vLLM's merge_attn_states with FP8 per tensor and per token group
and the fused empty-context mask, the token-major and base-2 pairwise merges, the K-way and
in-place merges, the lse mask; f16/bf16/f32, head sizes 64..576): 564 kernels, 1227 with their
size rules' and dense specializations, as CUBIN for sm_80, sm_90, sm_100 and sm_120, and PTX for
sm_120. A spec with `include_default = true` adds its own kernels to those.";

const AFTER_HELP: &str = "Examples:
  mla-gen generate                      # embedded default spec -> generated/
  mla-gen generate my.toml --out kernels --arch sm_90
  mla-gen list my.toml                  # kernel names, one per line
  mla-gen render --kernel merge_attn_states_bf16_d128_thr_lse
  mla-gen check                         # exit 1 if generated/ is stale, 2 if it cannot check
  mla-gen verify                        # generated/'s images are the ones its manifest hashes
  mla-gen doctor                        # where NVRTC is, which PTX it emits
  mla-gen completions bash > ~/.local/share/bash-completion/completions/mla-gen

Exit codes: 0 success; 1 failure (check: the folder is stale; verify: an image is missing,
differs, is not the kind (CUBIN, PTX) the manifest says or is named outside the folder);
2 usage errors (an unknown `render --kernel`, an --arch or MLA_GEN_ARCH that is refused, and
tune's and bench's unparsable --shapes or --only and an output file in a missing folder
included), for check, anything that kept it from comparing, and for verify, no manifest to read.

Environment:
  MLA_GEN_NVRTC   libnvrtc.so file or folder to use (nothing else is tried)
  MLA_GEN_ARCH    comma-separated architectures replacing the spec's (when --arch is absent)
  MLA_GEN_PYTHON  Python asked for its site-packages when looking for pip's NVRTC

NVRTC: install the pinned version with
  python3 -m pip install nvidia-cuda-nvrtc==13.0.88";

#[derive(Parser)]
#[command(name = "mla-gen", version, about = ABOUT, after_help = AFTER_HELP)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Args, Clone)]
struct CPrefixArg {
    /// With `--emit c`: the prefix of every exported C name and of the files
    /// (`c/<NAME>_kernels.{h,c}`, `<NAME>_load`, `<NAME>_status`, `<NAME upper-cased>_OK`); a C
    /// identifier.
    #[arg(long, value_name = "NAME", default_value = "mla", requires = "emit")]
    c_prefix: mla_gen::bindings::CPrefix,
}

#[derive(Args, Clone)]
struct JobsArg {
    /// Compile this many kernels at once (0 = one per core; never more threads than kernels).
    /// Output does not depend on it.
    #[arg(long, short = 'j', default_value_t = 0)]
    jobs: usize,
}

#[derive(Subcommand)]
enum Command {
    /// Compile every kernel of the spec and write sources, PTX, CUBIN and manifest.json.
    ///
    /// The output folder is replaced atomically: on any error it is left as it was, and files
    /// whose content did not change keep their timestamps. A README.md in it is kept.
    Generate {
        #[command(flatten)]
        spec: SpecArgs,
        /// Output folder.
        #[arg(long, short, default_value = "generated")]
        out: PathBuf,
        #[command(flatten)]
        jobs: JobsArg,
        /// Also write bindings: `c` = c/mla_kernels.h + c/mla_kernels.c (embedded images, checked
        /// launchers; compile with cuda.h, link -lcuda -pthread; docs/C.md).
        #[arg(long, value_enum)]
        emit: Vec<mla_gen::bindings::Emit>,
        #[command(flatten)]
        c_prefix: CPrefixArg,
        /// No summary on stderr.
        #[arg(long, short)]
        quiet: bool,
    },
    /// Print the spec's kernel names, one per line (no compilation).
    List {
        #[command(flatten)]
        spec: SpecArgs,
        /// One JSON object per kernel (name, family, variant, parameters) instead of names.
        #[arg(long)]
        json: bool,
        /// Per family, what a launch tries in which order (size rule, specializations, the
        /// kernel named) instead of names.
        #[arg(long, conflicts_with = "json")]
        decisions: bool,
    },
    /// Print one kernel's CUDA source (no compilation).
    Render {
        #[command(flatten)]
        spec: SpecArgs,
        /// Kernel name, as printed by `mla-gen list`.
        #[arg(long, short)]
        kernel: String,
    },
    /// Exit 0 when a folder matches a fresh generation, 1 naming each stale, missing or extra
    /// file, 2 when the check could not run (bad spec, no NVRTC, unreadable folder).
    ///
    /// A folder with no image at all (PTX, CUBIN: build outputs, e.g. a checkout that keeps only
    /// manifest.json in git) passes when its manifest and other text files are fresh: the
    /// manifest records every image's sha256. A README.md in the folder is a person's and not
    /// compared.
    Check {
        #[command(flatten)]
        spec: SpecArgs,
        /// Folder to check.
        #[arg(long, short, default_value = "generated")]
        out: PathBuf,
        #[command(flatten)]
        jobs: JobsArg,
        /// The bindings the folder was generated with (as for generate).
        #[arg(long, value_enum)]
        emit: Vec<mla_gen::bindings::Emit>,
        #[command(flatten)]
        c_prefix: CPrefixArg,
        /// The verdict as JSON on stdout: {"fresh", "images_built", "stale", "missing", "extra"}.
        #[arg(long)]
        json: bool,
    },
    /// Exit 0 when every image (PTX, CUBIN) a folder's manifest.json names is there, inside the
    /// folder, with the size and sha256 it records and of the kind it says (what a load checks), 1
    /// naming each missing, differing, other-kind or outside one, 2 when there is no manifest to read. Compiles nothing: it says whether a folder's images are built and
    /// intact, not whether the manifest is fresh (that is `check`).
    Verify {
        /// Folder to verify.
        #[arg(long, short, default_value = "generated")]
        out: PathBuf,
        /// Nothing on stderr when every image is there.
        #[arg(long, short)]
        quiet: bool,
    },
    /// Compile and show registers, spills, stack and shared memory per kernel and architecture.
    Inspect {
        #[command(flatten)]
        spec: SpecArgs,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        jobs: JobsArg,
    },
    /// (GPU) Time every schedule in a folder of candidate kernels and write the fastest per
    /// (dtype, head size) as TOML (specs/tuned.toml, read by generation on machines without a GPU).
    ///
    /// Make the candidates first: `mla-gen generate specs/tune.toml --out target/tune-candidates`.
    /// The winner is the lowest geometric-mean time over the best per shape, in the cold mode
    /// when it is timed. After each (dtype, head size) it also prints, per shape, the best
    /// candidate in each L2 mode and the current (specs/tuned.toml, as built into this binary)
    /// and plain (128 threads, one head per block) schedules' time over it; whether one schedule
    /// is within 2% of the best at every shape in every mode; and if none is, a proposed size
    /// rule: ranges of rows = tokens x heads with a schedule each (a proposal: adopt one as a
    /// `[[size_rule]]` of specs/tuned.toml, and every host applies it from the manifest).
    ///
    /// Default shapes: 1024x16, 1024x128, 8192x16/2, 8192x128, 32768x16, 32768x128,
    /// 32768x128/2, 4096x64; default groups: every (dtype, head size) of the candidates, sorted
    /// (with --only, in the order given).
    Tune {
        /// Folder generated from a spec that lists schedules explicitly.
        #[arg(long, default_value = "target/tune-candidates")]
        candidates: PathBuf,
        /// Where to write the winners.
        #[arg(long, default_value = "specs/tuned.toml")]
        out: PathBuf,
        /// Cold: timed launches per kernel and shape (median).
        #[arg(long, default_value_t = 30)]
        reps: usize,
        #[command(flatten)]
        timing: gpu::Timing,
        /// Write every time and the analyses as JSON here (rewritten after each group).
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// (GPU) Time a generated folder's kernels through the Rust runtime on the benchmark shapes
    /// (bf16 at each head size, f16 and f32 at 128), and the host cost of one launch.
    ///
    /// With --l2 both (the default) each row also has a device copy of the same bytes, cold
    /// and hot, and the merge's percent of each; summary lines follow the rows (cold percent of
    /// copy at shapes moving >= 8 MB, hot percent of hot copy); the host cost line is last.
    ///
    /// Default shapes: T in 256, 613, 1024, 4096, 8192, 32768 x H in 16, 64, 128, each without
    /// and with T/2; default kernels: bf16:64,bf16:80,bf16:96,bf16:128,bf16:192,bf16:256,
    /// bf16:512,f16:128,f32:128.
    Bench {
        /// Generated folder to time.
        #[arg(long, default_value = "generated")]
        kernels: PathBuf,
        /// Write all rows as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Cold: timed launches per kernel and shape (median).
        #[arg(long, default_value_t = 100)]
        reps: usize,
        #[command(flatten)]
        timing: gpu::Timing,
    },
    /// Where NVRTC was found, its version, the PTX ISA it emits, the oldest driver that can JIT
    /// that PTX, and whether a GPU driver is present.
    Doctor {
        /// The findings as one JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Print the JSON Schema of manifest.json (docs/manifest.schema.json is this output).
    Schema,
    /// Print a shell completion script: `mla-gen completions bash > /etc/bash_completion.d/mla-gen`.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
}

fn generate(
    args: &SpecArgs,
    out: &Path,
    jobs: usize,
    quiet: bool,
    extra: &[mla_gen::bindings::Emit],
    c_prefix: &mla_gen::bindings::CPrefix,
) -> Result<(), Failure> {
    let spec = load_spec(args)?;
    let templates = load_templates(args)?;
    // A folder that cannot take the result is refused now, not after minutes of compiling.
    emit::check_destination(out)?;
    let started = std::time::Instant::now();
    let (mut files, manifest) =
        mla_gen::generate_files_with_c_prefix(&spec, &templates, jobs, !quiet, extra, c_prefix)?;
    if let Ok(notes) = std::fs::read(out.join(check::KEPT)) {
        files.insert(check::KEPT.to_string(), notes);
    }
    let outcome = emit::write(out, &files)?;
    if !quiet {
        let archs = manifest.spec.archs.join(", ");
        let what = match outcome {
            WriteOutcome::Unchanged => "up to date, nothing written".to_string(),
            WriteOutcome::Replaced { written, kept } => {
                format!("{written} files written, {kept} unchanged")
            }
        };
        eprintln!(
            "{} kernels x [{archs}] -> {} ({what}) with NVRTC {} (PTX ISA {}) in {:.1}s",
            manifest.kernels.len(),
            out.display(),
            manifest.nvrtc.release,
            manifest.nvrtc.ptx_isa,
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

fn inspect(args: &SpecArgs, json: bool, jobs: usize) -> Result<(), Failure> {
    let spec = load_spec(args)?;
    let templates = load_templates(args)?;
    let (_, manifest) = mla_gen::generate_files(&spec, &templates, jobs, true)?;
    if json {
        let rows: Vec<_> = manifest
            .kernels
            .iter()
            .map(|k| {
                serde_json::json!({
                    "kernel": k.name,
                    "block_threads": k.launch.block_threads,
                    "archs": k.archs.iter().map(|a| serde_json::json!({
                        "arch": a.arch, "resources": a.resources,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!(
        "{:<44} {:<8} {:>5} {:>5} {:>6} {:>6} {:>6} {:>5}",
        "kernel", "arch", "block", "regs", "spillS", "spillL", "stack", "smem"
    );
    let mut spills = 0;
    for k in &manifest.kernels {
        for a in &k.archs {
            match &a.resources {
                Some(r) => {
                    spills += usize::from(r.spill_store_bytes + r.spill_load_bytes > 0);
                    println!(
                        "{:<44} {:<8} {:>5} {:>5} {:>6} {:>6} {:>6} {:>5}",
                        k.name,
                        a.arch,
                        k.launch.block_threads,
                        r.registers,
                        r.spill_store_bytes,
                        r.spill_load_bytes,
                        r.stack_frame_bytes,
                        r.shared_mem_bytes
                    );
                }
                None => println!(
                    "{:<44} {:<8} {:>5}   (PTX only: resources are known once a driver JITs it)",
                    k.name, a.arch, k.launch.block_threads
                ),
            }
        }
    }
    eprintln!(
        "{} kernels; {}",
        manifest.kernels.len(),
        if spills == 0 {
            "no spills".to_string()
        } else {
            format!("{spills} kernel/arch pairs spill registers")
        }
    );
    Ok(())
}

fn run(cli: Cli) -> Result<(), Failure> {
    match cli.command {
        Command::Generate {
            spec,
            out,
            jobs,
            emit,
            c_prefix,
            quiet,
        } => generate(&spec, &out, jobs.jobs, quiet, &emit, &c_prefix.c_prefix),
        Command::List {
            spec,
            json,
            decisions,
        } => {
            let s = load_spec(&spec)?;
            // Names do not depend on the templates, but a bad --templates is refused here as by
            // every other command that takes it, not silently ignored.
            if spec.templates.is_some() {
                load_templates(&spec)?;
            }
            if decisions {
                print!("{}", mla_gen::spec::decision_list(&s.variants));
                Ok(())
            } else {
                report::list(&s, json)
            }
        }
        Command::Render { spec, kernel } => {
            let s = load_spec(&spec)?;
            let templates = load_templates(&spec)?;
            let Some(v) = s.find(&kernel) else {
                let names = s.kernel_names();
                // The names sharing the longest prefix with what was typed.
                let common = |n: &str| {
                    n.chars()
                        .zip(kernel.chars())
                        .take_while(|(a, b)| a == b)
                        .count()
                };
                let best = names.iter().map(|n| common(n)).max().unwrap_or(0);
                let near: Vec<&String> = names
                    .iter()
                    .filter(|n| best > "merge_attn_states_".len() && common(n) == best)
                    .take(5)
                    .collect();
                let hint = if near.is_empty() {
                    // The names of the spec rendered from, not the default's.
                    let of = spec
                        .spec
                        .as_ref()
                        .map_or(String::new(), |p| format!(" {}", p.display()));
                    format!("run `mla-gen list{of}` for the names")
                } else {
                    format!(
                        "did you mean: {}",
                        near.iter()
                            .map(|s| s.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                };
                // A name the spec does not have is a usage error, as an unknown flag is.
                return Err(Failure(
                    format!("no kernel named `{kernel}` in {} ({hint})", s.origin),
                    2,
                ));
            };
            print!("{}", templates.render(&s.source_name(), v)?);
            Ok(())
        }
        Command::Check {
            spec,
            out,
            jobs,
            emit,
            c_prefix,
            json,
        } => check::check(&spec, &out, jobs.jobs, &emit, &c_prefix.c_prefix, json),
        Command::Verify { out, quiet } => check::verify(&out, quiet),
        Command::Inspect { spec, json, jobs } => inspect(&spec, json, jobs.jobs),
        Command::Doctor { json } => doctor::doctor(json),
        Command::Schema => report::schema(),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "mla-gen",
                &mut std::io::stdout(),
            );
            Ok(())
        }
        Command::Tune {
            candidates,
            out,
            reps,
            timing,
            json,
        } => gpu::tune(&candidates, &out, reps, &timing, json),
        Command::Bench {
            kernels,
            json,
            reps,
            timing,
        } => gpu::bench(&kernels, json.as_deref(), reps, &timing),
    }
}

fn main() -> ExitCode {
    // `mla-gen list | head` ends quietly, as Unix tools do: Rust starts with SIGPIPE ignored, so
    // the first write after the reader left panicked. Restored before any thread starts.
    #[cfg(unix)]
    // SAFETY: sets one signal's action to its default, with no handler and no other thread yet.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(msg, code)) => {
            eprintln!("error: {msg}");
            ExitCode::from(code)
        }
    }
}
