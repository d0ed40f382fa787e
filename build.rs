//! Lays out the release binary's code in the order it runs.
//!
//! `ray-dashd` is one binary that carries every built-in module and Ray
//! helper, about 10 MB of code, of which the host runs under 2 MB. Linux
//! maps code around every page a process touches (fault-around, 64 KiB at a
//! time), so with the functions the host runs scattered among the ones it
//! never calls, most of the binary ended up resident. `link/ray-dashd.order`
//! lists the functions the host and its built-in modules ran under a
//! recorded workload (`scripts/symbol-order` writes it); the linker puts them
//! first, together. See docs/benchmarks.md, "Peak RSS and the link order".
//!
//! Only release builds use it, and only when the linker takes the option
//! (LLD, Rust's default linker on x86_64 Linux since 1.90): a probe links an
//! empty program with it first. A name the build no longer has is skipped,
//! so a stale list costs memory, never correctness.

use std::env;
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;

const ORDER_FILE: &str = "link/ray-dashd.order";

fn main() {
    println!("cargo::rerun-if-changed={ORDER_FILE}");
    println!("cargo::rerun-if-changed=build.rs");
    if env::var("PROFILE").as_deref() != Ok("release") {
        return;
    }
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let order = manifest_dir.join(ORDER_FILE);
    if !order.is_file() {
        println!(
            "cargo::warning=linking ray-dashd without its symbol order: {ORDER_FILE} is missing"
        );
        return;
    }
    let args = [
        format!("-Wl,--symbol-ordering-file={}", order.display()),
        "-Wl,--no-warn-symbol-ordering".to_owned(),
    ];
    match probe_linker(&args) {
        Ok(()) => {
            for arg in args {
                println!("cargo::rustc-link-arg-bin=ray-dashd={arg}");
            }
        }
        Err(why) => println!(
            "cargo::warning=linking ray-dashd without its symbol order ({why}): \
             it works the same but keeps more of its code resident"
        ),
    }
}

/// Links an empty program with `args`, the way this build links, and says
/// why not when the linker refuses them.
fn probe_linker(args: &[String]) -> Result<(), String> {
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").ok_or("OUT_DIR is not set")?);
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
    for arg in args {
        cmd.arg("-C").arg(format!("link-arg={arg}"));
    }
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
    let reason = (lines().find(|line| line.contains("ordering")))
        .or_else(|| lines().rfind(|line| line.contains("error")))
        .unwrap_or("the probe did not link");
    Err(format!("the linker refused it: {reason}"))
}
