//! The C launcher (`generate --emit c [--c-prefix NAME]`): `c/<prefix>_kernels.h` and `.c`,
//! derived from the manifest alone. Every kernel becomes tables (its parameters with their
//! contract, its constants, its grid rule, its images) and the template's one generic check and
//! loader interpret them, so no kernel family has C code of its own. docs/C.md describes the API.

use serde::Serialize;

use crate::constants::TOOL_VERSION;
use crate::contract::{Expr, Limit, Param, ParamKind};
use crate::gen::emit::{FileSet, KernelEntry, Manifest};
use crate::gen::render::RenderError;

mod tables;
use tables::{comment, kernel, special_tests, wrap};

/// The folder of the output that holds the launcher.
pub const C_DIR: &str = "c";

/// Limits of the C tables (the check keeps its per-parameter state on the stack).
const MAX_PARAMS: usize = 32;
const MAX_FACTORS: usize = 4;
const MAX_DIMS: usize = 8;
/// Dynamic shared memory a launch may use without the per-device opt-in, which the launcher
/// does not make.
const MAX_DEFAULT_SHARED_MEM: u32 = 48 * 1024;

const TEMPLATES: [(&str, &str); 6] = [
    (
        "mla_kernels.h.tera",
        include_str!("../../templates/c/mla_kernels.h.tera"),
    ),
    (
        "mla_kernels.c.tera",
        include_str!("../../templates/c/mla_kernels.c.tera"),
    ),
    // Section 3 of the .c, the generic check, included by it.
    (
        "mla_check.c.tera",
        include_str!("../../templates/c/mla_check.c.tera"),
    ),
    // Section 6 of the .c, selection and the launch by name, included by it.
    (
        "mla_select.c.tera",
        include_str!("../../templates/c/mla_select.c.tera"),
    ),
    // Section 4a of the .c, images read from files, included by it.
    (
        "mla_files.c.tera",
        include_str!("../../templates/c/mla_files.c.tera"),
    ),
    // Section 7 of the .c, prepared launches, included by it.
    (
        "mla_prepared.c.tera",
        include_str!("../../templates/c/mla_prepared.c.tera"),
    ),
];

/// The name every exported C symbol, type and macro of the launcher starts with (`mla` by
/// default: `mla_load`, `mla_status`, `MLA_OK`); two launchers with different prefixes link
/// into one program. A C identifier of at most 32 characters, not starting with `_`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CPrefix(String);

impl CPrefix {
    pub fn new(name: &str) -> Result<CPrefix, String> {
        let mut chars = name.chars();
        let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic());
        if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!(
                "`{name}` is not a C identifier starting with a letter (letters, digits, _)"
            ));
        }
        if name.len() > 32 {
            return Err(format!("`{name}` is longer than 32 characters"));
        }
        Ok(CPrefix(name.to_string()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// The prefix of macros: `MLA`.
    pub fn upper(&self) -> String {
        self.0.to_ascii_uppercase()
    }
    /// `c/<prefix>_kernels.h`, `c/<prefix>_kernels.c`.
    pub fn files(&self) -> [String; 2] {
        [
            format!("{C_DIR}/{}_kernels.h", self.0),
            format!("{C_DIR}/{}_kernels.c", self.0),
        ]
    }
}

impl Default for CPrefix {
    fn default() -> Self {
        CPrefix("mla".into())
    }
}

impl std::str::FromStr for CPrefix {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        CPrefix::new(s)
    }
}

impl std::fmt::Display for CPrefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Serialize)]
struct Version {
    major: u32,
    minor: u32,
    patch: u32,
}

/// A field of a family's argument struct.
#[derive(Serialize)]
struct Field {
    name: String,
    pointer: bool,
    pointer_int: u8,
    /// Pointers: the declaration (`const void* prefix_output;`).
    decl: String,
    doc: String,
    /// Its value in the `_ARGS_INIT` macro.
    init: String,
    zero_is_absent: u8,
}

#[derive(Serialize)]
struct Family {
    name: &'static str,
    upper: String,
    /// The header's comment on the struct.
    doc: String,
    fields: Vec<Field>,
    /// The `_ARGS_INIT` initializer list.
    init: String,
}

#[derive(Serialize)]
struct Image {
    symbol: String,
    arch: String,
    cc: u32,
    arch_specific: u8,
    cubin: u8,
    len: usize,
    bytes: String,
    /// Its path in the folder, size and sha256 as the manifest records them (what a launcher
    /// built to read its images from files checks them against).
    file: String,
    size: u64,
    sha256: String,
}

