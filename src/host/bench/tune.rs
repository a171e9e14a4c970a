//! `mla-gen tune`: time every candidate schedule of each (dtype, head size) on the tune shapes,
//! cold and/or hot; write the winners (lowest geometric-mean time over the best per shape, in
//! the cold mode when it was timed) as TOML, and report per shape the best candidate per mode,
//! how far the current and plain schedules are from it, and a size rule when no one schedule
//! is within 2% everywhere (rule.rs).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use cudarc::driver::CudaContext;

use super::buffers::buffers_for;
use super::rule::{self, ModeTimes, ShapeKey};
use super::{cold, hot, is_pairwise, merge_bytes, report, Shape, L2};
use crate::dtype::Dtype;
use crate::host::runtime::{Kernel, Runtime, RuntimeError};
use crate::variant::Schedule;

/// Shapes the tuner scores a schedule on by default: (tokens, heads, threshold at T/2).
pub const TUNE_SHAPES: [Shape; 8] = [
    (1024, 16, false),
    (1024, 128, false),
    (8192, 16, true),
    (8192, 128, false),
    (32768, 16, false),
    (32768, 128, false),
    (32768, 128, true),
    (4096, 64, false),
];

/// What `tune` times and where its report goes.
#[derive(Debug, Clone)]
pub struct TuneOptions {
    pub shapes: Vec<Shape>,
    /// Cold launches per kernel and shape (median).
    pub reps: usize,
    /// Hot: timed replays of each graph (median).
    pub graph_reps: usize,
    pub l2: L2,
    /// The (dtype, head size) groups to tune, in this order; empty: every group, sorted.
    pub only: Vec<(String, u32)>,
    /// The schedule generation uses today for a (dtype, head size) (specs/tuned.toml), to
    /// report how far it is from the best.
    pub current: Option<fn(&str, u32) -> Option<Schedule>>,
    /// Every time and analysis as JSON, rewritten after each group.
    pub json: Option<PathBuf>,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> RuntimeError + '_ {
    move |source| RuntimeError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Tune the candidates of `candidates`, writing the winners as TOML to `out`; `emit` gets each
/// group's report as soon as it is timed.
pub fn tune(
    candidates: &Path,
    out: &Path,
    o: &TuneOptions,
    emit: &mut dyn FnMut(&str),
) -> Result<(), RuntimeError> {
    let ctx = CudaContext::new(0).map_err(RuntimeError::from)?;
    let stream = ctx.default_stream();
    let rt = Runtime::load(ctx.clone(), candidates)?;
    // (dtype, head size) -> kernels (schedules)
    let mut groups: BTreeMap<(String, u32), Vec<&Kernel>> = BTreeMap::new();
    // Schedules are tuned on the pairwise merge; other families take the same table.
    for k in rt
        .kernels()
        .iter()
        .map(|k| k.as_ref())
        .filter(|k| is_pairwise(k))
    {
        groups
            .entry((
                k.meta.variant.dtype.name().to_string(),
                k.meta.variant.head_size,
            ))
            .or_default()
            .push(k);
    }
    let order: Vec<(String, u32)> = if o.only.is_empty() {
        groups.keys().cloned().collect()
    } else {
        for key in &o.only {
            if !groups.contains_key(key) {
                let have: Vec<String> = groups.keys().map(|(t, d)| format!("{t}:{d}")).collect();
                return Err(RuntimeError::Bench(format!(
                    "--only {}:{}: no tune candidates for it in {} (they have {}); add the dtype \
                     and head size to the candidates' spec (specs/tune.toml) and generate them again",
                    key.0,
                    key.1,
                    candidates.display(),
                    if have.is_empty() { "none".to_string() } else { have.join(", ") }
                )));
            }
        }
        o.only.clone()
    };
    let max_d = order.iter().map(|k| k.1 as usize).max().unwrap_or(0);
    let max_rows = o.shapes.iter().map(|s| s.0 * s.1).max().unwrap_or(0);
    let mut toml = format!(
        "# Schedules chosen by `mla-gen tune` on {} (sm_{}{}), driver CUDA {}.{}; each is the lowest\n# geometric-mean time over the tune shapes. Generation reads this file (embedded at build\n# time), so it needs no GPU. (dtype, head_size) pairs not listed use rows_per_thread = 1,\n# min_blocks_per_sm = 1, block_threads = 256,\n# heads_per_block = 1.\n",
        ctx.name().unwrap_or_default(),
        rt.compute_capability.0,
        rt.compute_capability.1,
        rt.driver_cuda.0,
        rt.driver_cuda.1
    );
    let hot_state = if o.l2.hot() {
        Some(hot::HotState::new(&ctx, &stream)?)
    } else {
        None
    };
    let mut json_groups = Vec::new();
    let mut current = None;
    for key in &order {
        let kernels = &groups[key];
        let (dtype_name, d) = key;
        let dtype = Dtype::from_name(dtype_name)
            .ok_or_else(|| RuntimeError::NoKernel(dtype_name.to_string()))?;
        let bufs = buffers_for(&mut current, &stream, dtype, max_rows * max_d, max_rows)?;
        let d = *d as usize;
        let size = dtype.size_bytes() as usize;
        let shapes: Vec<ShapeKey> = o
            .shapes
            .iter()
            .map(|&(t, h, half)| ShapeKey {
                t,
                h,
                half,
                bytes: merge_bytes(t, h, d, size, if half { t / 2 } else { t }, true),
            })
            .collect();
        // times[mode][kernel][shape]
        let mut cold_t = vec![vec![f64::NAN; shapes.len()]; kernels.len()];
        let mut hot_t = cold_t.clone();
        let mut producer_us = vec![f64::NAN; shapes.len()];
        for (si, s) in shapes.iter().enumerate() {
            let n = if s.half { s.t / 2 } else { s.t };
            if o.l2.cold() {
                let args = bufs.args(&stream, s.t, s.h, d, s.half.then_some(s.t / 2));
                for (ki, k) in kernels.iter().enumerate() {
                    cold_t[ki][si] = cold::time_kernel(&ctx, k, &stream, bufs, &args, o.reps)?;
                }
            }
            if let Some(hs) = &hot_state {
                let ranges = hs.ranges(bufs, (s.t, s.h, d))?;
                let iterations = super::graph_iterations(s.bytes);
                let p = hs.producer_us(&ranges, iterations, o.graph_reps)?;
                producer_us[si] = p;
                for (ki, k) in kernels.iter().enumerate() {
                    hot_t[ki][si] = hs
                        .merge_with(k, bufs, (s.t, s.h, d, n), s.bytes, o.graph_reps, Some(p))?
                        .us;
                }
            }
        }
        let mut modes = Vec::new();
        if o.l2.cold() {
            modes.push(ModeTimes {
                mode: rule::Mode::Cold,
                times: cold_t,
            });
        }
        if o.l2.hot() {
            modes.push(ModeTimes {
                mode: rule::Mode::Hot,
                times: hot_t,
            });
        }
        // The winner for tuned.toml: the first mode's (cold when timed) geometric mean.
        let primary = &modes[0].times;
        let mut text = String::new();
        let wi = winner_lines(&mut text, kernels, primary, &shapes, size, d);
        let w = &kernels[wi].meta.variant.schedule;
        toml.push_str(&format!(
            "\n[[schedule]]\ndtype = \"{dtype_name}\"\nhead_size = {d}\nrows_per_thread = {}\nmin_blocks_per_sm = {}\nblock_threads = {}\nheads_per_block = {}\n",
            w.rows_per_thread, w.min_blocks_per_sm, w.block_threads, w.heads_per_block
        ));
        let schedules: Vec<Schedule> = kernels.iter().map(|k| k.meta.variant.schedule).collect();
        let cur = o.current.and_then(|f| f(dtype_name, d as u32));
        let analysis = rule::analyze(&shapes, &schedules, &modes, cur, rule::TOLERANCE);
        text.push_str(&report::analysis_text(
            &format!("{dtype_name} d{d} ({} candidates)", kernels.len()),
            &analysis,
        ));
        emit(&text);
        json_groups.push(serde_json::json!({
            "dtype": dtype_name, "head_size": d,
            "candidates": kernels.iter().map(|k| serde_json::json!({
                "kernel": k.meta.name, "schedule": rule::label(&k.meta.variant.schedule),
            })).collect::<Vec<_>>(),
            "shapes": shapes,
            "times_us": modes.iter().map(|m| (m.mode.name().to_string(), serde_json::json!(m.times)))
                .collect::<serde_json::Map<_, _>>(),
            "hot_producer_us": if o.l2.hot() { serde_json::json!(producer_us) } else { serde_json::Value::Null },
            "winner": kernels[wi].meta.name,
            "analysis": analysis,
        }));
        if let Some(path) = &o.json {
            let doc = serde_json::json!({
                "device": ctx.name().unwrap_or_default(),
                "l2": o.l2.name(), "reps": o.reps, "graph_reps": o.graph_reps,
                "groups": json_groups,
            });
            let bytes = serde_json::to_vec_pretty(&doc)
                .map_err(|e| RuntimeError::Bench(format!("JSON: {e}")))?;
            std::fs::write(path, bytes).map_err(io(path))?;
        }
    }
    std::fs::write(out, toml).map_err(io(out))
}

/// The per-kernel lines tune has always printed (score = geometric mean of time over the best
/// per shape, worst such ratio, the largest shape's time); returns the winner's index.
fn winner_lines(
    text: &mut String,
    kernels: &[&Kernel],
    times: &[Vec<f64>],
    shapes: &[ShapeKey],
    size: usize,
    d: usize,
) -> usize {
    let best_per_shape: Vec<f64> = (0..shapes.len())
        .map(|si| {
            times
                .iter()
                .map(|row| row[si])
                .fold(f64::INFINITY, f64::min)
        })
        .collect();
    let score = |row: &Vec<f64>| {
        (row.iter()
            .zip(&best_per_shape)
            .map(|(t, b)| (t / b).ln())
            .sum::<f64>()
            / row.len() as f64)
            .exp()
    };
    let wi = times
        .iter()
        .enumerate()
        .map(|(i, r)| (i, score(r)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map_or(0, |(i, _)| i);
    // The shape moving the most bytes (32768x128 without threshold for the default shapes).
    let big = (0..shapes.len())
        .max_by(|&a, &b| shapes[a].bytes.cmp(&shapes[b].bytes).then(b.cmp(&a)))
        .unwrap_or(0);
    let bs = shapes.get(big).copied();
    for (ki, k) in kernels.iter().enumerate() {
        let worst = times[ki]
            .iter()
            .zip(&best_per_shape)
            .map(|(t, b)| t / b)
            .fold(0.0, f64::max);
        let (label, bytes) = bs.map_or((String::new(), 0.0), |s| {
            let n = if s.half { s.t / 2 } else { s.t };
            (
                format!("{}x{}", s.t, s.h),
                merge_bytes(s.t, s.h, d, size, n, true) as f64,
            )
        });
        let t = times[ki].get(big).copied().unwrap_or(f64::NAN);
        text.push_str(&format!(
            "{}{:<48} score {:.3}  worst {:.3}  {}: {:>8.1} us = {:>5.0} GB/s\n",
            if ki == wi { "* " } else { "  " },
            k.meta.name,
            score(&times[ki]),
            worst,
            label,
            t,
            bytes / (t * 1e-6) / 1e9
        ));
    }
    wi
}
