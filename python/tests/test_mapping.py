"""The mapping's contract: keys of every kind, values of any kind through
disk and back, what never reads a value back, and bad input."""

import logging
import pickle
import threading
from collections.abc import MutableMapping

import numpy as np
import pytest

import spillbuffer
from spillbuffer import _native, _serialize

KEYS = [
    "x",
    b"x",
    0,
    -17,
    2**70,
    -(2**80) + 3,
    2.5,
    float("inf"),
    None,
    ("sum-chunk", 0, 3),
    ("tuple", (b"nested", 1.25), ()),
    (),
]


def spill_everything(buf):
    """Evict what is in memory and wait for the writes (evict() declines
    while evict_in_flight bytes are being written)."""
    while buf.fast:
        while buf.evict() != -1:
            pass
        buf.flush()


def test_is_a_mutable_mapping(make):
    buf = make()
    assert isinstance(buf, MutableMapping)
    buf["a"] = 1
    buf.update(b=2)
    assert dict(buf.items()) == {"a": 1, "b": 2}
    assert buf.pop("a") == 1
    assert buf.setdefault("c", 3) == 3
    assert sorted(buf.keys()) == ["b", "c"]
    buf.clear()
    assert len(buf) == 0 and list(buf) == []


@pytest.mark.parametrize("on_disk", [False, True])
def test_keys_of_every_kind_round_trip(make, on_disk):
    buf = make(target=1 << 30, evict_in_flight=1 << 40)
    for i, k in enumerate(KEYS):
        buf[k] = {"value of": k, "i": i}
    if on_disk:
        spill_everything(buf)
        assert len(buf.slow) == len(KEYS)
    assert len(buf) == len(KEYS)
    got = list(buf)
    # Iteration gives the original keys, with their types.
    assert sorted(map(repr, got)) == sorted(map(repr, KEYS))
    for i, k in enumerate(KEYS):
        assert k in buf
        assert buf[k] == {"value of": k, "i": i}
    for k in KEYS:
        del buf[k]
        assert k not in buf
    assert len(buf) == 0


def test_equal_numbers_are_one_key_as_in_a_dict(make):
    buf = make()
    buf[1] = "int"
    buf[1.0] = "float"
    buf[True] = "bool"
    assert len(buf) == 1 and buf[1] == "bool"
    # The first key inserted is the one kept, as in a dict.
    assert list(buf) == [1] and type(list(buf)[0]) is int
    buf[-0.0] = "zero"
    assert buf[0] == "zero"
    assert "1" not in buf and b"1" not in buf
    assert ("a", 1) in {("a", 1.0): None} and ("a", 1.0) not in buf
    buf[("a", 1)] = 2
    assert buf[("a", 1.0)] == 2


def test_a_memory_hit_gives_the_object_itself_and_is_counted(make):
    buf = make()
    obj = [1, 2]
    buf["none"] = None
    buf["list"] = obj
    assert buf["none"] is None and buf["list"] is obj
    with pytest.raises(KeyError):
        buf["absent"]
    m = buf.cumulative_metrics
    assert m["memory-read", "count"] == 2
    assert m["memory-read", "bytes"] == buf.stats()["weight_total"]


def test_unsupported_keys(make):
    buf = make()
    with pytest.raises(TypeError, match="frozenset"):
        buf[frozenset({1})] = 1
    assert frozenset({1}) not in buf
    with pytest.raises(KeyError):
        buf[frozenset({1})]
    with pytest.raises(KeyError):
        del buf[frozenset({1})]
    with pytest.raises(KeyError):
        buf["absent"]
    with pytest.raises(KeyError):
        del buf["absent"]


class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __eq__(self, other):
        return (self.x, self.y) == (other.x, other.y)


def test_values_of_any_kind_survive_disk(make):
    buf = make(target=0)
    values = {
        "list": [1, "two", 3.0, None],
        "dict": {"a": [b"b"]},
        "str": "héllo" * 1000,
        "bytes": b"\x00\xff" * 5000,
        "object": Point(1, 2),
        "array": np.arange(1000, dtype="i4").reshape(10, 100),
        "fortran": np.asfortranarray(np.arange(12.0).reshape(3, 4)),
        "strided": np.arange(100)[::3],
    }
    for k, v in values.items():
        buf[k] = v
    buf.flush()
    assert len(buf.slow) == len(values) and not buf.fast
    for k, v in values.items():
        got = buf[k]
        if isinstance(v, np.ndarray):
            np.testing.assert_array_equal(got, v)
            assert got.dtype == v.dtype and got.shape == v.shape
        else:
            assert got == v


