"""The suite's workloads: spilling work of the kind public Dask benchmark
suites run, sized against the cluster's memory (2 workers × 1 GiB).

Each workload builds its data from a seed (the same values for every
mapping), runs on a ``Client``, returns a result that is checked and
compared across runs, and may ask for dask config of its own (set before
the cluster starts, so that the workers get it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

GIB = 1 << 30
CLUSTER_MEMORY = 2 * GIB  # LocalCluster(n_workers=2, memory_limit="1GiB")


@dataclass(frozen=True)
class Workload:
    name: str
    what: str
    run: Callable[[Any, int], Any]  # (client, seed) -> result
    check: Callable[[Any], str | None]  # result -> what is wrong, or None
    config: dict = field(default_factory=dict)
    # (client) -> None: a tiny computation of the same kind, run before the
    # clock starts, so that the workers' first imports of the libraries
    # (dask.array, pandas, pyarrow: seconds, on the event loop when the
    # first task or piece of data arrives) are not measured as loop gaps.
    warmup: Callable[[Any], None] = field(default=lambda client: _warm_array(client))


def _warm_array(client) -> None:
    import dask.array as da

    da.random.RandomState(0).random(1000, chunks=100).sum().compute()


def _random_vector(seed: int, fraction: float):
    import dask.array as da

    n = int(fraction * CLUSTER_MEMORY) // 8
    return da.random.RandomState(seed).random(n), n


def persist_sum_kept(client, seed: int):
    """A random vector of 1.67× cluster memory persisted, then summed while
    the persisted array stays referenced (every chunk stays in the
    cluster)."""
    from distributed import wait

    x, n = _random_vector(seed, 1.67)
    x = x.persist()
    wait(x)
    total = x.sum().compute()
    return float(total / n)


def persist_sum_released(client, seed: int):
    """The same, but the persisted array is released before the sum runs:
    each chunk is freed as soon as the sum has used it."""
    from distributed import wait

    x, n = _random_vector(seed, 1.67)
    x = x.persist()
    wait(x)
    future = client.compute(x.sum())
    del x
    return float(future.result() / n)


def _mean_near_half(mean: float) -> str | None:
    return None if abs(mean - 0.5) < 1e-3 else f"mean {mean}, expected 0.5"


def zeros_sum(client, seed: int):
    """Compressible data: a vector of 1.67× cluster memory whose every
    chunk is zeros (real memory, not a broadcast view), persisted and
    summed."""
    import dask.array as da
    from distributed import wait

    n = int(1.67 * CLUSTER_MEMORY) // 8
    x = da.zeros(n).map_blocks(np.copy).persist()
    wait(x)
    return float(x.sum().compute())


def _matmul(fraction: float):
    def run(client, seed: int):
        import dask.array as da

        n = math.isqrt(int(fraction * CLUSTER_MEMORY) // 8)
        a = da.random.RandomState(seed).random((n, n))
        return [n, float((a @ a.T).sum().compute())]

    run.__doc__ = f"(a @ a.T).sum() of a random square a of {fraction}× cluster memory."
    return run


def _matmul_check(result) -> str | None:
    n, total = result
    expected = n**3 / 4  # E[a_i · a_j] = n/4 for i != j (n/3 on the diagonal)
    return None if abs(total / expected - 1) < 0.01 else f"sum {total}, expected about {expected}"


# Dataframe: many small values moving between workers.
ROWS_PER_PARTITION = 1 << 17  # 16 bytes a row: 2 MiB partitions
PARTITIONS = 128  # 256 MiB


def _partition(i: int, seed: int):
    import pandas as pd

    rng = np.random.default_rng([seed, i])
    return pd.DataFrame(
        {"key": rng.integers(0, 1 << 40, ROWS_PER_PARTITION), "x": rng.random(ROWS_PER_PARTITION)}
    )


def _digest(part):
    """One row per partition: rows, distinct keys, sum of x. After a shuffle
    on the key no key is in two partitions, so the distinct keys of the
    partitions add up to the distinct keys of the whole."""
    import pandas as pd

    return pd.DataFrame({"rows": [len(part)], "keys": [part["key"].nunique()], "x": [part["x"].sum()]})


def shuffle_small(client, seed: int):
    """A dataframe of 0.75× cluster memory in 4 MiB partitions persisted,
    then shuffled on a random key with the task-based shuffle (each
    partition split into many small pieces, every piece a value in the
    workers' data mappings) and digested."""
    import dask.dataframe as dd
    import pandas as pd
    from distributed import wait

    meta = pd.DataFrame({"key": pd.Series([], dtype="int64"), "x": pd.Series([], dtype="float64")})
    df = dd.from_map(_partition, range(PARTITIONS), args=(seed,), meta=meta).persist()
    wait(df)
    shuffled = df.shuffle("key", npartitions=PARTITIONS, shuffle_method="tasks")
    dmeta = pd.DataFrame({"rows": pd.Series([], dtype="int64"), "keys": pd.Series([], dtype="int64"),
                          "x": pd.Series([], dtype="float64")})
    d = shuffled.map_partitions(_digest, meta=dmeta).sum().compute()
    return [int(d["rows"]), int(d["keys"]), float(d["x"])]


def _warm_shuffle(client) -> None:
    import dask.dataframe as dd
    import pandas as pd

    meta = pd.DataFrame({"key": pd.Series([], dtype="int64"), "x": pd.Series([], dtype="float64")})
    df = dd.from_map(lambda i: pd.DataFrame({"key": [i, i + 4], "x": [0.5, 1.5]}), range(4), meta=meta)
    df.shuffle("key", npartitions=4, shuffle_method="tasks").map_partitions(len).compute()


def _shuffle_check(result) -> str | None:
    rows, keys, x = result
    want = ROWS_PER_PARTITION * PARTITIONS
    if rows != want:
        return f"{rows} rows after the shuffle, expected {want}"
    if keys < 0.99 * want:  # keys drawn from 2**40: almost all distinct, unless a key is in two partitions
        return f"{keys} distinct keys summed over partitions, expected about {want}"
    return None


ONE_CONNECTION = {
    "distributed.worker.connections.outgoing": 1,
    "distributed.worker.connections.incoming": 1,
}

WORKLOADS = {
    w.name: w
    for w in [
        Workload("persist-sum-kept", persist_sum_kept.__doc__, persist_sum_kept, _mean_near_half),
        Workload("persist-sum-released", persist_sum_released.__doc__, persist_sum_released, _mean_near_half),
        Workload("zeros-sum", zeros_sum.__doc__, zeros_sum, lambda r: None if r == 0.0 else f"sum {r}, expected 0"),
        Workload("matmul-0.3", _matmul(0.3).__doc__, _matmul(0.3), _matmul_check),
        Workload(
            "matmul-0.45-1conn",
            _matmul(0.45).__doc__ + " One connection each way between workers.",
            _matmul(0.45),
            _matmul_check,
            ONE_CONNECTION,
        ),
        Workload("shuffle-small", shuffle_small.__doc__, shuffle_small, _shuffle_check, warmup=_warm_shuffle),
    ]
}
