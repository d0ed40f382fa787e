//! The one retry delay every side uses: a pause that doubles after each
//! failure, from a first value up to a cap, and starts over after a
//! success.

use std::time::Duration;

/// A delay that doubles with each use, from `first` up to `max`.
///
/// The first call of [`Backoff::next_delay`] gives `first`; each later one
/// gives twice the one before; none gives more than `max`.
/// [`Backoff::reset`] starts over at `first`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The delay after a reset.
    first: Duration,
    /// The delay that [`Backoff::next_delay`] gives next.
    next: Duration,
    /// The cap on every delay.
    max: Duration,
}

impl Backoff {
    /// A backoff whose first delay is `first`, doubling up to `max`.
    pub const fn new(first: Duration, max: Duration) -> Backoff {
        Backoff {
            first,
            next: first,
            max,
        }
    }

    /// The delay to wait now; the next one is twice as long, up to the cap.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next.min(self.max);
        self.next = delay.saturating_mul(2).min(self.max);
        delay
    }

    /// Starts over: the next delay is the first again.
    pub fn reset(&mut self) {
        self.next = self.first;
    }

    /// The delay that the call of [`Backoff::next_delay`] numbered `n`
    /// (from 0) after a reset gives, without making the calls before it:
    /// `first` doubled `n` times, capped (for a count of failures kept
    /// elsewhere).
    pub fn nth_delay(&self, n: u32) -> Duration {
        let factor = 1u32.checked_shl(n).unwrap_or(u32::MAX);
        self.first
            .checked_mul(factor)
            .unwrap_or(self.max)
            .min(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn doubles_from_the_first_delay_up_to_the_cap_and_starts_over() {
        let mut backoff = Backoff::new(ms(1), ms(32));
        let delays: Vec<_> = (0..8).map(|_| backoff.next_delay()).collect();
        assert_eq!(
            delays,
            [1, 2, 4, 8, 16, 32, 32, 32].map(ms),
            "doubling, then capped"
        );
        backoff.reset();
        assert_eq!(backoff.next_delay(), ms(1));
        assert_eq!(backoff.next_delay(), ms(2));
    }

    #[test]
    fn the_nth_delay_is_what_as_many_calls_give() {
        let backoff = Backoff::new(ms(500), Duration::from_secs(30));
        let mut stepped = backoff;
        for n in 0..12 {
            assert_eq!(backoff.nth_delay(n), stepped.next_delay(), "delay {n}");
        }
        // Far past any shift or multiplication that fits: the cap.
        assert_eq!(backoff.nth_delay(31), Duration::from_secs(30));
        assert_eq!(backoff.nth_delay(u32::MAX), Duration::from_secs(30));
    }

    #[test]
    fn an_uncapped_backoff_keeps_doubling() {
        let mut backoff = Backoff::new(ms(250), Duration::MAX);
        let delays: Vec<_> = (0..4).map(|_| backoff.next_delay()).collect();
        assert_eq!(delays, [250, 500, 1000, 2000].map(ms));
    }
}
