//! Memory for large records read back: anonymous mappings aligned to 2 MiB
//! and advised for transparent huge pages.
//!
//! A record read back is written by the disk read into fresh memory, and
//! faulting that memory in 4 KiB pages is most of the cost of reading a
//! record that is in the page cache: 64 MiB took ~100 ms on this 2-core VM
//! under load, most of it in page faults. With 2 MiB pages there are 512
//! times fewer faults. The mapping is zeroed by the kernel, as a `calloc`
//! of that size would be; where the kernel gives no huge pages (THP off,
//! or none free), it is an ordinary mapping.

use std::ptr::NonNull;

/// Records at least this long get a mapping of their own.
pub const MAPPED_MIN: usize = 8 << 20;
const HUGE: usize = 2 << 20;
const PAGE: usize = 4096;

/// An anonymous, zeroed mapping of at least `len` bytes, starting on a
/// 2 MiB boundary; unmapped on drop.
pub struct Pages {
    ptr: NonNull<u8>,
    /// Bytes mapped (`len` rounded up to 4 KiB).
    mapped: usize,
}

// SAFETY: the mapping is owned by this struct alone and unmapped once.
unsafe impl Send for Pages {}
// SAFETY: as above; access goes through the owner's slices.
unsafe impl Sync for Pages {}

impl Pages {
    /// Map `len` bytes; `None` if the kernel refuses, or off Unix (the
    /// caller then allocates on the heap).
    #[cfg(not(unix))]
    pub fn zeroed(_len: usize) -> Option<Pages> {
        None
    }

    /// Map `len` bytes; `None` if the kernel refuses, or off Unix (the
    /// caller then allocates on the heap).
    #[cfg(unix)]
    pub fn zeroed(len: usize) -> Option<Pages> {
        let mapped = len.checked_next_multiple_of(PAGE)?.max(PAGE);
        // Over-map by one huge page to find a 2 MiB boundary, then unmap
        // the slack before and after it.
        let over = mapped.checked_add(HUGE)?;
        // SAFETY: a fresh anonymous private mapping; no existing memory is
        // touched.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                over,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return None;
        }
        let start = raw as usize;
        let aligned = start.next_multiple_of(HUGE);
        let head = aligned - start;
        let tail = over - head - mapped;
        // SAFETY: both ranges lie inside the mapping just made and outside
        // the part kept; unmapping them cannot fail but for bad arguments.
        unsafe {
            if head > 0 {
                libc::munmap(raw, head);
            }
            if tail > 0 {
                libc::munmap((aligned + mapped) as *mut libc::c_void, tail);
            }
            // Advice only: without THP this changes nothing.
            #[cfg(target_os = "linux")]
            libc::madvise(aligned as *mut libc::c_void, mapped, libc::MADV_HUGEPAGE);
        }
        Some(Pages {
            ptr: NonNull::new(aligned as *mut u8)?,
            mapped,
        })
    }

    /// Start of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        // SAFETY: the range mapped in `zeroed`, unmapped only here.
        #[cfg(unix)]
        unsafe {
            libc::munmap(self.ptr.as_ptr() as *mut libc::c_void, self.mapped);
        }
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[test]
    fn a_mapping_is_aligned_zeroed_and_writable() {
        let len = MAPPED_MIN + 12345;
        let p = Pages::zeroed(len).unwrap();
        assert_eq!(p.as_ptr() as usize % HUGE, 0);
        // SAFETY: `len` bytes are mapped read-write at `as_ptr`.
        let s = unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), len) };
        assert!(s.iter().all(|&b| b == 0));
        s.fill(7);
        assert_eq!(s[len - 1], 7);
    }
}
