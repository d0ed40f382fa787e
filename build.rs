//! Lays out the release binary's code in the order it runs.
//!
//! `ray-dashd` is one binary that carries every built-in module and Ray
//! helper, about 10 MB of code, of which the host runs under 2 MB. Linux
//! maps code around every page a process touches (fault-around, 64 KiB at a
//! time), so with the functions the host runs scattered among the ones it
//! never calls, most of the binary ended up resident. `link/ray-dashd.order`
//! lists the functions the host and its built-in modules ran under a
//! recorded workload (`scripts/symbol-order` writes it); the linker puts them
//! first, together, in an output section of their own (`.text.hot`). See
//! docs/benchmarks.md, "Peak RSS and the link order".
//!
//! The list is handed to the linker as a linker script of section patterns,
//! not as a symbol ordering file. A Rust symbol's name ends in a hash of its
//! crate's build (toolchain, version, dependencies, features): an exact list
//! written in one session had lost 59 % of its names five sessions of code
//! and `Cargo.lock` changes later. So each listed function is asked for
//! twice: exactly first, then with its hash left open, which still finds it
//! once renamed, with the other instances of a generic function behind the
//! exact ones (see [`section_patterns`]).
//!
//! Only release builds use it, and only when the linker takes the script
//! (LLD, Rust's default linker on x86_64 Linux since 1.90, and GNU ld do): a
//! probe links an empty program with a script of the same form first. A
//! pattern that matches nothing is skipped, so a stale list costs memory,
//! never correctness.

use std::env;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

const ORDER_FILE: &str = "link/ray-dashd.order";

fn main() {
    println!("cargo::rerun-if-changed={ORDER_FILE}");
    println!("cargo::rerun-if-changed=link/script.rs");
    println!("cargo::rerun-if-changed=build.rs");
    if env::var("PROFILE").as_deref() != Ok("release") {
        return;
    }
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").unwrap_or_default());
    let order = match std::fs::read_to_string(manifest_dir.join(ORDER_FILE)) {
        Ok(order) => order,
        Err(e) => {
            println!("cargo::warning=linking ray-dashd without its code order: {ORDER_FILE}: {e}");
            return;
        }
    };
    let patterns = section_patterns(&order);
    let script = out_dir.join("hot-text.ld");
    let probe_script = out_dir.join("hot-text-probe.ld");
    let written = std::fs::write(&script, linker_script(&patterns))
        .and_then(|()| std::fs::write(&probe_script, linker_script(&[".text.main*".to_owned()])));
    if let Err(e) = written {
        println!(
            "cargo::warning=linking ray-dashd without its code order: writing the script: {e}"
        );
        return;
    }
    match probe_linker(&out_dir, &probe_script) {
        Ok(()) => println!(
            "cargo::rustc-link-arg-bin=ray-dashd={}",
            script_arg(&script)
        ),
        Err(why) => println!(
            "cargo::warning=linking ray-dashd without its code order ({why}): \
             it works the same but keeps more of its code resident"
        ),
    }
}

/// The linker argument that adds `script` to the default layout.
fn script_arg(script: &Path) -> String {
    format!("-Wl,-T,{}", script.display())
}

// section_patterns, section_pattern, linker_script, HOT_SECTION: shared
// with the crate's unit tests.
include!("link/script.rs");

/// Links an empty program with `script`, the way this build links, and says
/// why not when the linker refuses it.
fn probe_linker(out_dir: &Path, script: &Path) -> Result<(), String> {
    let source = out_dir.join("order_probe.rs");
    std::fs::write(&source, "fn main() {}\n").map_err(|e| format!("writing the probe: {e}"))?;
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let mut cmd = Command::new(rustc);
    cmd.arg("--crate-type=bin")
        .arg("--crate-name=order_probe")
        .arg("-o")
        .arg(out_dir.join("order_probe"))
        .arg(&source);
    if let Ok(target) = env::var("TARGET") {
        cmd.arg("--target").arg(target);
    }
    // The linker and flags this build uses, so the probe links the same way.
    if let Some(linker) = env::var_os("RUSTC_LINKER") {
        let mut arg = OsString::from("linker=");
        arg.push(linker);
        cmd.arg("-C").arg(arg);
    }
    if let Ok(flags) = env::var("CARGO_ENCODED_RUSTFLAGS") {
        cmd.args(flags.split('\x1f').filter(|flag| !flag.is_empty()));
    }
    cmd.arg("-C")
        .arg(format!("link-arg={}", script_arg(script)));
    let output = cmd.output().map_err(|e| format!("running rustc: {e}"))?;
    if output.status.success() {
        return Ok(());
    }
    // The linker's own complaint, not rustc's echo of the whole command.
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines = || {
        (stderr.lines())
            .map(|line| line.trim().trim_start_matches("= note:").trim())
            .filter(|line| !line.contains("\"-Wl,"))
    };
    let reason = (lines().find(|line| line.contains("script") || line.contains("INSERT")))
        .or_else(|| lines().rfind(|line| line.contains("error")))
        .unwrap_or("the probe did not link");
    Err(format!("the linker refused it: {reason}"))
}
