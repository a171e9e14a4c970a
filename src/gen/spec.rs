//! Spec: parse a TOML file, validate every value against its allowed set, expand lists into
//! their cross product. Errors carry `origin:line:col`, the key, the bad value and what is allowed.

use std::collections::BTreeMap;

use serde::Serialize;
use toml::Spanned;

use crate::dtype::Dtype;
pub use crate::gen::variant::*;

/// The spec compiled into the binary: what vLLM needs.
pub const DEFAULT_SPEC: &str = include_str!("../../specs/default.toml");
/// Name under which the embedded spec appears in messages and the manifest.
pub const DEFAULT_SPEC_ORIGIN: &str = "<embedded default spec>";

/// A spec may not expand to more kernels than this (a typo like `head_size = [1, ..., 1024]`
/// times every option should fail loudly, not compile for an hour).
pub const MAX_VARIANTS: usize = 4096;
pub const MAX_HEAD_SIZE: u32 = 1024;
pub const DEFAULT_ARCHS: [&str; 2] = ["sm_80", "sm_90"];

/// A validated, expanded spec.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct Spec {
    /// Where it came from, for messages: a path or the embedded default.
    pub origin: String,
    /// sha256 of the spec's text.
    pub text_sha256: String,
    pub archs: Vec<Arch>,
    /// Where `archs` were named, for messages: "the spec", or the override's origin (`--arch`,
    /// `MLA_GEN_ARCH`, ...).
    #[serde(skip)]
    pub archs_from: String,
    /// Which of `archs` carry PTX beside their CUBIN (spec key `ptx`).
    pub ptx: PtxTargets,
    /// Whether generation writes each kernel's `.cu` (spec key `sources`, default true).
    pub sources: bool,
    pub variants: Vec<MergeVariant>,
}

/// Which targets carry PTX (the spec's top-level `ptx`). PTX is what a GPU without a CUBIN of its
/// own runs (the driver compiles it, docs/MANIFEST.md "Artifact rule"); a CUBIN serves its own
/// major's devices from its minor on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum PtxTargets {
    /// Every target: `sm_XY` is CUBIN + PTX, `compute_XY` PTX (the default).
    #[default]
    Every,
    /// PTX only where a GPU newer than every CUBIN needs it: the newest target that is not
    /// arch-specific keeps its PTX, every other `sm_XY` is CUBIN only; `compute_XY` targets are
    /// PTX as always (that is all they are).
    Newest,
}