@pytest.mark.parametrize("empty", [np.zeros((0, 3)), np.array([], dtype="f8")])
def test_empty_frames_serialize(empty):
    # An empty frame (an empty dataframe piece of a shuffle, say) is a view
    # with a zero in its shape, which cannot be cast to bytes: it used to
    # fail to serialize, so its value could never be spilled.
    assert _serialize._as_bytes_frame(empty).nbytes == 0
    frames = _serialize.Dumps()(empty)
    back = _serialize.loads(frames)
    assert back.shape == empty.shape and back.dtype == empty.dtype


def root_base(a):
    """What owns an array's memory, following views (arrays' bases and
    memoryviews' objects)."""
    while isinstance(a, (np.ndarray, memoryview)):
        a = a.base if isinstance(a, np.ndarray) else a.obj
    return a


def test_large_arrays_round_trip_zero_copy(make):
    buf = make(target=100 << 20, compression=None)
    arrays = [np.random.default_rng(i).random(8 << 20) for i in range(3)]  # 64 MiB each
    for i, a in enumerate(arrays):
        buf[i] = a.copy()
    spill_everything(buf)
    before = buf.stats()["unspill_count_total"]
    got = buf[0]
    assert buf.stats()["unspill_count_total"] == before + 1
    np.testing.assert_array_equal(got, arrays[0])
    # The array is a view of the memory the buffer read the record into:
    # no copy was made after the read.
    assert not got.flags.owndata and got.flags.writeable and got.flags.aligned
    assert isinstance(root_base(got), _native.RecordView)
    # Read into a mapping of its own, on a 2 MiB boundary (huge pages);
    # the array starts after the record's header, 64-byte aligned.
    assert root_base(got).__array_interface__["data"][0] % (2 << 20) == 0
    assert got.ctypes.data % 64 == 0
    # A second access hands out the same object.
    assert buf[0] is got
    # The memory stays valid after the buffer lets go of it.
    del buf[0]
    buf.close()
    np.testing.assert_array_equal(got, arrays[0])


@pytest.mark.parametrize("compression", [None, "lz4"])
def test_both_record_layouts_and_replacements(make, compression):
    # One large frame (an array of 2 MiB) is written raw, from the array's
    # own memory; two large frames, or small values, in an envelope.
    # Replacing a key switches between them.
    buf = make(target=64 << 20, compression=compression, evict_in_flight=1 << 40)
    big = np.arange(1 << 18, dtype="f8")
    versions = [big, (big, big + 1), "small", big * 2, {"a": big}]
    for v in versions:
        buf["k"] = v
        buf["other"] = big + 3
        spill_everything(buf)
        got = buf["k"]
        if isinstance(v, np.ndarray):
            np.testing.assert_array_equal(got, v)
            assert isinstance(root_base(got), _native.RecordView)
        elif isinstance(v, tuple):
            np.testing.assert_array_equal(got[0], v[0])
            np.testing.assert_array_equal(got[1], v[1])
        elif isinstance(v, dict):
            np.testing.assert_array_equal(got["a"], v["a"])
        else:
            assert got == v
        np.testing.assert_array_equal(buf["other"], big + 3)


def test_contains_delete_and_iteration_never_read_back(make):
    buf = make(target=0)
    for i in range(20):
        buf[("k", i)] = np.full(1000, i)
    buf.flush()
    assert len(buf.slow) == 20
    reads = buf.stats()["unspill_count_total"]
    assert all(("k", i) in buf for i in range(20))
    assert sorted(buf) == [("k", i) for i in range(20)]
    assert len(buf.keys()) == 20 and len(buf) == 20
    assert ("k", 3) in buf.slow and ("k", 3) not in buf.fast
    for i in range(10):
        del buf[("k", i)]
    assert buf.stats()["unspill_count_total"] == reads
    assert len(buf) == 10


def test_tiers_and_spilled_weight_come_from_the_buffers_index(make):
    buf = make(target=1 << 30)
    values = {("k", i): np.full(1000 + 100 * i, i, dtype="f8") for i in range(6)}
    for k, v in values.items():
        buf[k] = v
    spill_everything(buf)
    weights = {k: buf._weight(v) for k, v in values.items()}
    assert buf.spilled_total.memory == sum(weights.values())
    assert buf.stats()["weight_total"] == sum(weights.values())
    # A prefetch reads values back without anyone accessing them: the
    # index has them in memory as soon as they land.
    back = [("k", 1), ("k", 4)]
    buf.prefetch(back)
    buf.flush()
    assert set(buf.fast) == set(back) and set(buf.slow) == set(values) - set(back)
    assert all(k in buf.fast and k not in buf.slow for k in back)
    assert buf.spilled_total.memory == sum(w for k, w in weights.items() if k not in back)
    # Read back but never deserialized: a peer is sent its frames (not an
    # object in memory) until it is accessed.
    core = buf._core
    assert not core.object_in_memory(("k", 1))
    assert np.array_equal(buf[("k", 1)], values["k", 1])
    assert core.object_in_memory(("k", 1)) and not core.object_in_memory(("k", 0))
    del buf[("k", 0)]
    assert buf.spilled_total.memory == sum(w for k, w in weights.items() if k not in back + [("k", 0)])
    assert buf.stats()["weight_total"] == sum(weights.values()) - weights["k", 0]


