"""Values on disk sent to peers as stored: read on the IO pool, never
deserialized by the sending worker (``spillbuffer._peers``)."""

import asyncio
import glob
import os
import threading

import numpy as np
import pytest

pytest.importorskip("distributed")

import dask  # noqa: E402
from distributed import Client, Scheduler, Worker  # noqa: E402
from distributed.protocol.core import dumps, loads  # noqa: E402
from distributed.protocol.serialize import to_serialize  # noqa: E402

import spillbuffer  # noqa: E402
from spillbuffer.dask import PrefetchPlugin, data  # noqa: E402


def values() -> dict:
    """One of each layout: a large frame (raw record), a compressible
    large frame (lz4), a small array and a plain object (envelopes)."""
    rng = np.random.default_rng(7)
    return {
        "big": rng.random(300_000),
        "zeros": np.zeros(200_000),
        "small-array": np.arange(1000),
        "object": {"a": list(range(100)), "b": "text"},
    }


def same(a, b) -> bool:
    return np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b


def spill_all(buf) -> None:
    while buf.fast:
        while buf.evict() != -1:
            pass
        buf.flush()


def over_the_wire(staged: dict) -> dict:
    """What a peer gets: the reply a worker's get_data writes, through
    distributed's protocol."""
    msg = {"status": "OK", "data": {k: to_serialize(v) for k, v in staged.items()}}
    return loads([bytes(f) for f in dumps(msg)])["data"]


def test_staged_values_reach_a_peer_equal_without_being_read_back(tmp_path):
    b = spillbuffer.SpillBuffer(tmp_path, target=1 << 20, compression="lz4")
    vals = values()
    for k, v in vals.items():
        b[k] = v
    spill_all(b)
    held, staged = b.stage_for_peer([*vals, "absent"])
    assert set(staged) == set(vals)
    got = over_the_wire(staged)
    assert all(same(got[k], v) for k, v in vals.items())
    held.release()
    s = b.stats()
    assert s["peer_disk_count_total"] == len(vals)
    # As stored: the zeros compressed, so less than the values' bytes.
    assert 0 < s["peer_disk_bytes_total"] < sum(v.nbytes for v in vals.values() if isinstance(v, np.ndarray))
    # Nothing read back into the buffer, nothing deserialized.
    assert s["unspill_count_total"] == 0
    assert s["deserialize_seconds_total"] == 0
    assert len(b.fast) == 0
    b.close()


def test_values_in_memory_are_pinned_and_sent_as_they_are(tmp_path):
    b = spillbuffer.SpillBuffer(tmp_path, target=1 << 30)
    b["x"] = np.arange(10)
    held, staged = b.stage_for_peer(["x"])
    assert staged == {}
    assert len(held) == 1  # pinned until sent
    held.release()
    assert b.stats()["peer_disk_count_total"] == 0
    b.close()


def test_a_value_read_back_but_not_deserialized_is_sent_from_its_record(tmp_path):
    b = spillbuffer.SpillBuffer(tmp_path, target=4 << 20)
    v = np.random.default_rng(1).random(200_000)
    b["x"] = v
    spill_all(b)
    b.prefetch(["x"])
    b.flush()
    assert b.stats()["unspill_count_total"] == 1
    held, staged = b.stage_for_peer(["x"])
    assert same(over_the_wire(staged)["x"], v)
    s = b.stats()
    assert s["peer_memory_count_total"] == 1 and s["peer_disk_count_total"] == 0
    assert s["deserialize_seconds_total"] == 0
    held.release()
    b.close()


def test_keys_removed_or_read_back_while_staged_are_absent_or_whole(tmp_path):
    """Staging races deletes and read-backs of the same keys: every key
    staged arrives whole and equal, none raises."""
    b = spillbuffer.SpillBuffer(tmp_path, target=1 << 20)
    rng = np.random.default_rng(3)
    vals = {f"k{i}": rng.random(150_000) for i in range(8)}
    stop = threading.Event()
    errors = []

    def churn():
        i = 0
        while not stop.is_set():
            k = f"k{i % 8}"
            try:
                if i % 3 == 0:
                    del b[k]
                elif i % 3 == 1:
                    b[k]  # read back (unspill)
                else:
                    b[k] = vals[k]
            except KeyError:
                b[k] = vals[k]
            except Exception as e:  # pragma: no cover - reported below
                errors.append(e)
            i += 1

    for k, v in vals.items():
        b[k] = v
    spill_all(b)
    t = threading.Thread(target=churn)
    t.start()
    try:
        for _ in range(40):
            held, staged = b.stage_for_peer(list(vals))
            got = over_the_wire(staged)
            for k, v in got.items():
                assert same(v, vals[k]), k
            held.release()
    finally:
        stop.set()
        t.join()
    assert not errors
    assert b.stats()["peer_disk_count_total"] > 0
    b.close()


