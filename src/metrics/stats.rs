//! The [`Stats`] snapshot a host reads, and how it prints.

/// A snapshot of a buffer's state and counters, from
/// [`crate::SpillBuffer::stats`]. Gauges are read one by one without a global
/// lock, so under concurrent use they may be a few operations apart.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    /// Weight of every value the buffer holds in memory: resident values
    /// (including those being written and pinned ones) and detached ones
    /// (`detached_bytes`). What `memory_limit` is compared with.
    pub memory_bytes: u64,
    /// Number of values held in memory (`memory_bytes` covers them).
    pub memory_count: u64,
    /// Weight of the resident values queued for, or in the middle of, a write.
    pub spilling_bytes: u64,
    /// Of `memory_bytes`, values no key holds any more (removed, replaced,
    /// or dropped from memory) that are still alive: held by a [`Pinned`]
    /// guard, by a write queued or running, or by a job queued to free
    /// them on the IO pool. They go when their last holder lets go. Also
    /// counts the bytes of received records queued to be written
    /// ([`crate::SpillBuffer::insert_record`]), one "value" each.
    ///
    /// [`Pinned`]: crate::Pinned
    pub detached_bytes: u64,
    /// Number of values `detached_bytes` covers.
    pub detached_count: u64,
    /// Weight of the values set aside after their encode failed: kept in
    /// memory and not tried again until replaced or
    /// [`crate::SpillBuffer::retry_spills`].
    pub set_aside_bytes: u64,
    /// Weight of the live keys whose values are not in memory (only on
    /// disk, or being read back): what they weighed when inserted
    /// ([`crate::Spill::weight`]), not what their records take on disk.
    pub spilled_weight_bytes: u64,
    /// Bytes of the live records on disk, as stored (after compression).
    pub disk_bytes: u64,
    /// Number of live records on disk.
    pub disk_count: u64,
    /// Disk space the spill files occupy.
    pub file_bytes: u64,
    /// Encoded bytes written to disk, over the buffer's life.
    pub spilled_bytes_total: u64,
    /// Records written to disk, over the buffer's life.
    pub spill_count_total: u64,
    /// Encoded bytes read back from disk, over the buffer's life.
    pub unspilled_bytes_total: u64,
    /// Records read back from disk, over the buffer's life.
    pub unspill_count_total: u64,
    /// Evictions that needed no write because a valid disk copy existed.
    pub clean_evictions_total: u64,
    /// Spills that failed (encode error, I/O error, disk budget); the value
    /// stayed in memory. Counts attempts: a value that fails twice counts
    /// twice. The sum of the three causes below.
    pub spill_errors_total: u64,
    /// Of `spill_errors_total`, those whose [`crate::Spill::encode`] failed
    /// (the value is set aside).
    pub spill_errors_encode_total: u64,
    /// Of `spill_errors_total`, those whose write failed (disk full or
    /// another I/O error).
    pub spill_errors_io_total: u64,
    /// Of `spill_errors_total`, those refused because of `max_spill`.
    pub spill_budget_refusals_total: u64,
    /// Records rewritten by compaction, over the buffer's life.
    pub compacted_count_total: u64,
    /// Seconds spent on spill jobs, summed over the IO threads: with two
    /// threads writing at once it grows twice as fast as the clock.
    pub spill_seconds_total: f64,
    /// Seconds spent reading records back (IO pool or blocking `get`),
    /// summed over the threads doing it, like `spill_seconds_total`.
    pub unspill_seconds_total: f64,
    /// Records handed out by [`crate::SpillBuffer::record`] or written by
    /// [`crate::SpillBuffer::send_record`] or
    /// [`crate::SpillBuffer::write_record_to`], over the buffer's life.
    /// None of them was decoded: a spilled record is sent
    /// as stored, a value in memory is encoded as a spill would encode it.
    pub records_sent_total: u64,
    /// Of `records_sent_total`, those encoded from a value in memory (the
    /// rest were read from disk as stored).
    pub records_sent_encoded_total: u64,
    /// Bytes of the records sent, frame headers included.
    pub records_sent_bytes_total: u64,
    /// Records written as they came by [`crate::SpillBuffer::insert_record`],
    /// its blocking form, [`crate::SpillBuffer::insert_record_from`] or
    /// [`crate::SpillBuffer::receive_record`], over the buffer's life.
    pub records_received_total: u64,
    /// Bytes of the records received, frame headers included.
    pub records_received_bytes_total: u64,
    /// Wall-clock seconds during which at least one IO thread was running a
    /// job (any job: writes, reads, frees, compaction). At most the
    /// buffer's age; its ratio to elapsed time is how busy the pool was.
    pub io_busy_seconds_total: f64,
    /// Pins of a value in memory that took its shard's lock in write mode,
    /// over the buffer's life: a key's first pin after it went into
    /// memory, and pins of an entry pinned that way already or being
    /// written. Pins under the read lock (the common case) are not counted
    /// (counting them would write memory that every thread shares on
    /// every hit).
    pub locked_pins_total: u64,
}

