//! What `mla-gen tune` concludes from its timings, with no GPU: per shape the best candidate in
//! each L2 mode and how far the current and the plain schedules are from it; whether one
//! schedule is within the tolerance (2%) of the best at every shape in every mode; and if none
//! is, a size rule on rows = tokens x heads with a schedule per range, proposed (specs/tuned.toml's
//! `[[size_rule]]` takes rules into the manifest, which every host applies; bench/size_rules.py
//! compares rules over several runs).

use serde::Serialize;

use crate::variant::Schedule;

/// How far from the best a schedule may be, at every shape, to count as "the best there".
pub const TOLERANCE: f64 = 0.02;

/// The plain schedule: one row per thread, one head per block, 128 threads.
pub const PLAIN: Schedule = Schedule {
    rows_per_thread: 1,
    min_blocks_per_sm: 1,
    block_threads: 128,
    heads_per_block: 1,
    vecs_per_thread: 0,
};

/// Which L2 condition a time was taken in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Eager launch after a 512 MB memset (L2 flushed).
    Cold,
    /// In a CUDA graph, right after a producer kernel wrote the inputs.
    Hot,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Cold => "cold",
            Mode::Hot => "hot",
        }
    }
}

/// A timed shape: T tokens, H heads, threshold T/2 or none, and the merge's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ShapeKey {
    #[serde(rename = "T")]
    pub t: usize,
    #[serde(rename = "H")]
    pub h: usize,
    pub half: bool,
    pub bytes: u64,
}

impl ShapeKey {
    pub fn rows(&self) -> usize {
        self.t * self.h
    }
}

/// A schedule's short name: `bt128/hpb1`, with `/rpt2` and `/mb2` when those are not 1.
pub fn label(s: &Schedule) -> String {
    let mut l = format!("bt{}/hpb{}", s.block_threads, s.heads_per_block);
    if s.rows_per_thread != 1 {
        l.push_str(&format!("/rpt{}", s.rows_per_thread));
    }
    if s.min_blocks_per_sm != 1 {
        l.push_str(&format!("/mb{}", s.min_blocks_per_sm));
    }
    l
}

