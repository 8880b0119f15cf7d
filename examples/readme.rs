use spillbuffer::SpillBuffer;

#[tokio::main(flavor = "current_thread")]
async fn main() -> spillbuffer::Result<()> {
    // The buffer makes a private sub-directory here and deletes it on drop.
    let buf: SpillBuffer<u64, Vec<f64>> = SpillBuffer::builder(std::env::temp_dir())
        .memory_target(8 << 20) // spill above 8 MiB of values
        .memory_limit(16 << 20) // insert_async waits above 16 MiB
        .build()?;

    for i in 0..64u64 {
        // 1 MiB each: most of them end up on disk. Never blocks on IO;
        // awaits only while memory is over the limit.
        buf.insert_async(i, vec![i as f64; 1 << 17]).await?;
    }

    // pin: a value on disk is read back on the IO pool; the caller awaits.
    let chunk = buf.pin(&3).await?.expect("key 3 was inserted");
    assert_eq!(chunk[0], 3.0);
    chunk.consume(); // done with it: its disk copy is still valid, so no write

    buf.prefetch([4, 5, 6]); // read these back ahead of use
    let hot = buf.try_pin(&63); // memory hit or nothing, never waits
    assert!(hot.is_some());
    drop(hot);
    buf.remove(&3); // frees memory and disk space
    buf.flush().await?; // wait for queued IO, here only to print final figures
    println!("{}", buf.stats());
    Ok(())
}
