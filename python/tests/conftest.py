import pytest

import spillbuffer


@pytest.fixture
def make(tmp_path):
    """Build SpillBuffers in a temporary directory; closed at the end."""
    made = []

    def make(**options):
        buf = spillbuffer.SpillBuffer(tmp_path / "spill", **options)
        made.append(buf)
        return buf

    yield make
    for buf in made:
        buf.close()