class Unpicklable:
    def __init__(self, n):
        self.payload = bytearray(n)

    def __reduce__(self):
        raise TypeError("this value refuses to be pickled")


def test_failing_serialization_keeps_the_value_and_logs_it(make, caplog):
    buf = make(target=3000)
    bad = Unpicklable(2000)
    with caplog.at_level("ERROR", logger="distributed.spill"):
        buf["bad"] = bad
        for i in range(10):
            buf[("good", i)] = b"x" * 1000
        buf.flush()
        for i in range(10, 20):  # more evictions: retried, logged once
            buf[("good", i)] = b"x" * 1000
        buf.flush()
    assert buf["bad"] is bad
    assert len(buf) == 21
    assert buf.stats()["spill_errors_total"] >= 1
    assert "bad" in buf.fast
    failed = [r for r in caplog.records if r.name == "distributed.spill" and "Failed to pickle" in r.getMessage()]
    assert len(failed) == 1
    assert "'bad'" in failed[0].getMessage()
    # The traceback, down to the value's own error.
    assert "refuses to be pickled" in logging.Formatter().formatException(failed[0].exc_info)
    # The others spill anyway; the memory monitor's evict() then reports
    # the failure with -1, and nothing more is logged.
    buf.evict_wait = 30.0  # returns as soon as the write lands or fails
    with caplog.at_level("ERROR", logger="distributed.spill"):
        for _ in range(100):
            if buf.evict() == -1 and list(buf.fast) == ["bad"]:
                break
            buf.flush()
        else:
            raise AssertionError("evict() never reported the failing value")
    assert len(buf.slow) == 20
    errors = buf.stats()["spill_errors_total"]
    assert buf.evict() == -1
    # The crate set the value aside after its first failure: evict() reports
    # it without trying (or counting) it again.
    assert buf.stats()["spill_errors_total"] == errors
    assert len([r for r in caplog.records if "Failed to pickle" in r.getMessage()]) == 1
    assert all(buf[("good", i)] == b"x" * 1000 for i in range(20))


def test_max_spill_keeps_the_rest_in_memory(make):
    buf = make(target=0, max_spill=3 << 20, compression=None)
    for i in range(8):
        buf[i] = np.full(1 << 17, i, dtype="f8")  # 1 MiB each
    buf.flush()
    s = buf.stats()
    assert s["disk_bytes"] <= 3 << 20
    assert s["spill_budget_refusals_total"] >= 1
    assert len(buf.fast) >= 5 and len(buf.slow) <= 3
    for i in range(8):
        assert buf[i][0] == i


def test_stats_carry_every_counter_of_the_rust_buffer(make):
    buf = make(target=1 << 30)
    buf["a"] = b"x" * 1000
    for _ in range(4):
        assert buf["a"] == b"x" * 1000
    s = buf.stats()
    # A few of the Rust `Stats` fields the dict once left out, and the
    # package's own counters.
    for name in (
        "detached_bytes",
        "set_aside_bytes",
        "spill_errors_encode_total",
        "spill_errors_io_total",
        "records_sent_total",
        "io_busy_seconds_total",
        "serialized_count_total",
        "deserialize_seconds_total",
    ):
        assert name in s, name
    # A key in memory is read under its shard's read lock: the four reads
    # did not all take the write lock.
    assert s["locked_pins_total"] < 4
    assert s["memory_count"] == 1


def test_evict_protocol(make):
    buf = make(target=1 << 30, evict_in_flight=1 << 40)
    buf.evict_wait = 30.0  # each evict() returns once its write landed
    assert buf.evict() == -1  # nothing to evict
    buf["a"] = np.zeros(1000)
    buf["b"] = np.zeros(2000)
    assert buf.evict() == buf._weight(np.zeros(1000))  # least recently used first
    assert buf.evict() == buf._weight(np.zeros(2000))
    assert buf.evict() == -1
    buf.flush()
    assert not buf.fast and len(buf.slow) == 2
    assert buf.spilled_total.memory == buf._weight(np.zeros(1000)) + buf._weight(np.zeros(2000))
    assert buf.spilled_total.disk > 0
    buf.close()
    assert buf.evict() == -1  # never raises, even closed