/// Several lines, one per topic, each figure with its unit: bytes in binary
/// units (KiB = 1024 B), counts with thousands separators, IO time in
/// seconds: spill and read time summed over the threads (so it can exceed
/// wall time), and the pool's wall-clock busy time.
///
/// ```
/// let stats = spillbuffer::Stats {
///     memory_bytes: 3 << 20,
///     memory_count: 3,
///     ..Default::default()
/// };
/// let text = stats.to_string();
/// assert!(text.starts_with("in memory: 3.0 MiB in 3 values"));
/// ```
impl std::fmt::Display for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "in memory: {} in {} values ({} being written, {} detached)",
            Bytes(self.memory_bytes),
            Count(self.memory_count),
            Bytes(self.spilling_bytes),
            Bytes(self.detached_bytes),
        )?;
        if self.set_aside_bytes > 0 {
            writeln!(
                f,
                "set aside (encode failed, kept in memory): {}",
                Bytes(self.set_aside_bytes),
            )?;
        }
        writeln!(
            f,
            "not in memory: values of {} of weight (on disk only)",
            Bytes(self.spilled_weight_bytes),
        )?;
        writeln!(
            f,
            "on disk: {} in {} records (after compression), files {}",
            Bytes(self.disk_bytes),
            Count(self.disk_count),
            Bytes(self.file_bytes),
        )?;
        writeln!(
            f,
            "spilled: {} in {} records, {} of thread time",
            Bytes(self.spilled_bytes_total),
            Count(self.spill_count_total),
            Seconds(self.spill_seconds_total),
        )?;
        writeln!(
            f,
            "read back: {} in {} records, {} of thread time",
            Bytes(self.unspilled_bytes_total),
            Count(self.unspill_count_total),
            Seconds(self.unspill_seconds_total),
        )?;
        writeln!(
            f,
            "IO pool busy: {} of wall time",
            Seconds(self.io_busy_seconds_total),
        )?;
        if self.records_sent_total + self.records_received_total > 0 {
            writeln!(
                f,
                "transfers: sent {} in {} records ({} from memory), received {} in {}",
                Bytes(self.records_sent_bytes_total),
                Count(self.records_sent_total),
                Count(self.records_sent_encoded_total),
                Bytes(self.records_received_bytes_total),
                Count(self.records_received_total),
            )?;
        }
        if self.locked_pins_total > 0 {
            writeln!(
                f,
                "pins through a write lock: {}",
                Count(self.locked_pins_total),
            )?;
        }
        writeln!(
            f,
            "evicted without a write: {}; records moved by compaction: {}",
            Count(self.clean_evictions_total),
            Count(self.compacted_count_total),
        )?;
        write!(
            f,
            "failed spills: {} (encode {}, I/O {}, max_spill {})",
            Count(self.spill_errors_total),
            Count(self.spill_errors_encode_total),
            Count(self.spill_errors_io_total),
            Count(self.spill_budget_refusals_total),
        )
    }
}

/// A byte count in binary units: `512 B`, `1.5 KiB`, `3.0 MiB`, …
struct Bytes(u64);

impl std::fmt::Display for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
        if self.0 < 1024 {
            return write!(f, "{} B", self.0);
        }
        let mut value = self.0 as f64 / 1024.0;
        let mut unit = 0;
        while value >= 1024.0 && unit + 1 < UNITS.len() {
            value /= 1024.0;
            unit += 1;
        }
        write!(f, "{value:.1} {}", UNITS[unit])
    }
}

