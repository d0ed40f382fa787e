//! Faults a test can set off: a place marked with [`fault_point!`] does
//! what the `FAILPOINTS` environment variable says for its name (`sleep(ms)`,
//! `panic`, `return`…, as the `fail` crate reads them) when the binary is
//! built with the `failpoints` feature, and nothing at all otherwise. So a
//! test can make a `/proc` read take a minute and show what else goes on
//! meanwhile; a release build carries no trace of it.

/// Marks a place where a test may inject a fault under `$name`.
macro_rules! fault_point {
    ($name:literal) => {
        #[cfg(feature = "failpoints")]
        fail::fail_point!($name);
    };
}
pub(crate) use fault_point;

/// Reads `FAILPOINTS` (a bad one panics, naming it); the faults stay set
/// while the returned guard lives.
#[cfg(feature = "failpoints")]
pub fn from_env() -> fail::FailScenario<'static> {
    fail::FailScenario::setup()
}
