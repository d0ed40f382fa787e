//! The folder swap attack against the functions every route goes through:
//! while a thread exchanges `sub` (a real folder) with a link leading out,
//! opening and identifying `sub/secret.txt` and listing must never reach
//! the folder outside, with `openat2` and with the component walk alike.

use std::io::Read;
use std::time::{Duration, Instant};

use crate::beneath::Strategy;
use crate::error::LogsError;
use crate::files::{FileId, LogDir};
use crate::fixture::{Fixture, INSIDE, OUTSIDE, OUTSIDE_ONLY};

/// Rounds per strategy, unless [`MAX_TIME`] runs out first. With the old
/// check-then-open code, 10,000 rounds leaked between 2 and 300 times on
/// a loaded 2-core machine (the swapper has to get a core), so this many
/// fail it however the threads are scheduled; a round takes ~0.1 ms.
const MAX_ROUNDS: usize = 20_000;

/// Bound on each strategy's run, for a slow machine.
const MAX_TIME: Duration = Duration::from_secs(4);

/// A listing every this many rounds (a listing costs more than an open).
const LIST_EVERY: usize = 50;

/// Opens, identifies and lists `sub/secret.txt` in `dir` while `sub` is
/// swapped, failing at the first answer from outside; returns how many
/// opens served the inside file and how many were refused.
fn race(dir: &LogDir, fixture: &Fixture) -> (usize, usize) {
    let swapper = fixture.race();
    let outside = rustix::fs::stat(fixture.outside().join("secret.txt")).unwrap();
    let outside = FileId::of(&outside);
    let started = Instant::now();
    let (mut served, mut refused) = (0, 0);
    for round in 0..MAX_ROUNDS {
        if started.elapsed() > MAX_TIME {
            break;
        }
        // Refusals (`sub` is the link right now) are expected; only what
        // is served matters.
        match dir.open("sub/secret.txt") {
            Ok(mut opened) => {
                let mut text = String::new();
                opened.file.read_to_string(&mut text).unwrap();
                assert_ne!(text, OUTSIDE, "round {round}: served the file outside");
                assert_eq!(text, INSIDE, "round {round}");
                served += 1;
            }
            Err(LogsError::Refused { .. }) => refused += 1,
            Err(e) => panic!("round {round}: {e}"),
        }
        // What follow compares to notice rotation: it must not see the
        // outside file either (it would then open it).
        if let Ok(Some(id)) = dir.identify("sub/secret.txt") {
            assert_ne!(id, outside, "round {round}: identified the file outside");
        }
        if round % LIST_EVERY == 0 {
            for file in dir.list().unwrap().files {
                assert!(
                    !file.name.ends_with(OUTSIDE_ONLY),
                    "round {round}: the listing went into the link: {}",
                    file.name
                );
            }
        }
    }
    let swaps = swapper.stop();
    assert!(swaps > 0, "the swapper never swapped");
    (served, refused)
}

/// No open, identity or listing ever comes from the outside folder.
#[test]
fn swapped_folder_never_serves_outside() {
    for strategy in [Strategy::Openat2, Strategy::Walk] {
        let fixture = Fixture::new();
        let dir = LogDir::with_strategy(fixture.logs(), strategy).unwrap();
        let (served, refused) = race(&dir, &fixture);
        // Both states of `sub` must have been met while reading for the
        // run to prove anything.
        assert!(served > 0, "{strategy:?}: no open succeeded");
        assert!(refused > 0, "{strategy:?}: no open met the link");
    }
}
