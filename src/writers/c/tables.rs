//! The per-kernel rows of the C launcher's tables: each parameter's contract, the kernel's
//! constants, grid rule and images, as C initializers (and the text helpers they need).

use super::*;

/// Text safe inside a C comment.
pub(super) fn comment(text: &str) -> String {
    text.replace("*/", "* /").replace("/*", "/ *")
}

/// A C string literal.
pub(super) fn string(text: &str) -> String {
    let mut s = String::from("\"");
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                s.push('\\');
                s.push(c);
            }
            c if c.is_ascii_graphic() || c == ' ' => s.push(c),
            c => s.push_str(&format!("\\x{:02x}", c as u32 & 0xff)),
        }
    }
    s.push('"');
    s
}

/// An expression resolved as `host::check::Plan` resolves it: names to parameter indexes, each
/// constant substituted by its own expression. Rendered as a C `<prefix>_expr` initializer.
pub(super) fn expr(k: &KernelEntry, text: &str) -> Result<String, String> {
    let name = &k.name;
    let index = |n: &str| k.params.iter().position(|p| p.name == n);
    let e = Expr::parse(text).map_err(|e| format!("{name}: {e}"))?;
    let (mut mul, add) = (e.mul, e.add);
    let mut factors = Vec::new();
    for f in &e.factors {
        if let Some(i) = index(f) {
            factors.push(i);
            continue;
        }
        let c = k.constants.get(f).ok_or_else(|| {
            format!("{name}: `{text}` names `{f}`, which is neither a parameter nor a constant")
        })?;
        let c = Expr::parse(c).map_err(|e| format!("{name}: {e}"))?;
        if c.add != 0 {
            return Err(format!("{name}: constant `{f}` cannot be a factor"));
        }
        mul = mul
            .checked_mul(c.mul)
            .ok_or(format!("{name}: `{text}` overflows"))?;
        for g in &c.factors {
            factors.push(index(g).ok_or_else(|| {
                format!("{name}: constant `{f}` names `{g}`, which is not a parameter")
            })?);
        }
    }
    if factors.len() > MAX_FACTORS {
        return Err(format!(
            "{name}: `{text}` has more than {MAX_FACTORS} factors"
        ));
    }
    for &i in &factors {
        if k.params[i].kind != ParamKind::I64 {
            return Err(format!("{name}: `{text}` names a pointer"));
        }
    }
    let list: Vec<String> = factors.iter().map(usize::to_string).collect();
    let list = if list.is_empty() {
        "0".to_string()
    } else {
        list.join(", ")
    };
    Ok(format!(
        "{{ {}, {mul}, {add}, {}, {{ {list} }} }}",
        string(text),
        factors.len()
    ))
}

/// A `<prefix>_limit` row: `lo <= hi` (`lo == hi` where `equal`), both expressions over `k`'s
/// integers; `why` is what a refusal quotes (a kernel's limit), none for a specialization's test.
/// Long rows break at `newline`.
fn limit_row(
    k: &KernelEntry,
    lo: &str,
    hi: &str,
    equal: bool,
    why: Option<&str>,
    newline: &str,
) -> Result<String, String> {
    let row = [
        expr(k, lo)?,
        expr(k, hi)?,
        u8::from(equal).to_string(),
        why.map_or("NULL".into(), string),
    ];
    Ok(format!("{{ {} }}", join_wrapped(&row, 100, newline)))
}

/// The row of one of `k`'s limits (docs/MANIFEST.md, step 4): a maximum past `i64` is `i64::MAX`,
/// as the Rust checker reads it.
fn limit(k: &KernelEntry, l: &Limit, newline: &str) -> Result<String, String> {
    let max = i64::try_from(l.max).unwrap_or(i64::MAX).to_string();
    limit_row(k, &l.expr, &max, false, Some(&l.why), newline)
}