#[derive(Serialize)]
struct Axis {
    param: usize,
    per_block: u32,
    limit: u32,
}

#[derive(Serialize)]
struct Kernel {
    name: String,
    family: &'static str,
    /// The header's comment on the launcher.
    doc: String,
    n_fields: usize,
    field_param: String,
    field_constant: String,
    /// Rows of the parameter table (C initializers).
    params: Vec<String>,
    /// Rows of the constant table.
    constants: Vec<String>,
    grid_x: Axis,
    grid_y: Axis,
    block_threads: u32,
    shared_mem_bytes: u32,
    first_image: usize,
    images: Vec<Image>,
    archs: String,
    /// 1: launched with programmatic stream serialization on cc >= 9.0 (`launch.pdl`).
    pdl: u8,
    /// The size rule (`launch.size_rule`): the parameters whose product is the rows, and per
    /// range its bound and the kernel it names.
    rows: [usize; 2],
    ranges: Vec<(u64, String)>,
    /// Rows of its limits' table (`limits`, step 4 of the check).
    limits: Vec<String>,
    /// Its specializations (`launch.specializations`), in the order they are tried.
    specials: Vec<Special>,
    /// Its `select` block as C string literals, key then value, each pair followed by `, `.
    select: String,
    /// 1: another kernel's size rule or specializations name it, so no call selects it.
    reached: u8,
}

/// A specialization as its general kernel's table names it: the kernel, and the tests (rows of
/// a limit table) the checked values must pass for it to run.
#[derive(Serialize)]
struct Special {
    kernel: String,
    tests: Vec<String>,
}

/// `c/<prefix>_kernels.h` and `c/<prefix>_kernels.c` for the kernels of `manifest`, the images
/// taken from `files`.
pub fn launcher(
    manifest: &Manifest,
    files: &FileSet,
    prefix: &CPrefix,
) -> Result<FileSet, RenderError> {
    let err = |detail: String| RenderError::Template {
        template: format!("{C_DIR}/{}_kernels", prefix.as_str()),
        detail,
    };
    if manifest.kernels.is_empty() {
        return Err(err("the manifest has no kernels".into()));
    }
    let families = families(manifest, prefix).map_err(err)?;
    let mut kernels = Vec::new();
    let mut n_images = 0;
    for k in &manifest.kernels {
        let family = families
            .iter()
            .find(|f| f.name == k.family)
            .ok_or_else(|| err(format!("{}: no family {}", k.name, k.family)))?;
        let kernel = kernel(k, family, files, n_images, prefix).map_err(err)?;
        n_images += kernel.images.len();
        kernels.push(kernel);
    }
    // A rule's kernels are launched in place of the kernel with its checked values.
    for (k, entry) in kernels.iter().zip(&manifest.kernels) {
        for (_, target) in &k.ranges {
            let same = manifest
                .kernels
                .iter()
                .find(|t| &t.name == target)
                .is_some_and(|t| {
                    t.launch.size_rule.is_none()
                        && t.params
                            .iter()
                            .map(|p| &p.name)
                            .eq(entry.params.iter().map(|p| &p.name))
                });
            if !same {
                return Err(err(format!(
                    "{}: its size rule names {target}, which the manifest lacks, has a rule itself or takes other parameters",
                    k.name
                )));
            }
        }
    }
    // Kernels a launch reaches only through another are never selected.
    for k in &mut kernels {
        k.reached = u8::from(manifest.kernels.iter().any(|e| {
            let rule = e.launch.size_rule.iter().flat_map(|r| &r.ranges);
            rule.map(|r| &r.kernel)
                .chain(&e.launch.specializations)
                .any(|n| *n == k.name)
        }));
    }
    // A specialization is launched in place of its kernel where the checked values pass its tests.
    for (k, entry) in kernels.iter_mut().zip(&manifest.kernels) {
        for name in &entry.launch.specializations {
            let s = manifest
                .kernels
                .iter()
                .find(|t| &t.name == name)
                .ok_or_else(|| {
                    err(format!(
                        "{}: its specialization {name} is not in the manifest",
                        k.name
                    ))
                })?;
            k.specials.push(Special {
                kernel: name.clone(),
                tests: special_tests(entry, s).map_err(err)?,
            });
        }
    }
    let mut numbers = TOOL_VERSION.split('.').map(|n| n.parse::<u32>());
    let mut next = || -> Result<u32, RenderError> {
        numbers
            .next()
            .and_then(Result::ok)
            .ok_or_else(|| err(format!("version `{TOOL_VERSION}` is not MAJOR.MINOR.PATCH")))
    };
    let version = Version {
        major: next()?,
        minor: next()?,
        patch: next()?,
    };

    let mut tera = tera::Tera::default();
    tera.autoescape_on(vec![]);
    tera.add_raw_templates(TEMPLATES.iter().copied())
        .map_err(|e| err(e.to_string()))?;
    let mut ctx = tera::Context::new();
    ctx.insert("p", prefix.as_str());
    ctx.insert("P", &prefix.upper());
    ctx.insert("tool_version", TOOL_VERSION);
    ctx.insert("version", &version);
    ctx.insert("spec_source", &manifest.spec.source);
    ctx.insert("families", &families);
    // The programmatic launch is written only where some kernel needs it: the launcher of a spec
    // without pdl stays as it was.
    ctx.insert("any_pdl", &kernels.iter().any(|k| k.pdl == 1));
    // Likewise the size rule, limits and specializations (whose tests are limit rows).
    ctx.insert("any_rule", &kernels.iter().any(|k| !k.ranges.is_empty()));
    let any_special = kernels.iter().any(|k| !k.specials.is_empty());
    ctx.insert("any_special", &any_special);
    ctx.insert(
        "any_limits",
        &(any_special || kernels.iter().any(|k| !k.limits.is_empty())),
    );
    ctx.insert("kernels", &kernels);
    ctx.insert("n_images", &n_images.max(1));
    ctx.insert("max_params", &MAX_PARAMS);
    ctx.insert("max_factors", &MAX_FACTORS);
    ctx.insert("max_dims", &MAX_DIMS);
    ctx.insert(
        "max_fields",
        &families.iter().map(|f| f.fields.len()).max().unwrap_or(1),
    );
    let mut out = FileSet::new();
    for (template, file) in ["mla_kernels.h.tera", "mla_kernels.c.tera"]
        .into_iter()
        .zip(prefix.files())
    {
        let text = tera.render(template, &ctx).map_err(|e| {
            err(format!(
                "{e}: {}",
                std::error::Error::source(&e)
                    .map(|s| s.to_string())
                    .unwrap_or_default()
            ))
        })?;
        out.insert(file, text.into_bytes());
    }
    Ok(out)
}

