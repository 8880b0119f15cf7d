//! Test doubles for hosts and for this crate's own fault tests: a storage
//! layer that fails on demand.

pub use crate::store::faulty::{Faults, FaultyStorage, WriteFault};
