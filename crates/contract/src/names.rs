//! The module contract's names: how the host tells a module where to listen
//! and who it is, and where it asks whether the module is ready. The host
//! sets and uses them, the SDK and the helpers read them; tests that assert
//! the wire contract itself spell them out.

/// The variable holding the Unix socket path a module listens on.
pub const SOCKET_VAR: &str = "RAY_DASHD_SOCKET";
/// The variable holding the module's name.
pub const MODULE_VAR: &str = "RAY_DASHD_MODULE";
/// The variable holding the module's incarnation: 0, then +1 at each
/// restart.
pub const INCARNATION_VAR: &str = "RAY_DASHD_INCARNATION";
/// The variable holding the Ray session folder.
pub const SESSION_DIR_VAR: &str = "RAY_DASHD_SESSION_DIR";
/// The variable holding the folder for the module's own logs.
pub const LOG_DIR_VAR: &str = "RAY_DASHD_LOG_DIR";
/// The variable holding the cgroup folder of the incarnation, set only
/// when the host puts modules in cgroups: a process forked for the module
/// elsewhere (by the zygote) joins it there.
pub const CGROUP_VAR: &str = "RAY_DASHD_CGROUP";

/// The path the host polls on a module's socket: the module is ready once
/// it answers 200.
pub const HEALTHZ_PATH: &str = "/api/healthz";

/// The header of a module's answer that declines a request of a route with
/// a `fallback` module: the host gives that module the request instead.
/// Its value says why (the host logs it). Sent with [`DECLINE_STATUS`].
pub const DECLINE_HEADER: &str = "x-ray-dashd-decline";

/// The status of a declining answer: 421 Misdirected Request.
pub const DECLINE_STATUS: u16 = 421;

/// What every module socket's file name starts with; Ray's modules reach
/// each other on the same names.
pub const SOCKET_PREFIX: &str = "dash_";
/// What the zygote's fork socket adds to the zygote's socket name.
pub const FORK_SOCKET_SUFFIX: &str = ".fork";

/// The file name of `module`'s socket in the session's `sockets` folder:
/// `dash_<module>`.
pub fn socket_name(module: &str) -> String {
    format!("{SOCKET_PREFIX}{module}")
}

/// The file name of the socket zygote module `zygote` takes fork requests
/// on, beside the module sockets: `dash_<zygote>.fork`.
pub fn fork_socket_name(zygote: &str) -> String {
    format!("{SOCKET_PREFIX}{zygote}{FORK_SOCKET_SUFFIX}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names are the ones the Python side (`modules/ray`) and every
    /// module already written use.
    #[test]
    fn names_are_the_wire_contracts() {
        assert_eq!(socket_name("logs"), "dash_logs");
        assert_eq!(socket_name("ReportHead"), "dash_ReportHead");
        assert_eq!(fork_socket_name("Z"), "dash_Z.fork");
        assert_eq!(HEALTHZ_PATH, "/api/healthz");
        let vars = [
            SOCKET_VAR,
            MODULE_VAR,
            INCARNATION_VAR,
            SESSION_DIR_VAR,
            LOG_DIR_VAR,
            CGROUP_VAR,
        ];
        assert!(vars.iter().all(|v| v.starts_with("RAY_DASHD_")), "{vars:?}");
    }
}