/// The tests that send a launch of `k`, its check passed, to its specialization `s`
/// (docs/MANIFEST.md, "Specializations"): the integer bounds and limits of `s` that `k`'s do not
/// already enforce, a bound whose minimum and maximum agree as one equality. `s` must be what
/// the manifest promises: `k`'s parameters and constants, no size rule or specializations, a
/// contract that adds to `k`'s only integer bounds and limits (so the tests are all it needs).
pub(super) fn special_tests(k: &KernelEntry, s: &KernelEntry) -> Result<Vec<String>, String> {
    // (Its parameters' docs may say more.)
    let unbounded = |p: &Param| Param {
        bounds: None,
        doc: String::new(),
        ..p.clone()
    };
    let same = s.launch.size_rule.is_none()
        && s.launch.specializations.is_empty()
        && s.constants == k.constants
        && s.params.len() == k.params.len()
        && s.params
            .iter()
            .zip(&k.params)
            .all(|(a, b)| unbounded(a) == unbounded(b));
    if !same {
        return Err(format!(
            "{}: its specialization {} has a size rule or specializations itself, or differs in more than integer bounds and limits",
            k.name, s.name
        ));
    }
    // (Rows of the tests' table, inside the specialization's row.)
    let (newline, mut tests) = ("\n          ", Vec::new());
    for (p, general) in s.params.iter().zip(&k.params) {
        let Some(b) = &p.bounds else { continue };
        let general = general.bounds.as_ref();
        let new_min = general.is_none_or(|g| g.min != b.min);
        let new_max = b.max.is_some() && general.is_none_or(|g| g.max != b.max);
        match &b.max {
            Some(max) if *max == b.min && (new_min || new_max) => {
                tests.push(limit_row(s, &p.name, max, true, None, newline)?);
            }
            max => {
                if new_min {
                    tests.push(limit_row(s, &b.min, &p.name, false, None, newline)?);
                }
                if let Some(max) = max.as_ref().filter(|_| new_max) {
                    tests.push(limit_row(s, &p.name, max, false, None, newline)?);
                }
            }
        }
    }
    for l in s.limits.iter().filter(|l| !k.limits.contains(l)) {
        tests.push(limit(s, l, newline)?);
    }
    if tests.is_empty() {
        return Err(format!(
            "{}: its specialization {} adds nothing to its contract (it would take every launch)",
            k.name, s.name
        ));
    }
    Ok(tests)
}

/// One row of a kernel's parameter table.
pub(super) fn param_row(
    k: &KernelEntry,
    p: &Param,
    slot: usize,
    prefix: &CPrefix,
) -> Result<String, String> {
    let mut row = vec![
        format!(".name = {}", string(&p.name)),
        format!(".slot = {slot}"),
    ];
    if p.kind == ParamKind::Pointer {
        row.push(".pointer = 1".into());
        if p.role.writes() {
            row.push(".writes = 1".into());
        }
        if p.nullable {
            row.push(".nullable = 1".into());
        }
        if let Some(elem) = &p.elem {
            row.push(format!(".elem = {}", string(elem)));
        }
        row.push(format!(".elem_bytes = {}", p.elem_bytes.max(1)));
        if let Some(t) = &p.tensor {
            if t.dims.len() > MAX_DIMS {
                return Err(format!(
                    "{}: {} has more than {MAX_DIMS} dimensions",
                    k.name, p.name
                ));
            }
            row.push(".tensor = 1".into());
            row.push(format!(".align_bytes = {}", t.align_bytes.max(1)));
            row.push(format!(".stride_multiple = {}", t.stride_multiple.max(1)));
            if t.distinct {
                row.push(".distinct = 1".into());
            }
            row.push(format!(".n_dims = {}", t.dims.len()));
            if !t.dims.is_empty() {
                let dims = t
                    .dims
                    .iter()
                    .map(|d| {
                        Ok(format!(
                            "\n          {{ {}, {}, {} }}",
                            string(&d.label),
                            expr(k, &d.size)?,
                            expr(k, &d.stride)?
                        ))
                    })
                    .collect::<Result<Vec<_>, String>>()?;
                let head = join_wrapped(&row, 100, "\n      ");
                return Ok(format!(
                    "{{ {head},\n      .dims = (const {p}_dim[]){{{} }} }}",
                    dims.join(","),
                    p = prefix.as_str()
                ));
            }
        } else {
            row.push(".align_bytes = 1".into());
            row.push(".stride_multiple = 1".into());
        }
    } else if let Some(b) = &p.bounds {
        let bound = |field: &str, e: &str| -> Result<String, String> {
            Ok(format!(
                ".{field} = &(const {}_expr){}",
                prefix.as_str(),
                expr(k, e)?
            ))
        };
        row.push(bound("min", &b.min)?);
        if let Some(m) = &b.max {
            row.push(bound("max", m)?);
        }
        if let Some(d) = &b.default {
            row.push(bound("dflt", d)?);
        }
    }
    Ok(format!("{{ {} }}", join_wrapped(&row, 100, "\n      ")))
}

