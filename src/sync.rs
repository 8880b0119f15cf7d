//! The locks, atomics and `Arc` that the buffer (`src/buffer/`) and its IO
//! pool (`src/io/`) take, from one place: `parking_lot`'s locks and the
//! standard atomics in a build, shuttle's in the crate's unit tests built
//! with `--cfg shuttle`, so that a shuttle test's schedules may switch
//! threads at every one of them (the pin, eviction, write and memory-gauge
//! races, not one structure alone). Only the unit tests have shuttle (a
//! dev-dependency): the copy of the crate that its integration tests link
//! keeps `parking_lot`'s, whatever the flags. Shuttle's runs:
//! `RUSTFLAGS="--cfg shuttle" cargo test --release --lib --target-dir target/shuttle shuttle`
//! (`src/buffer/tests/schedules.rs`).
//!
//! Under shuttle the locks keep `parking_lot`'s interface (a guard from
//! `lock()`, no poisoning, `Condvar::wait(&mut guard)`, a re-entrant
//! mutex), built on shuttle's, so the code using them is the same in both
//! builds. The store (`src/store/`) keeps its own locks: it holds none
//! across a call into the buffer, and its scratch buffers are per OS
//! thread, which shuttle's threads share.

#[cfg(not(all(test, shuttle)))]
pub(crate) use parking_lot::{Condvar, Mutex, ReentrantMutex, ReentrantMutexGuard, RwLock};
#[cfg(not(all(test, shuttle)))]
pub(crate) use sharded::ShardedLock;
#[cfg(not(all(test, shuttle)))]
pub(crate) use std::sync::{atomic, Arc, Weak};

#[cfg(all(test, shuttle))]
pub(crate) use shim::RwLock as ShardedLock;
#[cfg(all(test, shuttle))]
pub(crate) use shim::{Condvar, Mutex, ReentrantMutex, ReentrantMutexGuard, RwLock};
#[cfg(all(test, shuttle))]
pub(crate) use shuttle::sync::{atomic, Arc, Weak};

/// A read-write lock whose readers lock only the stripe of their own
/// thread (crossbeam's `ShardedLock`, eight stripes on cache lines of
/// their own): two threads reading one shard write no common cache line.
/// A writer locks every stripe. `parking_lot`'s interface: guards from
/// `read()` and `write()`, no poisoning.
#[cfg(not(all(test, shuttle)))]
mod sharded {
    use crossbeam_utils::sync as cb;

    pub(crate) struct ShardedLock<T>(cb::ShardedLock<T>);

    impl<T> ShardedLock<T> {
        pub(crate) fn new(value: T) -> Self {
            ShardedLock(cb::ShardedLock::new(value))
        }

        #[inline]
        pub(crate) fn read(&self) -> cb::ShardedLockReadGuard<'_, T> {
            self.0
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        }

        #[inline]
        pub(crate) fn write(&self) -> cb::ShardedLockWriteGuard<'_, T> {
            self.0
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        }
    }
}

/// `parking_lot`'s interface over shuttle's locks.
#[cfg(all(test, shuttle))]
mod shim {
    use shuttle::sync as s;
    use shuttle::thread::ThreadId;
    use std::ops::{Deref, DerefMut};

    fn unpoison<G>(r: std::sync::LockResult<G>) -> G {
        r.unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    #[derive(Default)]
    pub(crate) struct Mutex<T>(s::Mutex<T>);

    /// Holds shuttle's guard in an `Option` so that [`Condvar::wait`] can
    /// hand it to shuttle's condition variable and take it back.
    pub(crate) struct MutexGuard<'a, T>(Option<s::MutexGuard<'a, T>>);

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Mutex(s::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            MutexGuard(Some(unpoison(self.0.lock())))
        }
    }

    impl<T> Deref for MutexGuard<'_, T> {
        type Target = T;

        fn deref(&self) -> &T {
            self.0.as_ref().expect("held")
        }
    }

    impl<T> DerefMut for MutexGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            self.0.as_mut().expect("held")
        }
    }

    #[derive(Default)]
    pub(crate) struct Condvar(s::Condvar);

    impl Condvar {
        pub(crate) fn new() -> Self {
            Condvar(s::Condvar::new())
        }

        pub(crate) fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
            let held = guard.0.take().expect("held");
            guard.0 = Some(unpoison(self.0.wait(held)));
        }

        pub(crate) fn notify_one(&self) {
            self.0.notify_one();
        }

        pub(crate) fn notify_all(&self) {
            self.0.notify_all();
        }
    }

    #[derive(Default)]
    pub(crate) struct RwLock<T>(s::RwLock<T>);

    impl<T> RwLock<T> {
        pub(crate) fn new(value: T) -> Self {
            RwLock(s::RwLock::new(value))
        }

        pub(crate) fn read(&self) -> s::RwLockReadGuard<'_, T> {
            unpoison(self.0.read())
        }

        pub(crate) fn write(&self) -> s::RwLockWriteGuard<'_, T> {
            unpoison(self.0.write())
        }
    }

    /// A mutex the thread holding it may take again.
    pub(crate) struct ReentrantMutex<T> {
        /// The holder and how many times it took the lock.
        owner: s::Mutex<(Option<ThreadId>, usize)>,
        released: s::Condvar,
        value: T,
    }

    pub(crate) struct ReentrantMutexGuard<'a, T>(&'a ReentrantMutex<T>);

    impl<T> ReentrantMutex<T> {
        pub(crate) fn new(value: T) -> Self {
            ReentrantMutex {
                owner: s::Mutex::new((None, 0)),
                released: s::Condvar::new(),
                value,
            }
        }

        pub(crate) fn lock(&self) -> ReentrantMutexGuard<'_, T> {
            let me = shuttle::thread::current().id();
            let mut owner = unpoison(self.owner.lock());
            loop {
                match owner.0 {
                    None => *owner = (Some(me), 1),
                    Some(holder) if holder == me => owner.1 += 1,
                    Some(_) => {
                        owner = unpoison(self.released.wait(owner));
                        continue;
                    }
                }
                return ReentrantMutexGuard(self);
            }
        }
    }

    impl<T> Deref for ReentrantMutexGuard<'_, T> {
        type Target = T;

        fn deref(&self) -> &T {
            &self.0.value
        }
    }

    impl<T> Drop for ReentrantMutexGuard<'_, T> {
        fn drop(&mut self) {
            let mut owner = unpoison(self.0.owner.lock());
            owner.1 -= 1;
            if owner.1 == 0 {
                owner.0 = None;
                self.0.released.notify_one();
            }
        }
    }
}
