//! `ray-dashd-example`: the example module as a binary of its own, kept for
//! configs that name it; `ray-dashd module example` runs the same code.

fn main() -> std::process::ExitCode {
    ray_dashd_example::main()
}