pub(super) fn kernel(
    k: &KernelEntry,
    family: &Family,
    files: &FileSet,
    first_image: usize,
    prefix: &CPrefix,
) -> Result<Kernel, String> {
    let name = &k.name;
    if k.params.len() > MAX_PARAMS {
        return Err(format!(
            "{name}: {} parameters, the C launcher takes at most {MAX_PARAMS}",
            k.params.len()
        ));
    }
    if k.launch.shared_mem_bytes > MAX_DEFAULT_SHARED_MEM {
        return Err(format!(
            "{name}: {} bytes of dynamic shared memory need an opt-in the C launcher does not make",
            k.launch.shared_mem_bytes
        ));
    }
    let slot = |n: &str| family.fields.iter().position(|f| f.name == n);
    let mut params = Vec::new();
    for p in &k.params {
        let s = slot(&p.name).ok_or_else(|| format!("{name}: {} has no field", p.name))?;
        params.push(param_row(k, p, s, prefix)?);
    }
    let constant_names: Vec<&String> = k.constants.keys().collect();
    let mut constants = Vec::new();
    for (c, text) in &k.constants {
        constants.push(format!("{{ {}, {} }}", string(c), expr(k, text)?));
    }
    let per_field = |f: &dyn Fn(&str) -> Option<usize>| {
        family
            .fields
            .iter()
            .map(|x| f(&x.name).map_or("-1".to_string(), |i| i.to_string()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let field_param = per_field(&|n| k.params.iter().position(|p| p.name == n));
    let field_constant = per_field(&|n| constant_names.iter().position(|c| *c == n));
    let axis = |a: &crate::contract::GridAxis| -> Result<Axis, String> {
        Ok(Axis {
            param: k
                .params
                .iter()
                .position(|p| p.name == a.dim && p.kind == ParamKind::I64)
                .ok_or_else(|| {
                    format!(
                        "{name}: the grid counts `{}`, which is not an integer parameter",
                        a.dim
                    )
                })?,
            per_block: a.per_block.max(1),
            limit: a.limit,
        })
    };

    let mut images = Vec::new();
    for a in &k.archs {
        let arch = crate::gen::spec::Arch::parse(&a.arch)?;
        let mut push = |kind: &str, file: &str, cubin: bool| -> Result<(), String> {
            let mut bytes = files
                .get(file)
                .cloned()
                .ok_or_else(|| format!("{name}: {file} is not among the files"))?;
            // The path becomes a C string literal: only what mla-gen writes may reach it.
            if !file
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'))
            {
                return Err(format!(
                    "{name}: the image path {file:?} is not one mla-gen writes"
                ));
            }
            let size = bytes.len() as u64;
            let sha256 = crate::gen::sha256_hex(&bytes);
            if !cubin {
                bytes.push(0); // PTX is loaded as a C string
            }
            images.push(Image {
                symbol: format!("{name}_{}_{kind}", a.arch),
                arch: a.arch.clone(),
                cc: arch.major_minor,
                arch_specific: u8::from(arch.arch_specific),
                cubin: u8::from(cubin),
                len: bytes.len(),
                bytes: c_bytes(&bytes),
                file: file.to_string(),
                size,
                sha256,
            });
            Ok(())
        };
        if let Some(c) = a.cubin.as_ref().filter(|_| arch.real) {
            push("cubin", &c.file, true)?;
        }
        // The artifact rule never runs an arch-specific PTX: it is not embedded.
        if let Some(p) = a.ptx.as_ref().filter(|_| !arch.arch_specific) {
            push("ptx", &p.file, false)?;
        }
    }
    let archs = k
        .archs
        .iter()
        .map(|a| a.arch.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    let (rows, ranges) = match &k.launch.size_rule {
        None => ([0, 0], Vec::new()),
        Some(rule) => {
            let int_param = |n: &str| {
                k.params
                    .iter()
                    .position(|p| p.name == n && p.kind == ParamKind::I64)
                    .ok_or_else(|| {
                        format!(
                            "{name}: the size rule counts `{n}`, which is not an integer parameter"
                        )
                    })
            };
            let ranges = rule
                .ranges
                .iter()
                .map(|r| (r.below_rows, r.kernel.clone()))
                .collect();
            (
                [int_param(&rule.rows[0])?, int_param(&rule.rows[1])?],
                ranges,
            )
        }
    };
    Ok(Kernel {
        name: name.clone(),
        family: family.name,
        doc: kernel_doc(k, &archs, prefix),
        n_fields: family.fields.len(),
        field_param,
        field_constant,
        params,
        constants,
        grid_x: axis(&k.launch.grid_x)?,
        grid_y: axis(&k.launch.grid_y)?,
        block_threads: k.launch.block_threads,
        shared_mem_bytes: k.launch.shared_mem_bytes,
        first_image,
        images,
        archs,
        pdl: u8::from(k.launch.pdl),
        rows,
        ranges,
        limits: k
            .limits
            .iter()
            .map(|l| limit(k, l, "\n      "))
            .collect::<Result<_, _>>()?,
        specials: Vec::new(), // filled by `launcher`, which sees the other kernels
        select: k
            .select
            .iter()
            .map(|(key, value)| format!("{}, {}, ", string(key), string(value)))
            .collect(),
        reached: 0, // likewise
    })
}

/// The header's comment on a launcher: what it takes and what it is built for, wrapped.
pub(super) fn kernel_doc(k: &KernelEntry, archs: &str, prefix: &CPrefix) -> String {
    let takes: Vec<String> = k
        .params
        .iter()
        .map(|p| {
            let default = p.bounds.as_ref().and_then(|b| b.default.as_deref());
            match (p.nullable, default) {
                (true, _) => format!("{} (or NULL)", p.name),
                (_, Some(d)) => format!("{} ({}_DEFAULT: {d})", p.name, prefix.upper()),
                _ => p.name.clone(),
            }
        })
        .collect();
    let mut text = format!("{} ({archs}) takes {}.", k.name, takes.join(", "));
    if !k.constants.is_empty() {
        let fixed: Vec<String> = k
            .constants
            .iter()
            .map(|(n, v)| format!("{n} = {v}"))
            .collect();
        text.push_str(&format!(" Built for {}.", fixed.join(", ")));
    }
    let g = &k.launch;
    text.push_str(&format!(
        " Grid ceil({} / {}) x ceil({} / {}), {} threads per block.",
        g.grid_x.dim, g.grid_x.per_block, g.grid_y.dim, g.grid_y.per_block, g.block_threads
    ));
    if !k.launch.specializations.is_empty() {
        text.push_str(&format!(
            " Runs {} instead where the arguments meet its contract too.",
            k.launch.specializations.join(", then ")
        ));
    }
    if k.launch.pdl {
        text.push_str(
            " Programmatic dependent launch on compute capability 9.0 and newer: it may start before the previous work on the stream ends, and waits for it before touching memory.",
        );
    }
    wrap(&comment(&text), 96).join("\n * ")
}

pub(super) fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut line = String::new();
    for word in text.split(' ') {
        if !line.is_empty() && line.len() + 1 + word.len() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    lines.push(line);
    lines
}

/// `items` joined with ", ", a line break (`newline`) before an item that would pass `width`.
pub(super) fn join_wrapped(items: &[String], width: usize, newline: &str) -> String {
    let mut out = String::new();
    let mut line = 0;
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(',');
            if line + 2 + item.len() > width {
                out.push_str(newline);
                line = 0;
            } else {
                out.push(' ');
                line += 2;
            }
        }
        out.push_str(item);
        line += item.len();
    }
    out
}

pub(super) fn c_bytes(bytes: &[u8]) -> String {
    bytes
        .chunks(20)
        .map(|line| {
            let cells: Vec<String> = line.iter().map(|b| format!("0x{b:02x}")).collect();
            format!("    {},", cells.join(", "))
        })
        .collect::<Vec<_>>()
        .join("\n")
}