def test_writes_first_is_a_hint_that_loses_nothing(make):
    buf = make(target=8 * 8000)
    values = {i: np.full(1000, i, dtype="f8") for i in range(40)}
    buf.set_writes_first(True)
    for k, v in values.items():
        buf[k] = v
    buf.prefetch(list(range(5)))
    assert all(np.array_equal(buf[k], v) for k, v in values.items())
    buf.set_writes_first(False)
    buf.flush()
    assert all(np.array_equal(buf[k], v) for k, v in values.items())


class Gate:
    """A value whose serialization waits until the test opens the gate."""

    opened = threading.Event()

    def __reduce__(self):
        assert Gate.opened.wait(30), "gate never opened"
        return (Gate, ())


@pytest.mark.parametrize("cap", [1 << 40, 1])
def test_evict_declines_while_a_write_is_in_flight(make, cap):
    # The memory monitor evicts until process memory falls; memory falls
    # only when a write lands, so evict() must not go on evicting while the
    # previous write is still in flight.
    Gate.opened.clear()
    buf = make(target=1 << 30, evict_in_flight=cap)
    buf.evict_wait = 0.0
    buf["gated"] = Gate()
    buf["next"] = np.zeros(1000)
    try:
        # "gated" is queued; its write waits at the gate, so memory has not
        # fallen: -1 ends the monitor's round.
        assert buf.evict() == -1
        assert buf.stats()["spilling_bytes"] > 0
        assert buf.evict() == -1  # nothing more while it is in flight
        assert buf.evict() == -1
        assert "next" in buf.fast and "gated" in buf
    finally:
        Gate.opened.set()
    buf.flush()
    buf.evict_wait = 30.0
    assert buf.evict() > 0  # the write landed: "next" goes, and lands
    assert not buf.fast and len(buf.slow) == 2


def test_evict_keeps_what_has_to_leave_memory_in_flight(make):
    # Told how far process memory is over the monitor's target (as the
    # Dask factory tells it), evict() goes on past heavy values whose
    # writes have not landed, until the writes under way cover that, and
    # counts the last one only up to it: the monitor's total never passes
    # what it needed while memory has not fallen yet.
    Gate.opened.clear()
    buf = make(target=1 << 30, weight=lambda v: 100)
    buf.evict_wait = 0.0
    buf.evict_heavy = 100
    buf.memory_over = lambda: 250
    for i in range(5):
        buf[i] = Gate()
    try:
        got = []
        while (w := buf.evict()) != -1:
            got.append(w)
            assert len(got) <= 5, got
        assert got == [100, 100, 50]
        assert buf.stats()["spilling_bytes"] == 300
        assert len(buf.fast) == 5  # nothing has landed
    finally:
        Gate.opened.set()
    buf.flush()
    assert len(buf.slow) == 3 and len(buf.fast) == 2


def test_evict_without_memory_over_falls_back_to_evict_in_flight(make):
    # A memory reading under the monitor's target (evict() called by
    # someone else than the monitor's round) or none: evict_in_flight caps
    # what is put in flight.
    Gate.opened.clear()
    buf = make(target=1 << 30, weight=lambda v: 100, evict_in_flight=150)
    buf.evict_wait = 0.0
    buf.evict_heavy = 100
    buf.memory_over = lambda: -1 << 20
    for i in range(5):
        buf[i] = Gate()
    try:
        assert [buf.evict() for _ in range(3)] == [100, 50, -1]
        buf.memory_over = lambda: None
        assert buf.evict() == -1
    finally:
        Gate.opened.set()
    buf.flush()
    assert len(buf.slow) == 2


def test_evict_declines_past_its_time_budget(make):
    # The monitor calls evict() on the event loop until memory falls; with
    # many small values that is a long stretch of waits for writes. Past
    # evict_budget seconds of an evict_window, evict() declines.
    buf = make(target=1 << 30, evict_in_flight=1 << 40)
    buf.evict_wait = 30.0
    buf.evict_budget, buf.evict_window = 0.0, 3600.0
    for i in range(3):
        buf[i] = np.zeros(1000)
    assert buf.evict() > 0  # a window's first call goes
    assert buf.evict() == -1  # then the budget is spent
    assert len(buf.fast) == 2
    buf.evict_window = 0.0  # every call a new window
    assert buf.evict() > 0 and buf.evict() > 0
    assert len(buf.fast) == 0


