//! `ray-dashd-logs`: the logs module as a binary of its own, kept for
//! configs that name it; `ray-dashd module logs` runs the same code.

fn main() -> std::process::ExitCode {
    ray_dashd_logs::main()
}