def corrupt_segments(buf) -> None:
    """Flip bytes in the middle of every spill file of ``buf``."""
    for path in glob.glob(os.path.join(buf.spill_directory, "**"), recursive=True):
        if os.path.isfile(path) and os.path.getsize(path) > 1 << 16:
            with open(path, "r+b") as f:
                f.seek(os.path.getsize(path) // 2)
                chunk = f.read(64)
                f.seek(os.path.getsize(path) // 2)
                f.write(bytes(c ^ 0xFF for c in chunk))


def test_a_record_that_fails_to_read_names_the_key(tmp_path):
    b = spillbuffer.SpillBuffer(tmp_path, target=1 << 20, compression=None)
    b["bad-key"] = np.random.default_rng(5).random(500_000)
    spill_all(b)
    corrupt_segments(b)
    with pytest.raises(RuntimeError, match="bad-key"):
        b.stage_for_peer(["bad-key"])
    b.close()


def test_a_peer_fetches_spilled_keys_without_the_sender_deserializing(tmp_path):
    asyncio.run(peer_fetches_spilled_keys(tmp_path))


async def two_workers(s, tmp_path):
    kwargs = dict(data=data(compression="lz4"), memory_limit="1 GiB", nthreads=1)
    return Worker(s.address, **kwargs), Worker(s.address, **kwargs)


async def peer_fetches_spilled_keys(tmp_path):
    with dask.config.set({"temporary-directory": str(tmp_path)}):
        async with Scheduler(dashboard_address=":0") as s:
            a, b = await two_workers(s, tmp_path)
            async with a, b, Client(s.address, asynchronous=True) as c:
                await c.register_plugin(PrefetchPlugin())
                vals = values()
                futures = await c.scatter(vals, workers=[a.address])
                spill_all(a.data)
                assert len(a.data.slow) == len(vals)
                # Tasks on b whose inputs live on a: b fetches them.
                copies = {k: c.submit(lambda v: v, f, key=f"copy-{k}", workers=[b.address])
                          for k, f in futures.items()}
                for k, fut in copies.items():
                    assert same(await fut, vals[k]), k
                s_a = a.data.stats()
                assert s_a["peer_disk_count_total"] == len(vals)
                assert s_a["peer_deserialized_bytes_total"] == 0
                assert s_a["peer_loop_reads_total"] == 0
                assert s_a["unspill_count_total"] == 0  # nothing read back on a
                assert s_a["deserialize_seconds_total"] == 0


def test_a_key_that_fails_to_read_is_an_error_naming_it_and_loses_no_worker(tmp_path):
    asyncio.run(key_fails_to_read(tmp_path))


async def key_fails_to_read(tmp_path):
    with dask.config.set({"temporary-directory": str(tmp_path), "distributed.scheduler.allowed-failures": 0}):
        async with Scheduler(dashboard_address=":0") as s:
            a, b = await two_workers(s, tmp_path)
            async with a, b, Client(s.address, asynchronous=True) as c:
                await c.register_plugin(PrefetchPlugin())
                [bad] = await c.scatter([np.random.default_rng(5).random(500_000)], workers=[a.address])
                spill_all(a.data)
                corrupt_segments(a.data)
                fut = c.submit(lambda v: v.sum(), bad, workers=[b.address])
                # The peer's fetch fails with the sender's error, as when
                # distributed's own mapping fails to read a value back:
                # the key goes to "error" on the peer, naming the key.
                async def fetch_failed():
                    while True:
                        ts = b.state.tasks.get(bad.key)
                        if ts is not None and ts.state == "error":
                            return ts
                        await asyncio.sleep(0.01)

                ts = await asyncio.wait_for(fetch_failed(), 30)
                assert bad.key in ts.exception_text and "spillbuffer" in ts.exception_text
                assert "checksum" in ts.exception_text
                del fut
                assert set(s.workers) == {a.address, b.address}
                # a still serves its other keys.
                [good] = await c.scatter([np.arange(200_000)], workers=[a.address])
                spill_all(a.data)
                total = await c.submit(lambda v: int(v.sum()), good, workers=[b.address])
                assert total == int(np.arange(200_000).sum())
                assert a.data.stats()["peer_disk_count_total"] >= 1


def test_records_staged_for_a_peer_count_against_the_target(tmp_path):
    # 16 values of 800 kB on disk, then 8 in memory under a 10 MB target.
    mb = 1_000_000
    b = spillbuffer.SpillBuffer(tmp_path, target=10 * mb, compression=None)
    rng = np.random.default_rng(3)
    for i in range(16):
        b[("disk", i)] = rng.random(100_000)
    spill_all(b)
    for i in range(8):
        b[("mem", i)] = rng.random(100_000)
    b.flush()
    assert b.stats()["memory_bytes"] > 6 * mb
    held, staged = b.stage_for_peer([("disk", i) for i in range(6)])
    assert len(staged) == 6
    b.flush()
    # About 4.8 MB of records are held for the peer: the buffer made room.
    assert b.stats()["memory_bytes"] <= 10 * mb - 6 * 800_000
    held.release()
    held.release()  # idempotent
    for i in range(8, 12):
        b[("mem", i)] = rng.random(100_000)
    b.flush()
    # Sent: the whole target is the buffer's again.
    assert b.stats()["memory_bytes"] > 7 * mb
    b.close()
