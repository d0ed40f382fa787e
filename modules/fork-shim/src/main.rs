//! `ray-dashd-fork-shim`: the fork shim as a binary of its own, kept for
//! configs that name it; ray-dashd starts `ray-dashd fork-shim`, the same
//! code.

fn main() {
    ray_dashd_fork_shim::main(std::env::args_os().skip(1))
}
