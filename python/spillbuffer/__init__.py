"""spillbuffer: a lossless memory/disk buffer whose spills and reads run on a
dedicated IO pool, as a ``MutableMapping`` a Dask worker accepts as ``data=``.

See ``spillbuffer.dask`` for the worker factory and the prefetch plugin.
"""

from ._mapping import SpillBuffer, SpilledSize

__all__ = ["SpillBuffer", "SpilledSize"]
__version__ = "0.1.0"
