//! The [`Spill`] trait: how a value is weighed, written out and read back.
//! The implementations this crate provides live in a module per type
//! family; those that need a dependency sit behind a cargo feature of the
//! same name (docs/value-types.md).

mod pieces;
mod pod;
mod spill;
mod string;

#[cfg(feature = "arrow")]
mod arrow;
#[cfg(feature = "bytes")]
mod bytes;
#[cfg(feature = "serde")]
mod serde;
#[cfg(feature = "slices")]
mod slices;

pub use self::pieces::EncodedPieces;
#[cfg(feature = "serde")]
pub use self::serde::Serde;
pub use self::spill::Spill;

#[cfg(test)]
pub(crate) mod check;