/// Every family of the manifest in order of first appearance, with its struct's fields: the
/// union of its kernels' parameters (each new one placed after the name it follows in the first
/// kernel that has it, so the fields keep signature order), then names that are only constants.
fn families(manifest: &Manifest, prefix: &CPrefix) -> Result<Vec<Family>, String> {
    let mut out: Vec<Family> = Vec::new();
    let mut order: Vec<&'static str> = Vec::new();
    for k in &manifest.kernels {
        if !order.contains(&k.family) {
            order.push(k.family);
        }
    }
    for family in order {
        let kernels: Vec<&KernelEntry> = manifest
            .kernels
            .iter()
            .filter(|k| k.family == family)
            .collect();
        let mut names: Vec<&str> = Vec::new();
        for k in &kernels {
            let mut at = 0;
            for p in &k.params {
                match names.iter().position(|n| *n == p.name) {
                    Some(i) => at = i + 1,
                    None => {
                        names.insert(at, &p.name);
                        at += 1;
                    }
                }
            }
        }
        for k in &kernels {
            for c in k.constants.keys() {
                if !names.contains(&c.as_str()) {
                    names.push(c);
                }
            }
        }
        let mut fields = Vec::new();
        for name in names {
            let uses: Vec<&Param> = kernels
                .iter()
                .filter_map(|k| k.params.iter().find(|p| p.name == name))
                .collect();
            let is_constant = kernels.iter().any(|k| k.constants.contains_key(name));
            fields.push(field(family, name, &uses, is_constant, prefix)?);
        }
        let init = fields
            .iter()
            .map(|f| {
                if f.pointer {
                    format!("{}, 0", f.init)
                } else {
                    f.init.clone()
                }
            })
            .collect::<Vec<_>>()
            .join(", ");
        let upper = family.to_ascii_uppercase();
        let names: Vec<&str> = kernels.iter().map(|k| k.name.as_str()).collect();
        let doc = format!(
            "Arguments of the {family} kernels ({}): the union of their parameters, so one \
             struct serves each of them. Start from {P}_{upper}_ARGS_INIT. Pointers are device \
             addresses, each with the number of elements its buffer holds (<name>_numel); sizes \
             and strides count elements. A kernel refuses a field it does not take: a pointer \
             other than NULL, an integer other than 0 and {P}_DEFAULT.",
            names.join(", "),
            P = prefix.upper()
        );
        out.push(Family {
            name: family,
            upper,
            doc: wrap(&doc, 96).join("\n * "),
            fields,
            init,
        });
    }
    Ok(out)
}

