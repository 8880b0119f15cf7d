"""spillbuffer in real Dask workers: the data= factory, the prefetch plugin,
a Worker and a LocalCluster with nannies."""

import asyncio
import os
import pickle
import threading

import numpy as np
import pytest

pytest.importorskip("distributed")
da = pytest.importorskip("dask.array")

import dask  # noqa: E402
from distributed import Client, LocalCluster, Scheduler, Worker  # noqa: E402

import spillbuffer  # noqa: E402
from spillbuffer.dask import PrefetchPlugin, data  # noqa: E402


def test_factory_is_picklable_and_checks_options():
    func, kwargs = pickle.loads(pickle.dumps(data(io_threads=3)))
    assert kwargs == {"io_threads": 3}
    assert callable(func)
    with pytest.raises(TypeError, match="tarrget"):
        data(tarrget=1)


def test_worker_takes_the_factory(tmp_path):
    asyncio.run(worker_takes_the_factory(tmp_path))


async def worker_takes_the_factory(tmp_path):
    with dask.config.set({"temporary-directory": str(tmp_path)}):
        async with Scheduler(dashboard_address=":0") as s:
            async with Worker(s.address, data=data(), memory_limit="1 GiB", nthreads=1) as w:
                buf = w.data
                assert isinstance(buf, spillbuffer.SpillBuffer)
                # The worker's own target, less what the process holds
                # already (the memory monitor's target is process memory),
                # and its local directory.
                worker_target = int((1 << 30) * dask.config.get("distributed.worker.memory.target"))
                assert worker_target // 2 <= buf.target < worker_target
                # Back-pressure from the managed share of halfway between
                # the spill and pause fractions, above the target.
                cfg = dask.config.get("distributed.worker.memory")
                assert buf.target <= buf.limit < int((1 << 30) * (cfg["spill"] + cfg["pause"]) / 2)
                assert buf.spill_directory.startswith(os.path.join(w.local_directory, "spillbuffer"))
                # evict() follows the memory monitor: what process memory
                # is over what the monitor evicts down to.
                monitor_target = int((1 << 30) * dask.config.get("distributed.worker.memory.target"))
                w.monitor.get_process_memory = lambda: monitor_target + 12345
                assert buf.memory_over() == 12345
                async with Client(s.address, asynchronous=True) as c:
                    x = c.submit(np.arange, 10, key="x")
                    y = c.submit(lambda a: a.sum(), x, key="y")
                    assert await y == 45
                    assert set(buf) == {"x", "y"}
                    # Spill both, read one back through a task.
                    while buf.fast:
                        while buf.evict() != -1:
                            pass
                        buf.flush()
                    z = c.submit(lambda a: a * 2, x, key="z")
                    assert list(await z) == list(range(0, 20, 2))
                    assert buf.stats()["unspill_count_total"] >= 1


def test_plugin_prefetches_consumes_and_closes(tmp_path):
    asyncio.run(plugin_prefetches_consumes_and_closes(tmp_path))


async def plugin_prefetches_consumes_and_closes(tmp_path):
    loop_thread = threading.get_ident()
    waited_on = []  # (thread, key) of each read of the mapping that waited for the disk
    getitem = spillbuffer.SpillBuffer.__getitem__

    def spying_getitem(self, key):
        before = self._demand_reads
        try:
            return getitem(self, key)
        finally:
            if self._demand_reads != before:
                waited_on.append((threading.get_ident(), key))

    with dask.config.set({"temporary-directory": str(tmp_path)}):
        async with Scheduler(dashboard_address=":0") as s:
            w = await Worker(s.address, data=data(target=4 << 20), memory_limit="1 GiB", nthreads=1)
            buf = w.data
            async with Client(s.address, asynchronous=True) as c:
                await c.register_plugin(PrefetchPlugin())
                chunks = [c.submit(np.full, 1 << 17, i, key=f"chunk-{i}") for i in range(16)]  # 1 MiB each
                await c.gather(chunks)
                buf.flush()
                assert len(buf.slow) >= 8
                spillbuffer.SpillBuffer.__getitem__ = spying_getitem
                try:
                    sums = [c.submit(np.sum, ch, key=f"sum-{i}") for i, ch in enumerate(chunks)]
                    assert await c.gather(sums) == [i * (1 << 17) for i in range(16)]
                finally:
                    spillbuffer.SpillBuffer.__getitem__ = getitem
                # No task input was read on the event loop: those not
                # prefetched in time were read on the plugin's thread
                # before execute ran. (Results the client gathers are
                # read by the worker's get_data, on the loop.)
                on_loop = [k for t, k in waited_on if t == loop_thread and k.startswith("chunk")]
                assert not on_loop, waited_on
                s_ = buf.stats()
                # Inputs were read back ahead of use (prefetched on the IO
                # pool), and no chunk was written twice: 16 chunks of 1 MiB
                # went to disk once each; what else was written is the
                # sums, a few hundred bytes each (the eviction order may
                # write an old small result rather than drop a chunk that
                # was just read back for the next task).
                assert s_["unspill_count_total"] >= 8
                assert s_["spilled_bytes_total"] < 17 << 20
            d = buf.spill_directory
            await w.close()
            # Teardown closed the buffer: its files are gone.
            assert not os.path.exists(d)


def test_local_cluster_with_nannies(tmp_path):
    with dask.config.set({"temporary-directory": str(tmp_path)}):
        with LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            memory_limit="400 MiB",
            processes=True,
            data=data(),
            dashboard_address=":0",
        ) as cluster, Client(cluster) as client:
            client.register_plugin(PrefetchPlugin())
            x = da.random.random((64 << 20) // 8 * 8, chunks=(8 << 20) // 8).persist()  # 512 MiB, 8 MiB chunks
            total = x.sum().compute()
            assert abs(total / x.size - 0.5) < 0.01
            stats = client.run(lambda dask_worker: (type(dask_worker.data).__name__, dask_worker.data.stats()))
            assert {name for name, _ in stats.values()} == {"SpillBuffer"}
            assert sum(s["spill_count_total"] for _, s in stats.values()) > 0


def test_plugin_has_the_pool_write_first_while_process_memory_is_high():
    # The plugin reads process memory (at most every memory_every seconds)
    # and tells the buffer when it crosses the worker's target fraction.
    class Monitor:
        memory = 0

        def get_process_memory(self):
            return self.memory

    class Manager:
        memory_limit = 1000
        memory_target_fraction = 0.6
        memory_spill_fraction = 0.7

    class Buffer:
        def __init__(self):
            self.calls = []

        def set_writes_first(self, on):
            self.calls.append(on)

    class FakeWorker:
        memory_manager = Manager()
        monitor = Monitor()

    plugin = PrefetchPlugin()
    plugin.worker, plugin.buffer = FakeWorker(), Buffer()
    plugin.memory_every = 0.0
    assert not plugin._memory_high() and plugin.buffer.calls == []
    FakeWorker.monitor.memory = 700
    assert plugin._memory_high() and plugin.buffer.calls == [True]
    assert plugin._memory_high() and plugin.buffer.calls == [True]  # told once
    FakeWorker.monitor.memory = 500
    assert not plugin._memory_high() and plugin.buffer.calls == [True, False]
    # Within memory_every, the last reading stands.
    plugin.memory_every = 3600.0
    FakeWorker.monitor.memory = 900
    assert not plugin._memory_high() and plugin.buffer.calls == [True, False]
