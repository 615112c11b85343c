"""A shard's committed version kept in a file, so a restarted shard serves it again at once.

Without it, a shard that dies loses its part of the published version: instances that must sync
to that version get ``not committed`` until the trainer pushes the next one, and the trainer may
be waiting for the very rollouts that cannot start (every shard replaced: the run stops).

Each entry's served bytes are written to a per-attempt data file as soon as the entry is verified
(on the verifier's threads, overlapping the rest of the push, into the page cache: no fsync, since
the fault this covers is a dead process, not a dead machine). Committing a version writes a small
header naming its data file (write then rename, so a reader sees the old header or the new one),
*before* the shard answers ``Committed``: a shard that acknowledged a commit can always restore it.
A restarted shard reads the header, copies each entry into fresh buffers and verifies its checksum;
anything missing, torn or foreign (another shard, another shard count) is ignored with a warning.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec

from psrl.checkpoint_dirs import DATA_SUFFIX, HEADER_SUFFIX, remove_snapshots
from psrl.log import get_logger
from psrl.ps.manifest import ManifestEntry
from psrl.ps.serving import is_intact
from psrl.ps.transports.base import EntryBuffers
from psrl.ps.versions import HeldVersion

FORMAT = 1


class SnapshotHeader(msgspec.Struct, frozen=True):
    format: int
    shard: int
    num_shards: int
    version: int
    incarnation: int
    digest: bytes
    num_entries: int
    algorithm: str
    data_file: str  # name inside the snapshot directory
    entries: tuple[ManifestEntry, ...]
    offsets: dict[int, int]  # entry index -> byte offset in the data file


@dataclass(frozen=True)
class Restored:
    """A committed version read back from a snapshot, in buffers of the shard's transport."""

    header: SnapshotHeader
    buffers: EntryBuffers