/// One field of `family`'s struct: `uses` are the parameters of that name in the family's
/// kernels; `is_constant`, whether some kernel has it as a constant.
fn field(
    family: &str,
    name: &str,
    uses: &[&Param],
    is_constant: bool,
    prefix: &CPrefix,
) -> Result<Field, String> {
    let default = format!("{}_DEFAULT", prefix.upper());
    let Some(first) = uses.first() else {
        // Only ever a constant (head_size): a caller may state it, and must state it right.
        return Ok(Field {
            name: name.to_string(),
            pointer: false,
            pointer_int: 0,
            decl: String::new(),
            doc: format!(
                "a constant of the kernel: {default} (or 0) = not given, else it must be the kernel's"
            ),
            init: default,
            zero_is_absent: 1,
        });
    };
    if uses.iter().any(|p| p.kind != first.kind) || (is_constant && first.kind != ParamKind::I64) {
        return Err(format!(
            "{family}: `{name}` is a pointer in one kernel and an integer or a constant in another"
        ));
    }
    let doc = comment(&first.doc);
    if first.kind == ParamKind::Pointer {
        // A typed pointer where every kernel agrees on a type C has; else void.
        let base = match first.elem.as_deref() {
            Some("f32") => "float",
            Some("i32") => "int32_t",
            Some("u8") => "unsigned char",
            _ => "void",
        };
        let base = if uses.iter().all(|p| p.elem == first.elem) {
            base
        } else {
            "void"
        };
        let konst = if uses.iter().any(|p| p.role.writes()) {
            ""
        } else {
            "const "
        };
        return Ok(Field {
            name: name.to_string(),
            pointer: true,
            pointer_int: 1,
            decl: format!("{konst}{base}* {name};"),
            doc,
            init: "NULL".into(),
            zero_is_absent: 0,
        });
    }
    let defaults: Vec<&str> = uses
        .iter()
        .filter_map(|p| p.bounds.as_ref()?.default.as_deref())
        .collect();
    let mut doc = doc;
    if let Some(d) = defaults.first() {
        doc.push_str(&format!("; {default} = {d}"));
    }
    if is_constant {
        doc.push_str("; fixed in some kernels (must then match)");
    }
    // 0 stands for "not given" only where no kernel of the family can take 0: every parameter
    // of this name has a plain minimum above 0 (num_states >= 1).
    let zero_is_absent = uses.iter().all(|p| {
        p.bounds
            .as_ref()
            .and_then(|b| Expr::parse(&b.min).ok())
            .is_some_and(|e| e.factors.is_empty() && e.mul + e.add > 0)
    });
    Ok(Field {
        name: name.to_string(),
        pointer: false,
        pointer_int: 0,
        decl: String::new(),
        doc,
        // Every integer starts as "not given": one the kernel needs and the caller forgot (a
        // stride, num_heads) is then refused as required, where a 0 would pass as a broadcast
        // stride or an empty launch.
        init: default,
        zero_is_absent: u8::from(zero_is_absent),
    })
}

#[cfg(test)]
mod tests {
    use super::tables::string;
    use super::*;

    #[test]
    fn prefixes_are_c_identifiers() {
        for ok in ["mla", "engine2", "My_lib", "a"] {
            assert!(CPrefix::new(ok).is_ok(), "{ok}");
        }
        for bad in ["", "_mla", "2x", "a-b", "a b", "ä", &"x".repeat(33)] {
            assert!(CPrefix::new(bad).is_err(), "{bad}");
        }
        assert_eq!(CPrefix::default().files()[0], "c/mla_kernels.h");
        assert_eq!(CPrefix::new("eng").unwrap().upper(), "ENG");
    }

    #[test]
    fn strings_and_comments_are_escaped() {
        assert_eq!(string("a\"b\\c"), "\"a\\\"b\\\\c\"");
        assert_eq!(comment("x */ y"), "x * / y");
        assert_eq!(wrap("aa bb cc", 5), vec!["aa bb", "cc"]);
    }
}