impl PtxTargets {
    /// The spec's spelling of each choice.
    pub const NAMES: [(&'static str, PtxTargets); 2] =
        [("every", PtxTargets::Every), ("newest", PtxTargets::Newest)];
}

impl Spec {
    /// The origin without folders, as generated files name it: independent of where the spec
    /// lives, and reduced to characters that cannot end or continue a C comment (a file name may
    /// hold a newline or a trailing backslash; it must never become code).
    pub fn source_name(&self) -> String {
        let name = std::path::Path::new(&self.origin)
            .file_name()
            .map_or_else(|| self.origin.clone(), |n| n.to_string_lossy().into_owned());
        name.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '+' | ' ' | '<' | '>')
                {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    }
    pub fn kernel_names(&self) -> Vec<String> {
        self.variants.iter().map(|v| v.kernel_name()).collect()
    }
    pub fn find(&self, kernel_name: &str) -> Option<&MergeVariant> {
        self.variants
            .iter()
            .find(|v| v.kernel_name() == kernel_name)
    }
    /// Whether `arch` (one of `archs`) carries PTX under the spec's `ptx`.
    pub fn carries_ptx(&self, arch: &Arch) -> bool {
        match self.ptx {
            PtxTargets::Every => true,
            PtxTargets::Newest => {
                let newest = self
                    .archs
                    .iter()
                    .filter(|a| !a.arch_specific)
                    .map(|a| a.major_minor)
                    .max();
                !arch.real || (!arch.arch_specific && Some(arch.major_minor) == newest)
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    #[error("{origin}:{line}:{column}: {message}")]
    At {
        origin: String,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{origin}: {message}")]
    Whole { origin: String, message: String },
}

// ---- raw TOML shape: every value spanned so validation can point at it ----

mod expand;
mod raw;
use expand::Lists;
use raw::*;

/// Parse, validate and expand a spec. `origin` names it in messages (a file name).
///
/// Each table in turn: its lists validated and expanded into their cross product
/// (`Lists::expand`), each variant finished (size rule, dense twin, launch geometry), then kept
/// once by name (`Unique`).
pub fn parse(origin: &str, text: &str) -> Result<Spec, SpecError> {
    let ctx = Ctx { origin, text };
    let raw = read_raw(&ctx)?;
    // `include_default = true`: the embedded default spec's tables first, and its top-level keys
    // where this spec leaves them out.
    let default_ctx = Ctx {
        origin: DEFAULT_SPEC_ORIGIN,
        text: DEFAULT_SPEC,
    };
    let included = match &raw.include_default {
        Some(v) => boolean(v.get_ref())
            .map_err(|why| ctx.at(v.span().start, format!("`include_default`: {why}")))?,
        None => false,
    };
    let base = if included {
        Some(read_raw(&default_ctx)?)
    } else {
        None
    };
    let top = |own, of_base: fn(&RawSpec) -> &Option<Spanned<toml::Value>>| {
        top_key(&ctx, own, base.as_ref().map(|b| (&default_ctx, of_base(b))))
    };
    let archs = match top(&raw.arch, |b| &b.arch) {
        Some((ctx, v)) => ctx.list("arch", v, arch)?,
        None => DEFAULT_ARCHS
            .iter()
            .map(|a| Arch::parse(a))
            .collect::<Result<_, _>>()
            .map_err(|message| SpecError::Whole {
                origin: origin.to_string(),
                message,
            })?,
    };
    let ptx = match top(&raw.ptx, |b| &b.ptx) {
        Some((ctx, v)) => one_of(&PtxTargets::NAMES, v.get_ref())
            .map_err(|why| ctx.at(v.span().start, format!("`ptx`: {why}")))?,
        None => PtxTargets::Every,
    };
    let sources = match top(&raw.sources, |b| &b.sources) {
        Some((ctx, v)) => boolean(v.get_ref())
            .map_err(|why| ctx.at(v.span().start, format!("`sources`: {why}")))?,
        None => true,
    };
    // Each table with the spec it comes from (its errors point there) and whether that is the
    // included default.
    let tables: Vec<(&Ctx, bool, Family, Spanned<RawMerge>)> = base
        .map(RawSpec::tables)
        .unwrap_or_default()
        .into_iter()
        .map(|(family, t)| (&default_ctx, true, family, t))
        .chain(
            raw.tables()
                .into_iter()
                .map(|(family, t)| (&ctx, false, family, t)),
        )
        .collect();
    if tables.is_empty() {
        return Err(SpecError::Whole {
            origin: origin.to_string(),
            message: "the spec names no kernels: add a [[merge_attn_states]], [[merge_states]], [[merge_state_in_place]] or [[mask_empty_context_lse]] table".to_string(),
        });
    }

    let mut unique = Unique::default();
    // Where the first `pdl` that sets true is, to point a refusal of the archs at it.
    let mut pdl_at: Option<usize> = None;
    for &(table_ctx, from_default, table, ref spanned) in &tables {
        let lists = Lists::read(table_ctx, table, spanned)?;
        if !from_default {
            pdl_at = pdl_at.or_else(|| lists.pdl_at());
        }
        lists.check_count(table_ctx, unique.variants.len())?;
        for v in lists.expand().flat_map(|v| lists.with_twins(v)) {
            let v = lists.check_launch(table_ctx, v)?;
            unique.push(table_ctx, &lists, v, from_default)?;
        }
    }

    if let (Some(offset), Some(problem)) = (pdl_at, pdl_arch_problem(&archs)) {
        return Err(ctx.at(offset, problem));
    }
    Ok(Spec {
        origin: origin.to_string(),
        text_sha256: crate::gen::sha256_hex(text.as_bytes()),
        archs,
        archs_from: ARCHS_FROM_SPEC.to_string(),
        ptx,
        sources,
        variants: unique.variants,
    })
}

/// A spec's TOML, its syntax checked.
fn read_raw(ctx: &Ctx) -> Result<RawSpec, SpecError> {
    toml::from_str(ctx.text).map_err(|e| {
        let offset = e.span().map_or(0, |s| s.start);
        ctx.at(offset, e.message().trim().to_string())
    })
}

/// A top-level key as the spec sets it, else as the included default spec sets it, each with the
/// spec its errors point into.
fn top_key<'r>(
    ctx: &'r Ctx<'r>,
    own: &'r Option<Spanned<toml::Value>>,
    base: Option<(&'r Ctx<'r>, &'r Option<Spanned<toml::Value>>)>,
) -> Option<(&'r Ctx<'r>, &'r Spanned<toml::Value>)> {
    own.as_ref()
        .map(|v| (ctx, v))
        .or_else(|| base.and_then(|(ctx, v)| v.as_ref().map(|v| (ctx, v))))
}

/// Where a kernel name was first produced, to report (or, for the included default's, skip) a
/// second one.
struct Seen {
    line: usize,
    index: usize,
    from_default: bool,
}

/// The spec's kernels so far: each name once, at most `MAX_VARIANTS` of them.
#[derive(Default)]
struct Unique {
    variants: Vec<MergeVariant>,
    seen: BTreeMap<String, Seen>,
}

impl Unique {
    /// Keep `v`, a kernel of the table `lists`, unless the spec already has as many kernels as
    /// it may or one of the same name. A kernel of the spec's own tables that the included
    /// default spec already has, exactly so, is kept once; with other options it is an error.
    fn push(
        &mut self,
        ctx: &Ctx,
        lists: &Lists,
        v: MergeVariant,
        from_default: bool,
    ) -> Result<(), SpecError> {
        // (`Lists::check_count` counts before size rules add their kernels.)
        if self.variants.len() >= MAX_VARIANTS {
            return Err(ctx.at(
                lists.offset,
                format!(
                    "the spec expands to more than {MAX_VARIANTS} kernels (size rules included); split it, shorten its lists or set size_rule = false"
                ),
            ));
        }
        let name = v.kernel_name();
        if let Some(first) = self.seen.get(&name) {
            let message = match (first.from_default, from_default) {
                (true, false) if self.variants[first.index] == v => return Ok(()),
                (true, false) => format!(
                    "kernel `{name}` is also in the embedded default spec (`include_default = true`), with other options (its twins: `dense`, `size_rule`); remove it from this table, or give this table the default's options (`mla-gen list --json` shows them)"
                ),
                _ => format!(
                    "kernel `{name}` is also produced by the table at line {}; each kernel may appear once",
                    first.line
                ),
            };
            return Err(ctx.at(lists.offset, message));
        }
        let seen = Seen {
            line: lists.line,
            index: self.variants.len(),
            from_default,
        };
        self.seen.insert(name, seen);
        self.variants.push(v);
        Ok(())
    }
}

/// Can `v`'s rows be split into groups of `group_size` elements whose lanes sit in one warp? The
/// group's scale is a shuffle reduction over those lanes, so: the group divides the row and holds
/// whole vectors, its lanes (a power of two up to 32) divide the threads of a row, and every
/// thread walks whole rows (no partial last pass).
pub(crate) fn group_fits(v: &MergeVariant, group_size: u32) -> bool {
    let l = crate::gen::launch::Launch::for_variant(v);
    let lanes = group_size / l.vec_elems.max(1);
    v.head_size % group_size == 0
        && group_size % l.vec_elems == 0
        && (1..=32).contains(&lanes)
        && l.threads_per_row % lanes == 0
        && l.vecs_per_row % l.threads_per_row == 0
}

/// Why `archs` cannot carry a `pdl = true` kernel, if they cannot. Every device of compute
/// capability 9.0 or newer must run an image built for sm_90 or newer (the one with
/// `griddepcontrol.wait` compiled in), since hosts decide the launch by the device alone: so some
/// target must be sm_90+, and a PTX below sm_90 (which such a device could fall back to under the
/// artifact rule) needs a plain sm_90 or compute_90 beside it.
pub(crate) fn pdl_arch_problem(archs: &[Arch]) -> Option<String> {
    let names = || archs.iter().map(Arch::name).collect::<Vec<_>>().join(", ");
    if archs.iter().all(|a| a.major_minor < 90) {
        return Some(format!(
            "`pdl` = true needs a target of sm_90 or newer (programmatic dependent launch and griddepcontrol exist from sm_90 on), and this spec targets only {}: add \"sm_90\" to `arch` (older targets may stay; they launch without it), or remove `pdl`",
            names()
        ));
    }
    let plain = |a: &&Arch| !a.arch_specific;
    let old_ptx = archs.iter().filter(plain).find(|a| a.major_minor < 90);
    match old_ptx {
        Some(old) if !archs.iter().filter(plain).any(|a| a.major_minor == 90) => Some(format!(
            "`pdl` = true with targets {}: a device of compute capability 9.0 or newer with no image of its own would run the {} PTX, which cannot wait for the previous kernel; add \"sm_90\" to `arch`",
            names(),
            old.virtual_name()
        )),
        _ => None,
    }
}

/// The embedded default spec, parsed.
pub fn default_spec() -> Result<Spec, SpecError> {
    parse(DEFAULT_SPEC_ORIGIN, DEFAULT_SPEC)
}

/// [`Spec::archs_from`] where no override replaced the spec's archs.
pub const ARCHS_FROM_SPEC: &str = "the spec";

/// Environment variable: comma-separated architectures replacing a spec's.
pub const ENV_ARCH: &str = "MLA_GEN_ARCH";

/// Apply the architecture override in force: `explicit` (a `--arch` flag or `Builder::archs`,
/// named by `explicit_from` in errors) when given, else `MLA_GEN_ARCH` when set and not blank,
/// else the spec's own.
pub fn apply_arch_override(
    spec: &mut Spec,
    explicit: Option<&[String]>,
    explicit_from: &str,
) -> Result<(), SpecError> {
    if let Some(archs) = explicit.filter(|a| !a.is_empty()) {
        return override_archs(spec, archs, explicit_from);
    }
    match std::env::var(ENV_ARCH) {
        // Split as clap splits `--arch`, empty items kept, so `sm_90,` fails alike in both.
        Ok(v) if !v.trim().is_empty() => {
            let archs: Vec<String> = v.split(',').map(str::to_string).collect();
            override_archs(spec, &archs, ENV_ARCH)
        }
        _ => Ok(()),
    }
}

/// Replace the spec's architectures with `archs`, which came from `from` (`--arch`, an
/// environment variable, ...): errors name it, and so do later ones about these archs.
pub(crate) fn override_archs(
    spec: &mut Spec,
    archs: &[String],
    from: &str,
) -> Result<(), SpecError> {
    let whole = |message| SpecError::Whole {
        origin: from.to_string(),
        message,
    };
    let mut out = Vec::new();
    for a in archs.iter().map(|a| a.trim()) {
        if a.is_empty() {
            return Err(whole(
                "an empty architecture in the list (a stray comma?)".to_string(),
            ));
        }
        let parsed = Arch::parse(a).map_err(whole)?;
        if !out.contains(&parsed) {
            out.push(parsed);
        }
    }
    if out.is_empty() {
        return Err(whole("no architecture given".to_string()));
    }
    if spec.variants.iter().any(|v| v.pdl) {
        if let Some(message) = pdl_arch_problem(&out) {
            return Err(whole(message));
        }
    }
    spec.archs = out;
    spec.archs_from = from.to_string();
    Ok(())
}

#[cfg(test)]
mod tests;
