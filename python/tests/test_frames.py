"""How frames cross between Python and the buffer under the stable ABI: in
place through numpy arrays from 4 KiB on, copied below that and without
numpy; whatever is read back is equal to what went in, and writable."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from spillbuffer import _native, _serialize

COPY_BELOW = 4096  # bytes; src/frames.rs


def root_base(a):
    """What owns an array's memory, following arrays' bases and
    memoryviews' objects."""
    while isinstance(a, (np.ndarray, memoryview)):
        a = a.base if isinstance(a, np.ndarray) else a.obj
    return a


@pytest.mark.parametrize("codec", ["distributed", "pickle"])
# 8 B and just under 4 KiB: copied; 4 KiB and 32 KiB: in an envelope, in
# place; 1 MiB: written raw, in place.
@pytest.mark.parametrize("n", [1, COPY_BELOW // 8 - 1, COPY_BELOW // 8, 4096, 1 << 17])
def test_arrays_of_every_size_come_back_equal_and_writable(make, monkeypatch, codec, n):
    if codec == "pickle":
        monkeypatch.setattr(_serialize, "serialize_bytelist", None)
    elif _serialize.serialize_bytelist is None:
        pytest.skip("distributed is not importable")
    a = np.random.default_rng(n).random(n)
    buf = make(target=0, compression=None)
    buf["a"] = a
    buf.flush()
    assert "a" in buf.slow
    got = buf["a"]
    np.testing.assert_array_equal(got, a)
    assert got.flags.writeable
    got[0] = -1.0
    assert got[0] == -1.0 and a[0] != -1.0
    assert isinstance(root_base(got), _native.RecordView) == (a.nbytes >= COPY_BELOW)


def test_without_numpy_every_frame_is_copied(tmp_path):
    # In a process of its own: numpy, once found, is remembered.
    code = textwrap.dedent(
        """
        import sys
        sys.modules["numpy"] = None  # `import numpy` raises ImportError
        import spillbuffer

        buf = spillbuffer.SpillBuffer(sys.argv[1], target=0, compression=None)
        values = {
            "small": bytearray(b"x" * 100),
            "large": bytearray(range(256)) * 40000,
            "object": {"a": [1, 2.5, "three"]},
        }
        for k, v in values.items():
            buf[k] = v
        buf.flush()
        assert len(buf.slow) == len(values), len(buf.slow)
        for k, v in values.items():
            assert buf[k] == v, k
        buf["large"][0] = 7  # writable
        buf.close()
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "spill")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