def test_metrics_use_units_prometheus_accepts(make):
    buf = make()
    buf["a"] = np.zeros(100)
    spill_everything(buf)
    buf["a"]
    buf["a"]
    m = buf.cumulative_metrics
    assert {unit for _, unit in m} <= {"count", "bytes", "seconds"}
    assert m["disk-write", "count"] == 1 and m["disk-read", "count"] == 1
    assert m["memory-read", "count"] == 1
    assert m["disk-write", "bytes"] > 0 and m["disk-write", "seconds"] > 0


def test_serializer_compression_step_is_reported_apart(make):
    pytest.importorskip("distributed")
    buf = make()
    buf["a"] = np.zeros(100)
    spill_everything(buf)
    m = buf.cumulative_metrics
    # As a worker's spill reports them: the serializer's compression step
    # (metered by distributed itself, on the IO thread) apart from the
    # rest of serialization, and both before the write.
    names = [name for name in m if name[0] in ("serialize", "compress", "disk-write")]
    assert names[:3] == [("serialize", "seconds"), ("compress", "seconds"), ("disk-write", "seconds")]
    assert m["compress", "seconds"] > 0
    assert m["serialize", "seconds"] >= 0


@pytest.mark.parametrize(
    "setting, expect",
    [(False, None), (None, None), ("lz4", "lz4"), ("zlib", "lz4"), ("auto", "auto")],
)
def test_compression_follows_the_worker_setting(make, setting, expect):
    dask = pytest.importorskip("dask")
    pytest.importorskip("distributed")
    if expect == "auto":
        try:
            import lz4  # noqa: F401

            expect = "lz4"
        except ImportError:
            expect = None
    if setting == "zlib":
        pytest.importorskip("zlib")
    with dask.config.set({"distributed.worker.memory.spill-compression": setting}):
        assert make().compression == expect
        # An explicit choice wins.
        assert make(compression="lz4").compression == "lz4"
        assert make(compression=None).compression is None


@pytest.mark.parametrize(
    "options, error, text",
    [
        ({"target": "1GiB"}, TypeError, "target"),
        ({"target": -1}, ValueError, "target"),
        ({"target": 10, "limit": 5}, ValueError, "limit"),
        ({"io_threads": 0}, ValueError, "io_threads"),
        ({"compression": "zstd"}, ValueError, "compression"),
        ({"max_spill": 1.5}, TypeError, "max_spill"),
        ({"weight": 3}, TypeError, "weight"),
    ],
)
def test_bad_options(make, options, error, text):
    with pytest.raises(error, match=text):
        make(**options)


def test_unusable_directory_names_the_path(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(OSError, match="a-file"):
        spillbuffer.SpillBuffer(blocker / "spill")
    with pytest.raises(TypeError, match="directory"):
        spillbuffer.SpillBuffer(42)


def test_custom_weight(make):
    buf = make(target=10, weight=lambda v: 4)
    for i in range(5):
        buf[i] = i
    buf.flush()
    assert len(buf.fast) == 2 and len(buf.slow) == 3


def test_pickle_fallback_without_distributed(make, monkeypatch):
    monkeypatch.setattr(_serialize, "serialize_bytelist", None)
    a = np.arange(1 << 20, dtype="f8")
    frames = _serialize.dumps(a)
    assert frames[0] == b"p" and len(frames) == 3  # head + one out-of-band buffer
    buf = make(target=0)
    buf["a"] = a
    buf["o"] = Point(3, 4)
    buf.flush()
    got = buf["a"]
    np.testing.assert_array_equal(got, a)
    assert not got.flags.owndata and isinstance(root_base(got), _native.RecordView)
    assert buf["o"] == Point(3, 4)


def test_threads_share_one_buffer(make):
    buf = make(target=1 << 20)
    errors = []

    def work(t):
        try:
            for i in range(200):
                buf[(t, i)] = np.full(1000, t * 1000 + i)
                if i >= 10:
                    assert buf[(t, i - 10)][0] == t * 1000 + i - 10
                    del buf[(t, i - 10)]
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(buf) == 40


def test_closed_buffer_says_so(make):
    buf = make()
    buf["a"] = 1
    d = buf.spill_directory
    buf.close()
    buf.close()
    with pytest.raises(RuntimeError, match="closed"):
        buf["b"] = 2
    import os

    assert not os.path.exists(d)


def test_not_picklable_itself(make):
    # A buffer lives in one process; what nannies pickle is the factory.
    with pytest.raises(TypeError):
        pickle.dumps(make())
