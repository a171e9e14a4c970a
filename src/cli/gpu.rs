//! `mla-gen tune` and `mla-gen bench`: they need a GPU; everything else of the CLI does not.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};
use mla_gen::bench::{self, report, L2};

use crate::failure::Failure;

/// Which L2 condition the kernels are timed in.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum L2Arg {
    /// Eager launches, the L2 flushed (a 512 MB memset) before each, median of CUDA-event
    /// times: what bench and tune measured before the hot mode (same numbers, same lines).
    Cold,
    /// In a CUDA graph: R x [a producer kernel writes every input, the kernel] minus R x
    /// [producer], per iteration, median of graph replays: inputs hot in L2, no launch gaps,
    /// as an engine's CUDA graph runs the merge.
    Hot,
    /// Both, cold first.
    Both,
}

/// The options bench and tune share.
#[derive(Args, Clone, Debug)]
pub struct Timing {
    /// L2 condition to time in.
    #[arg(long, value_enum, default_value = "both")]
    l2: L2Arg,
    /// Hot: timed replays of each graph (median).
    #[arg(long, default_value_t = 30)]
    graph_reps: usize,
    /// Shapes as TxH or TxH/2 (threshold T/2), comma-separated (e.g. 613x16,4096x16/2)
    /// [default: the command's list, above]
    #[arg(long, value_name = "LIST")]
    shapes: Option<String>,
    /// Only these kernels, as dtype:head_size, comma-separated (e.g. bf16:128,f16:128)
    /// [default: the command's list, above]
    #[arg(long, value_name = "LIST")]
    only: Option<String>,
}

impl Timing {
    fn l2(&self) -> L2 {
        match self.l2 {
            L2Arg::Cold => L2::Cold,
            L2Arg::Hot => L2::Hot,
            L2Arg::Both => L2::Both,
        }
    }
}

fn need_driver() -> Result<(), Failure> {
    if mla_gen::runtime::driver_present() {
        Ok(())
    } else {
        Err(Failure(
            "no CUDA driver (libcuda.so.1): tune and bench run on a GPU machine".into(),
            1,
        ))
    }
}

fn usage(e: String) -> Failure {
    Failure(e, 2)
}

/// A file written after minutes of timing: its folder is checked before the timing, not after.
fn folder_exists(flag: &str, file: &Path) -> Result<(), Failure> {
    match file.parent() {
        Some(parent) if !parent.as_os_str().is_empty() && !parent.is_dir() => Err(usage(format!(
            "{flag} {}: the folder {} does not exist; create it or name another file",
            file.display(),
            parent.display()
        ))),
        _ => Ok(()),
    }
}

/// The schedule generation uses for a (dtype, head size): specs/tuned.toml as built in.
fn current_schedule(dtype: &str, head_size: u32) -> Option<mla_gen::variant::Schedule> {
    let dtype = mla_gen::dtype::Dtype::from_name(dtype)?;
    Some(mla_gen::gen::variant::tuned_schedule(dtype, head_size))
}

pub fn tune(
    candidates: &Path,
    out: &Path,
    reps: usize,
    timing: &Timing,
    json: Option<PathBuf>,
) -> Result<(), Failure> {
    let shapes = match timing.shapes.as_deref() {
        Some(s) => bench::parse_shapes(s).map_err(usage)?,
        None => bench::TUNE_SHAPES.to_vec(),
    };
    let only = match timing.only.as_deref() {
        Some(s) => bench::parse_kernels(s).map_err(usage)?,
        None => Vec::new(),
    };
    folder_exists("--out", out)?;
    if let Some(file) = &json {
        folder_exists("--json", file)?;
    }
    need_driver()?;
    let options = bench::TuneOptions {
        shapes,
        reps,
        graph_reps: timing.graph_reps,
        l2: timing.l2(),
        only,
        current: Some(current_schedule),
        json,
    };
    bench::tune(candidates, out, &options, &mut |text| {
        print!("{text}");
        let _ = std::io::stdout().flush();
    })?;
    eprintln!("wrote {}", out.display());
    Ok(())
}

/// The benchmark table's kernels: bf16 at each listed head size, f16 and f32 at 128.
const TABLE: [(&str, u32); 9] = [
    ("bf16", 64),
    ("bf16", 80),
    ("bf16", 96),
    ("bf16", 128),
    ("bf16", 192),
    ("bf16", 256),
    ("bf16", 512),
    ("f16", 128),
    ("f32", 128),
];

fn default_shapes() -> Vec<bench::Shape> {
    let mut shapes = Vec::new();
    for t in [256, 613, 1024, 4096, 8192, 32768] {
        for h in [16, 64, 128] {
            for half in [false, true] {
                shapes.push((t, h, half));
            }
        }
    }
    shapes
}

pub fn bench(dir: &Path, json: Option<&Path>, reps: usize, timing: &Timing) -> Result<(), Failure> {
    let shapes = match timing.shapes.as_deref() {
        Some(s) => bench::parse_shapes(s).map_err(usage)?,
        None => default_shapes(),
    };
    let only = match timing.only.as_deref() {
        Some(s) => bench::parse_kernels(s).map_err(usage)?,
        None => TABLE.iter().map(|&(d, h)| (d.to_string(), h)).collect(),
    };
    if let Some(file) = json {
        folder_exists("--json", file)?;
    }
    need_driver()?;
    let l2 = timing.l2();
    let options = bench::BenchOptions {
        shapes,
        reps,
        graph_reps: timing.graph_reps,
        l2,
        only,
    };
    let result = bench::bench(dir, &options)?;
    if let Some(legend) = report::legend(l2) {
        println!("{legend}");
    }
    let rows = result["rows"].as_array().cloned().unwrap_or_default();
    for r in &rows {
        println!("{}", report::row_line(r, l2));
    }
    for line in report::summary(&rows) {
        println!("{line}");
    }
    println!(
        "host cost per launch (Rust runtime, validation included): {:.2} us, of which the argument checks alone: {:.2} us; the driver's launch call alone (any launcher's floor here): {:.2} us",
        result["host_us_per_launch"].as_f64().unwrap_or(0.0),
        result["host_us_validation_only"].as_f64().unwrap_or(0.0),
        result["host_us_bare_cu_launch_kernel"].as_f64().unwrap_or(0.0)
    );
    if let Some(path) = json {
        std::fs::write(path, serde_json::to_vec_pretty(&result)?)
            .map_err(|e| Failure(format!("cannot write {}: {e}", path.display()), 1))?;
    }
    Ok(())
}