/// One mode's times, `times[candidate][shape]` in microseconds.
#[derive(Debug, Clone)]
pub struct ModeTimes {
    pub mode: Mode,
    pub times: Vec<Vec<f64>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModeVerdict {
    pub mode: Mode,
    pub best: String,
    pub best_us: f64,
    /// The current tuned schedule's time over the best (absent when it is not a candidate).
    pub current: Option<f64>,
    pub plain: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ShapeVerdict {
    #[serde(flatten)]
    pub shape: ShapeKey,
    pub modes: Vec<ModeVerdict>,
}

/// A candidate over every shape: the worst and the geometric mean of its time over the best.
#[derive(Debug, Clone, Serialize)]
pub struct Standing {
    pub schedule: String,
    pub mode: Mode,
    pub worst: f64,
    pub geomean: f64,
}

/// One range of a size rule: rows in [from_rows, below_rows) take `schedule`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RuleRange {
    pub from_rows: usize,
    pub below_rows: Option<usize>,
    pub schedule: String,
    /// The measured row counts the range covers.
    pub rows: Vec<usize>,
    /// Its schedule's worst time over the best at those shapes, every mode.
    pub worst: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Rule {
    pub key: &'static str,
    pub ranges: Vec<RuleRange>,
    /// Row counts where no candidate is within the tolerance in every mode; there the rule
    /// takes the least-bad one.
    pub relaxed_at_rows: Vec<usize>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Analysis {
    pub tolerance: f64,
    pub current: Option<String>,
    pub plain: Option<String>,
    pub shapes: Vec<ShapeVerdict>,
    pub standings: Vec<Standing>,
    /// Schedules within the tolerance at every shape in every mode, best geomean first.
    pub uniform: Vec<String>,
    /// The schedule with the least worst ratio over every shape and mode, and that ratio.
    pub best_single: Option<(String, f64)>,
    /// Proposed when `uniform` is empty.
    pub rule: Option<Rule>,
}

/// A time over the best; a failed time (NaN, zero or negative) counts as infinitely slow.
fn ratio(t: f64, best: f64) -> f64 {
    if t.is_finite() && t > 0.0 && best.is_finite() && best > 0.0 {
        t / best
    } else {
        f64::INFINITY
    }
}

/// Analyse one (dtype, head size): `schedules[c]` is candidate c, `modes` its times per shape.
pub fn analyze(
    shapes: &[ShapeKey],
    schedules: &[Schedule],
    modes: &[ModeTimes],
    current: Option<Schedule>,
    tolerance: f64,
) -> Analysis {
    let labels: Vec<String> = schedules.iter().map(label).collect();
    let find = |s: Option<Schedule>| s.and_then(|s| schedules.iter().position(|c| *c == s));
    let (cur, plain) = (find(current), find(Some(PLAIN)));
    // ratios[m][c][s]
    let ratios: Vec<Vec<Vec<f64>>> = modes
        .iter()
        .map(|m| {
            let best: Vec<f64> = (0..shapes.len())
                .map(|s| {
                    m.times
                        .iter()
                        .filter_map(|row| row.get(s).copied())
                        .filter(|t| t.is_finite() && *t > 0.0)
                        .fold(f64::INFINITY, f64::min)
                })
                .collect();
            m.times
                .iter()
                .map(|row| {
                    (0..shapes.len())
                        .map(|s| ratio(row.get(s).copied().unwrap_or(f64::NAN), best[s]))
                        .collect()
                })
                .collect()
        })
        .collect();
    let shape_verdicts = shapes
        .iter()
        .enumerate()
        .map(|(s, &shape)| ShapeVerdict {
            shape,
            modes: modes
                .iter()
                .zip(&ratios)
                .map(|(m, r)| {
                    let b = (0..schedules.len())
                        .min_by(|&a, &b| r[a][s].total_cmp(&r[b][s]))
                        .unwrap_or(0);
                    ModeVerdict {
                        mode: m.mode,
                        best: labels.get(b).cloned().unwrap_or_default(),
                        best_us: m
                            .times
                            .get(b)
                            .and_then(|row| row.get(s))
                            .copied()
                            .unwrap_or(f64::NAN),
                        current: cur.map(|c| r[c][s]),
                        plain: plain.map(|c| r[c][s]),
                    }
                })
                .collect(),
        })
        .collect();
    let geomean = |v: &[f64]| (v.iter().map(|x| x.ln()).sum::<f64>() / v.len().max(1) as f64).exp();
    let worst_of = |v: &[f64]| v.iter().copied().fold(1.0, f64::max);
    let mut standings = Vec::new();
    for (m, r) in modes.iter().zip(&ratios) {
        for (c, l) in labels.iter().enumerate() {
            standings.push(Standing {
                schedule: l.clone(),
                mode: m.mode,
                worst: worst_of(&r[c]),
                geomean: geomean(&r[c]),
            });
        }
    }
    let all: Vec<Vec<f64>> = (0..schedules.len())
        .map(|c| ratios.iter().flat_map(|r| r[c].iter().copied()).collect())
        .collect();
    let mut uniform: Vec<(f64, usize)> = (0..schedules.len())
        .filter(|&c| worst_of(&all[c]) <= 1.0 + tolerance)
        .map(|c| (geomean(&all[c]), c))
        .collect();
    uniform.sort_by(|a, b| a.0.total_cmp(&b.0));
    let best_single = (0..schedules.len())
        .min_by(|&a, &b| {
            worst_of(&all[a])
                .total_cmp(&worst_of(&all[b]))
                .then(geomean(&all[a]).total_cmp(&geomean(&all[b])))
        })
        .map(|c| (labels[c].clone(), worst_of(&all[c])));
    let rule = if uniform.is_empty() && !schedules.is_empty() {
        Some(size_rule(shapes, &labels, &ratios, tolerance))
    } else {
        None
    };
    Analysis {
        tolerance,
        current: cur
            .map(|c| labels[c].clone())
            .or(current.map(|s| label(&s))),
        plain: plain.map(|c| labels[c].clone()),
        shapes: shape_verdicts,
        standings,
        uniform: uniform
            .into_iter()
            .map(|(_, c)| labels[c].clone())
            .collect(),
        best_single,
        rule,
    }
}

/// The fewest contiguous ranges of row counts, each with one schedule within the tolerance at
/// every shape it covers in every mode (relaxed to the least-bad candidate at a row count where
/// none is); among rules with as many ranges, the one with the lowest summed log ratio.
fn size_rule(
    shapes: &[ShapeKey],
    labels: &[String],
    ratios: &[Vec<Vec<f64>>],
    tolerance: f64,
) -> Rule {
    let mut rows: Vec<usize> = shapes.iter().map(ShapeKey::rows).collect();
    rows.sort_unstable();
    rows.dedup();
    let n_c = labels.len();
    // worst[c][p], cost[c][p]: over the shapes with rows[p] and every mode
    let mut worst = vec![vec![1.0f64; rows.len()]; n_c];
    let mut cost = vec![vec![0.0f64; rows.len()]; n_c];
    for (s, shape) in shapes.iter().enumerate() {
        let Ok(p) = rows.binary_search(&shape.rows()) else {
            continue;
        };
        for r in ratios {
            for ((w, k), rc) in worst.iter_mut().zip(cost.iter_mut()).zip(r) {
                w[p] = w[p].max(rc[s]);
                k[p] += rc[s].ln();
            }
        }
    }
    let need: Vec<f64> = (0..rows.len())
        .map(|p| {
            let least = (0..n_c).map(|c| worst[c][p]).fold(f64::INFINITY, f64::min);
            least.max(1.0 + tolerance)
        })
        .collect();
    let relaxed_at_rows = (0..rows.len())
        .filter(|&p| need[p] > 1.0 + tolerance)
        .map(|p| rows[p])
        .collect();
    let fits = |c: usize, p: usize| worst[c][p] <= need[p] * (1.0 + 1e-12);
    // best[j] = (ranges, cost, start i, candidate) of the best rule for rows[..j]
    let mut best: Vec<Option<(usize, f64, usize, usize)>> = vec![None; rows.len() + 1];
    best[0] = Some((0, 0.0, 0, 0));
    for j in 1..=rows.len() {
        for i in 0..j {
            let Some((ranges, sum, _, _)) = best[i] else {
                continue;
            };
            for (c, cost_c) in cost.iter().enumerate() {
                if !(i..j).all(|p| fits(c, p)) {
                    continue;
                }
                let total = sum + cost_c[i..j].iter().sum::<f64>();
                let better = match best[j] {
                    None => true,
                    Some((r, s, _, _)) => (ranges + 1, total) < (r, s),
                };
                if better {
                    best[j] = Some((ranges + 1, total, i, c));
                }
            }
        }
    }
    let mut spans = Vec::new();
    let mut j = rows.len();
    while j > 0 {
        let Some((_, _, i, c)) = best[j] else {
            break;
        };
        spans.push((i, j, c));
        j = i;
    }
    spans.reverse();
    // A boundary sits at the geometric mean of the row counts on either side of it.
    let boundary = |p: usize| ((rows[p - 1] as f64) * (rows[p] as f64)).sqrt().round() as usize;
    let ranges = spans
        .iter()
        .map(|&(i, j, c)| RuleRange {
            from_rows: if i == 0 { 0 } else { boundary(i) },
            below_rows: (j < rows.len()).then(|| boundary(j)),
            schedule: labels[c].clone(),
            rows: rows[i..j].to_vec(),
            worst: (i..j).map(|p| worst[c][p]).fold(1.0, f64::max),
        })
        .collect();
    Rule {
        key: "rows = tokens x heads",
        ranges,
        relaxed_at_rows,
    }
}

impl Rule {
    /// `rows < 20000: bt128/hpb1 (worst 1.012); rows >= 20000: bt512/hpb1 (worst 1.004)`
    pub fn text(&self) -> String {
        self.ranges
            .iter()
            .map(|r| {
                let range = match (r.from_rows, r.below_rows) {
                    (0, Some(b)) => format!("rows < {b}"),
                    (0, None) => "all rows".to_string(),
                    (f, Some(b)) => format!("{f} <= rows < {b}"),
                    (f, None) => format!("rows >= {f}"),
                };
                format!("{range}: {} (worst {:.3})", r.schedule, r.worst)
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}
