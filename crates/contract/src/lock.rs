//! The one policy for a poisoned lock: take the data as the panicking
//! holder left it. Every lock here guards state that stays consistent
//! between statements (a counter, a map, a flag), so a panic elsewhere is
//! no reason to panic every later user too; the panic itself is reported
//! where it happened.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Locks a [`Mutex`] whatever an earlier holder's panic left.
pub trait LockExt<T: ?Sized> {
    /// The guard, poisoned or not.
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> LockExt<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Locks an [`RwLock`] for reading or writing whatever an earlier
/// writer's panic left.
pub trait RwLockExt<T: ?Sized> {
    /// The read guard, poisoned or not.
    fn read_locked(&self) -> RwLockReadGuard<'_, T>;
    /// The write guard, poisoned or not.
    fn write_locked(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T: ?Sized> RwLockExt<T> for RwLock<T> {
    fn read_locked(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_locked(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_still_gives_its_data() {
        let counter = Mutex::new(1);
        let rw = RwLock::new(1);
        let _ = std::panic::catch_unwind(|| {
            let _held = counter.lock();
            let _written = rw.write();
            panic!("poison both");
        });
        assert!(counter.is_poisoned() && rw.is_poisoned());
        *counter.locked() += 1;
        assert_eq!(*counter.locked(), 2);
        *rw.write_locked() += 1;
        assert_eq!(*rw.read_locked(), 2);
    }
}
