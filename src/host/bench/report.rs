//! Text the bench and the tuner print, from their JSON rows and analyses (no GPU; unit tested).

use serde_json::Value;

use super::rule::{Analysis, Mode};

/// Which L2 condition to time in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L2 {
    Cold,
    Hot,
    Both,
}

impl L2 {
    pub fn cold(self) -> bool {
        matches!(self, L2::Cold | L2::Both)
    }
    pub fn hot(self) -> bool {
        matches!(self, L2::Hot | L2::Both)
    }
    pub fn name(self) -> &'static str {
        match self {
            L2::Cold => "cold",
            L2::Hot => "hot",
            L2::Both => "both",
        }
    }
}

fn f(r: &Value, key: &str) -> f64 {
    r[key].as_f64().unwrap_or(f64::NAN)
}

fn s<'a>(r: &'a Value, key: &str) -> &'a str {
    r[key].as_str().unwrap_or("")
}

/// One `mla-gen bench` row. Cold alone prints what bench printed before the hot mode existed;
/// `both` appends the copy of the same bytes and the hot columns; `hot` prints only those.
pub fn row_line(r: &Value, l2: L2) -> String {
    let head = format!(
        "{:<40} T={:<6} H={:<4} thr={:<5}",
        s(r, "kernel"),
        r["T"],
        r["H"],
        s(r, "threshold")
    );
    let cold = format!(" {:>9.1} us {:>6.0} GB/s", f(r, "us"), f(r, "gbs"));
    let hot = format!(
        " | hot {:>8.2} us {:>6.0} GB/s, hot copy {:>8.2} us, {:>5.1}% of hot copy",
        f(r, "hot_us"),
        f(r, "hot_gbs"),
        f(r, "hot_copy_us"),
        f(r, "hot_pct_copy")
    );
    match l2 {
        L2::Cold => head + &cold,
        L2::Hot => head + &hot,
        L2::Both => format!(
            "{head}{cold}, copy {:>8.1} us, {:>5.1}% of copy{hot}",
            f(r, "copy_us"),
            f(r, "pct_copy")
        ),
    }
}

/// The legend printed before the rows in the hot and both modes (cold prints none, as before).
pub fn legend(l2: L2) -> Option<&'static str> {
    match l2 {
        L2::Cold => None,
        _ => Some(
            "# cold: eager, L2 flushed (512 MB memset) before each launch, median of CUDA-event times; \
             hot: CUDA graph of R x [producer writes the inputs, merge] minus R x [producer], per \
             iteration, median of replays; copy: cuMemcpyDtoDAsync of the merge's bytes (half read, \
             half written), hot: right after the producer wrote its source; % of copy = copy time / \
             merge time",
        ),
    }
}

/// Summary lines over the rows: cold % of copy at shapes >= 8 MB (target 95), hot % of hot
/// copy. Empty for rows without copy columns (cold mode).
pub fn summary(rows: &[Value]) -> Vec<String> {
    let mut out = Vec::new();
    let name = |r: &Value| {
        format!(
            "{} T={} H={} thr={}",
            s(r, "kernel"),
            r["T"],
            r["H"],
            s(r, "threshold")
        )
    };
    let stats = |key: &str, keep: &dyn Fn(&Value) -> bool| {
        let mut v: Vec<(f64, &Value)> = rows
            .iter()
            .filter(|r| keep(r) && r[key].is_number())
            .map(|r| (f(r, key), r))
            .collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v
    };
    let big = stats("pct_copy", &|r: &Value| f(r, "bytes") >= 8e6);
    if let (Some(min), Some(mid)) = (big.first(), big.get(big.len() / 2)) {
        let ok = big.iter().filter(|(p, _)| *p >= 95.0).count();
        out.push(format!(
            "cold, shapes moving >= 8 MB ({}): % of copy min {:.1} ({}), median {:.1}; {} of {} >= 95%",
            big.len(),
            min.0,
            name(min.1),
            mid.0,
            ok,
            big.len()
        ));
    }
    let hot = stats("hot_pct_copy", &|_: &Value| true);
    if let (Some(min), Some(mid), Some(max)) = (hot.first(), hot.get(hot.len() / 2), hot.last()) {
        out.push(format!(
            "hot ({} shapes): % of hot copy min {:.1} ({}), median {:.1}, max {:.1}",
            hot.len(),
            min.0,
            name(min.1),
            mid.0,
            max.0
        ));
    }
    out
}

