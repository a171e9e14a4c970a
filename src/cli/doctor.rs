//! `mla-gen doctor`: where NVRTC is, what PTX it emits, which driver can JIT it.

use mla_gen::{driver, nvrtc};
use serde_json::{json, Value};

use crate::failure::Failure;

/// The findings, printed as text as they come, or gathered into one JSON object.
pub fn doctor(as_json: bool) -> Result<(), Failure> {
    let say = |line: String| {
        if !as_json {
            println!("{line}");
        }
    };
    let mut report = json!({ "mla_gen": mla_gen::render::TOOL_VERSION });
    say(format!("mla-gen {}", mla_gen::render::TOOL_VERSION));
    say("NVRTC search order:".into());
    let mut places = Vec::new();
    let candidates = nvrtc::candidates();
    for c in &candidates {
        match &c.found {
            Some(p) => say(format!("  found    {}  ({})", p.display(), c.place)),
            None => say(format!("  -        {}", c.place)),
        }
        places.push(
            json!({"place": c.place, "found": c.found.as_ref().map(|p| p.display().to_string())}),
        );
    }
    report["search"] = Value::Array(places);
    let result = nvrtc_report(&candidates, &say);
    match result {
        Ok(v) => report["nvrtc"] = v,
        Err(f) if as_json => report["nvrtc"] = json!({ "error": f.0 }),
        Err(f) => return Err(f),
    }
    let needed = report["nvrtc"]["oldest_driver_cuda"]
        .as_str()
        .map(str::to_string);
    match driver::driver_cuda_version() {
        Ok((maj, min)) => {
            let can_jit = needed
                .as_deref()
                .and_then(|cuda| driver::driver_can_jit((maj, min), cuda));
            let verdict = match can_jit {
                Some(true) => ": can JIT this PTX",
                Some(false) => ": CANNOT JIT this PTX (use CUBIN, or the pinned NVRTC)",
                None => "",
            };
            say(format!("GPU driver: CUDA {maj}.{min}{verdict}"));
            report["driver"] = json!({"cuda": format!("{maj}.{min}"), "can_jit_ptx": can_jit});
        }
        Err(why) => {
            say(format!(
                "GPU driver: none ({why}); generation does not need one"
            ));
            report["driver"] = json!({ "error": why });
        }
    }
    if as_json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        if let Some(e) = report["nvrtc"]["error"].as_str() {
            return Err(Failure(e.to_string(), 1));
        }
    }
    Ok(())
}

/// Load NVRTC and compile a probe: path, the place of the search list it came from, version,
/// targets, release, PTX ISA, oldest driver.
fn nvrtc_report(candidates: &[nvrtc::Candidate], say: &dyn Fn(String)) -> Result<Value, Failure> {
    let n = nvrtc::load().map_err(|e| Failure(e.to_string(), 1))?;
    // A bare library name is what the system loader resolved (the list's last place).
    let place = candidates
        .iter()
        .find(|c| c.found.as_deref() == Some(std::path::Path::new(&n.path)))
        .or(candidates.last())
        .map(|c| c.place.clone())
        .unwrap_or_default();
    say(format!("NVRTC loaded: {}", n.path));
    say(format!("  from: {place}"));
    say(format!("  version: {}", n.version()));
    let targets: Vec<String> = n
        .supported_archs
        .iter()
        .map(|a| format!("sm_{a}"))
        .collect();
    say(format!("  targets: {}", targets.join(" ")));
    let probe = "extern \"C\" __global__ void mla_gen_probe(float* x) { x[threadIdx.x] = 1.0f; }";
    let arch = n
        .supported_archs
        .iter()
        .copied()
        .find(|&a| a >= 80)
        .unwrap_or(80);
    let compiled = n.compile(
        "probe.cu",
        probe,
        &[format!("--gpu-architecture=compute_{arch}")],
        true,
        false,
    )?;
    let ptx = match compiled {
        Ok(c) => c.ptx.unwrap_or_default(),
        Err(f) => {
            return Err(Failure(
                format!("NVRTC cannot compile a probe: {}\n{}", f.message, f.log),
                1,
            ))
        }
    };
    let release = nvrtc::ptx_toolkit_release(&ptx).unwrap_or_else(|| "?".into());
    say(format!("  release: {release}"));
    let isa = nvrtc::ptx_isa(&ptx).unwrap_or_else(|| "?".into());
    let needed = nvrtc::oldest_driver_for_isa(&isa);
    match &needed {
        Some((cuda, branch)) if !branch.is_empty() => say(format!(
            "  PTX ISA: {isa} (JIT needs a CUDA {cuda} driver or newer, {branch}+); CUBIN needs no JIT"
        )),
        Some((cuda, _)) => say(format!(
            "  PTX ISA: {isa} (JIT needs a CUDA {cuda} driver or newer); CUBIN needs no JIT"
        )),
        None => say(format!("  PTX ISA: {isa}")),
    }
    Ok(json!({
        "path": n.path,
        "place": place,
        "version": n.version(),
        "targets": targets,
        "release": release,
        "ptx_isa": isa,
        "oldest_driver_cuda": needed.as_ref().map(|(c, _)| c.to_string()),
        "oldest_driver_branch": needed.as_ref().map(|(_, b)| b.to_string()),
    }))
}
