"""Sending spilled values to peers without unspilling them.

A worker answers a peer's ``get_data`` by reading ``data[key]`` for each
key on its event loop and serializing what it gets. For a value on disk
that would mean a read on the loop, a deserialization into the worker's
memory, and a new serialization to send it. ``PeerServer`` replaces the
worker's ``get_data`` handler with one that first stages the keys on a
thread of its own (``SpillBuffer.stage_for_peer``): records on disk are
read on the buffer's IO pool, as stored, and become distributed's
``Serialized`` (the header and frames its serializer made when the value
was spilled), which the comm sends on as they are, compressed as any
frame it sends; values in memory are pinned there and sent as they are.
Then the worker's own handler runs, and its ``data[key]`` finds the staged
form (``spillbuffer._mapping.for_peer``, a context variable, so that only
this handler's reads see it).
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

from distributed.comm import get_address_host
from distributed.core import Status

from ._mapping import SpillBuffer, for_peer

logger = logging.getLogger("spillbuffer.dask")


class PeerServer:
    """The ``get_data`` handler of one worker whose ``data`` is ``buffer``;
    ``remove()`` puts the worker's own back."""

    def __init__(self, worker, buffer: SpillBuffer, threads: int = 2) -> None:
        self.worker = worker
        self.buffer = buffer
        self._own = worker.handlers["get_data"]
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="spillbuffer-peers")
        worker.handlers["get_data"] = self.get_data

    def remove(self) -> None:
        if self.worker.handlers.get("get_data") == self.get_data:
            self.worker.handlers["get_data"] = self._own
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def get_data(self, comm, keys, who=None, serializers=None):
        """The worker's ``get_data``, with the keys not held in memory as
        objects staged first (off the event loop)."""
        buf = self.buffer
        staged: dict = {}
        held = None
        core = buf._core
        # Keys in memory as objects are sent as they are, with no thread
        # hop; a reply the worker would refuse (too many transfers) needs
        # no reads.
        if not self._busy(comm) and any(not _object_in_memory(core, k) and k in buf for k in keys):
            loop = asyncio.get_running_loop()
            held, staged = await loop.run_in_executor(self._pool, buf.stage_for_peer, list(keys))
        token = for_peer.set(staged)
        buf._serving_peers += 1
        try:
            return await self._own(comm, keys=keys, who=who, serializers=serializers)
        finally:
            buf._serving_peers -= 1
            for_peer.reset(token)
            if held is not None:
                held.release()

    def _busy(self, comm) -> bool:
        """Would the worker's handler answer busy (too many transfers out)?
        As distributed 2026.8's ``Worker.get_data`` decides it; when in
        doubt, no."""
        w = self.worker
        try:
            limit = w.transfer_outgoing_count_limit
            if limit is False or limit is None:
                return False
            if get_address_host(comm.peer_address) == get_address_host(w.address):
                limit *= 2
            if w.status == Status.paused:
                limit = 1
            return w.transfer_outgoing_count >= limit
        except Exception:
            return False


def _object_in_memory(core, key) -> bool:
    """Is ``key``'s value in memory as an object (not one read back and
    never deserialized, which is staged too: sent as its frames)?"""
    try:
        return core.object_in_memory(key)
    except TypeError:
        return False