/// A count with thousands separators: `1,234,567`.
struct Count(u64);

impl std::fmt::Display for Count {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let digits = self.0.to_string();
        for (i, d) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        Ok(())
    }
}

/// A duration in seconds, shown in ms or µs when short.
struct Seconds(f64);

impl std::fmt::Display for Seconds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.0;
        if s == 0.0 {
            f.write_str("0 s")
        } else if s < 1e-3 {
            write!(f, "{:.0} µs", s * 1e6)
        } else if s < 1.0 {
            write!(f, "{:.1} ms", s * 1e3)
        } else {
            write!(f, "{s:.2} s")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_use_binary_units() {
        let cases = [
            (0, "0 B"),
            (1023, "1023 B"),
            (1024, "1.0 KiB"),
            (1536, "1.5 KiB"),
            ((1 << 20) - 1, "1024.0 KiB"),
            (1 << 20, "1.0 MiB"),
            (5 << 30, "5.0 GiB"),
            (3 << 40, "3.0 TiB"),
            (u64::MAX, "16.0 EiB"),
        ];
        for (n, want) in cases {
            assert_eq!(Bytes(n).to_string(), want, "{n}");
        }
    }

    #[test]
    fn counts_have_thousands_separators() {
        let cases = [
            (0, "0"),
            (999, "999"),
            (1000, "1,000"),
            (123_456, "123,456"),
            (1_234_567, "1,234,567"),
            (u64::MAX, "18,446,744,073,709,551,615"),
        ];
        for (n, want) in cases {
            assert_eq!(Count(n).to_string(), want, "{n}");
        }
    }

    #[test]
    fn seconds_pick_a_readable_unit() {
        let cases = [
            (0.0, "0 s"),
            (0.000_042, "42 µs"),
            (0.0125, "12.5 ms"),
            (0.9994, "999.4 ms"),
            (1.0, "1.00 s"),
            (83.456, "83.46 s"),
        ];
        for (s, want) in cases {
            assert_eq!(Seconds(s).to_string(), want, "{s}");
        }
    }

    #[test]
    fn display_shows_every_field_with_its_unit() {
        let stats = Stats {
            memory_bytes: 64 << 20,
            memory_count: 64,
            spilling_bytes: 2 << 20,
            detached_bytes: 1 << 20,
            detached_count: 1,
            set_aside_bytes: 3 << 10,
            spilled_weight_bytes: 400 << 20,
            disk_bytes: 200 << 20,
            disk_count: 256,
            file_bytes: 256 << 20,
            spilled_bytes_total: 300 << 20,
            spill_count_total: 1_300,
            unspilled_bytes_total: 3 << 30,
            unspill_count_total: 12_345,
            clean_evictions_total: 160,
            spill_errors_total: 7,
            spill_errors_encode_total: 1,
            spill_errors_io_total: 4,
            spill_budget_refusals_total: 2,
            compacted_count_total: 9,
            spill_seconds_total: 1.5,
            unspill_seconds_total: 0.25,
            io_busy_seconds_total: 1.25,
            records_sent_total: 40,
            records_sent_encoded_total: 3,
            records_sent_bytes_total: 160 << 20,
            records_received_total: 5,
            records_received_bytes_total: 20 << 20,
            locked_pins_total: 1_234_567,
        };
        let want = "\
in memory: 64.0 MiB in 64 values (2.0 MiB being written, 1.0 MiB detached)
set aside (encode failed, kept in memory): 3.0 KiB
not in memory: values of 400.0 MiB of weight (on disk only)
on disk: 200.0 MiB in 256 records (after compression), files 256.0 MiB
spilled: 300.0 MiB in 1,300 records, 1.50 s of thread time
read back: 3.0 GiB in 12,345 records, 250.0 ms of thread time
IO pool busy: 1.25 s of wall time
transfers: sent 160.0 MiB in 40 records (3 from memory), received 20.0 MiB in 5
pins through a write lock: 1,234,567
evicted without a write: 160; records moved by compaction: 9
failed spills: 7 (encode 1, I/O 4, max_spill 2)";
        assert_eq!(stats.to_string(), want);
        for line in want.lines() {
            assert!(line.chars().count() <= 80, "line too long: {line}");
        }
    }
}