fn ratio(x: Option<f64>) -> String {
    match x {
        Some(v) if v.is_finite() => format!("{v:.3}"),
        Some(_) => "fail".to_string(),
        None => "-".to_string(),
    }
}

/// The tuner's per-(dtype, head size) section: per shape the best candidate in each mode and
/// the current and plain schedules' time over it; then the verdict.
pub fn analysis_text(title: &str, a: &Analysis) -> String {
    let mut t = format!(
        "== {title}: current (specs/tuned.toml) {}, plain {}; columns cur/plain = time / best; tolerance {:.0}%\n",
        a.current.as_deref().unwrap_or("-"),
        a.plain.as_deref().unwrap_or("not a candidate"),
        a.tolerance * 100.0
    );
    let modes: Vec<Mode> = a
        .shapes
        .first()
        .map(|s| s.modes.iter().map(|m| m.mode).collect())
        .unwrap_or_default();
    t.push_str(&format!(
        "{:>6} {:>4} {:>4} {:>8} {:>8}",
        "T", "H", "thr", "rows", "MB"
    ));
    for m in &modes {
        t.push_str(&format!(
            " | {:<18} {:>8} {:>6} {:>6}",
            format!("{} best", m.name()),
            "us",
            "cur",
            "plain"
        ));
    }
    t.push('\n');
    for sv in &a.shapes {
        let sh = sv.shape;
        t.push_str(&format!(
            "{:>6} {:>4} {:>4} {:>8} {:>8.1}",
            sh.t,
            sh.h,
            if sh.half { "T/2" } else { "none" },
            sh.rows(),
            sh.bytes as f64 / 1e6
        ));
        for m in &sv.modes {
            t.push_str(&format!(
                " | {:<18} {:>8.2} {:>6} {:>6}",
                m.best,
                m.best_us,
                ratio(m.current),
                ratio(m.plain)
            ));
        }
        t.push('\n');
    }
    for (who, label) in [("current", &a.current), ("plain", &a.plain)] {
        let Some(label) = label else { continue };
        let parts: Vec<String> = a
            .standings
            .iter()
            .filter(|s| &s.schedule == label)
            .map(|s| {
                format!(
                    "{} worst {:.3} geomean {:.3}",
                    s.mode.name(),
                    s.worst,
                    s.geomean
                )
            })
            .collect();
        if !parts.is_empty() {
            t.push_str(&format!("  {who} {label}: {}\n", parts.join(", ")));
        }
    }
    let mode_names: Vec<&str> = modes.iter().map(|m| m.name()).collect();
    let within = format!(
        "within {:.0}% of the best at every shape ({})",
        a.tolerance * 100.0,
        mode_names.join(" and ")
    );
    if a.uniform.is_empty() {
        let least = a
            .best_single
            .as_ref()
            .map(|(l, w)| format!(" (least worst: {l} at {w:.3})"))
            .unwrap_or_default();
        t.push_str(&format!("  one schedule {within}: none{least}\n"));
    } else {
        t.push_str(&format!(
            "  one schedule {within}: {}\n",
            a.uniform.join(", ")
        ));
    }
    if let Some(rule) = &a.rule {
        t.push_str(&format!(
            "  proposed size rule ({}): {}\n",
            rule.key,
            rule.text()
        ));
        if !rule.relaxed_at_rows.is_empty() {
            t.push_str(&format!(
                "  (no candidate within {:.0}% in every mode at rows {:?}: the rule takes the least worst there)\n",
                a.tolerance * 100.0,
                rule.relaxed_at_rows
            ));
        }
    }
    t
}