class DataFile:
    """The served bytes of one push attempt, written entry by entry from several threads."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o600)
        self._lock = threading.Lock()  # a write never races the close (a reused fd would be another file)
        self.offsets: dict[int, int] = {}
        self.error: str | None = None

    def write(self, index: int, offset: int, data: memoryview) -> None:
        with self._lock:
            if self._fd < 0 or self.error is not None:
                return
            try:
                written = 0
                while written < len(data):
                    written += os.pwrite(self._fd, data[written:], offset + written)
                self.offsets[index] = offset
            except OSError as exc:
                self.error = f"{self.path}: {exc.strerror}"

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


class ShardSnapshots:
    """Snapshot files of one shard in ``directory`` (the run directory's ``ps/``)."""

    def __init__(self, directory: Path, shard: int, num_shards: int) -> None:
        self.directory = directory
        self.shard = shard
        self.num_shards = num_shards
        self.header_path = directory / f"ps-{shard}{HEADER_SUFFIX}"
        self._log = get_logger("psrl.ps.snapshot", shard=shard)
        self._incoming: DataFile | None = None
        self.num_failures = 0
        directory.mkdir(parents=True, exist_ok=True)

    # writing ------------------------------------------------------------------------------------

    def begin(self, version: int, incarnation: int, attempt: int) -> DataFile:
        """A data file for a push attempt; the one of an earlier attempt is dropped."""
        self.drop_incoming()
        name = f"ps-{self.shard}-v{version}-i{incarnation}-a{attempt}{DATA_SUFFIX}"
        self._incoming = DataFile(self.directory / name)
        return self._incoming

    def drop_incoming(self) -> None:
        if self._incoming is not None:
            self._incoming.close()
            with contextlib.suppress(FileNotFoundError):
                self._incoming.path.unlink()
            self._incoming = None

    def commit(self, held: HeldVersion[EntryBuffers]) -> bool:
        """Record the incoming attempt as the committed ``held``; older data files are removed."""
        data, self._incoming = self._incoming, None
        if data is None:
            return False
        data.close()
        missing = [e.index for e in held.entries if e.index not in data.offsets]
        if data.error is not None or missing:
            self._fail(data.error or f"entries {missing[:5]} were not written")
            with contextlib.suppress(FileNotFoundError):
                data.path.unlink()
            return False
        header = SnapshotHeader(
            format=FORMAT,
            shard=self.shard,
            num_shards=self.num_shards,
            version=held.version,
            incarnation=held.incarnation,
            digest=held.digest,
            num_entries=held.num_entries,
            algorithm=held.algorithm,
            data_file=data.path.name,
            entries=held.entries,
            offsets=dict(data.offsets),
        )
        temporary = self.header_path.with_suffix(".tmp")
        try:
            temporary.write_bytes(msgspec.msgpack.encode(header))
            os.replace(temporary, self.header_path)
        except OSError as error:  # a full disk, say: the version is served all the same, only not kept
            self._fail(f"the header could not be written: {error}")
            with contextlib.suppress(OSError):
                temporary.unlink()
            return False
        self._remove_data_files(keep=data.path.name)
        return True

    def _remove_data_files(self, keep: str | None) -> None:
        for path in self.directory.glob(f"ps-{self.shard}-v*{DATA_SUFFIX}"):
            if path.name != keep and (self._incoming is None or path != self._incoming.path):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()

    def _fail(self, reason: str) -> None:
        self.num_failures += 1
        self._log.warning("ps.snapshot.not_kept", reason=reason)

    # reading ------------------------------------------------------------------------------------

    def load(
        self,
        allocate: Callable[[Sequence[ManifestEntry]], EntryBuffers],
        release: Callable[[EntryBuffers], None],
    ) -> Restored | None:
        """The committed version of the last incarnation of this shard, verified, or None."""
        try:
            header = msgspec.msgpack.decode(self.header_path.read_bytes(), type=SnapshotHeader)
        except FileNotFoundError:
            return None
        except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
            self._log.warning("ps.snapshot.unreadable", path=str(self.header_path), error=str(exc))
            return None
        problem = self._foreign(header)
        if problem is not None:
            self._log.warning("ps.snapshot.ignored", path=str(self.header_path), reason=problem)
            return None
        buffers = allocate(header.entries)
        try:
            problem = _read_entries(self.directory / header.data_file, header, buffers)
        except OSError as exc:
            problem = f"{header.data_file}: {exc.strerror}"
        if problem is not None:
            self._log.warning("ps.snapshot.ignored", path=str(self.header_path), reason=problem)
            release(buffers)
            return None
        return Restored(header, buffers)

    def _foreign(self, header: SnapshotHeader) -> str | None:
        if header.format != FORMAT:
            return f"format {header.format}, this shard reads {FORMAT}"
        if (header.shard, header.num_shards) != (self.shard, self.num_shards):
            return f"written by shard {header.shard} of {header.num_shards}, this is {self.shard} of {self.num_shards}"
        if set(header.offsets) != {e.index for e in header.entries}:
            return "entries and offsets disagree"
        return None


def _read_entries(path: Path, header: SnapshotHeader, buffers: EntryBuffers) -> str | None:
    """Copy every entry from the data file into ``buffers`` and check it; the first problem, or None."""
    fd = os.open(path, os.O_RDONLY)
    try:
        for entry in header.entries:
            view = buffers.view(entry.index)
            offset = header.offsets[entry.index]
            done = 0
            while done < len(view):
                n = os.preadv(fd, [view[done:]], offset + done)
                if n == 0:
                    return f"{path.name} ends inside entry {entry.index} ({entry.name})"
                done += n
            if not is_intact(entry, view, header.algorithm):
                return f"entry {entry.index} ({entry.name}) fails its checksum"
    finally:
        os.close(fd)
    return None


__all__ = ["DATA_SUFFIX", "HEADER_SUFFIX", "remove_snapshots"]  # file names kept where the launcher reads them
