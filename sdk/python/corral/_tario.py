"""Tar packing and safe unpacking for directory upload and download (shared by both clients)."""

from __future__ import annotations

import io
import os
import tarfile


def pack_dir(local_dir: str) -> bytes:
    """Return a tar of the contents of ``local_dir`` (entries relative to it)."""
    if not os.path.isdir(local_dir):
        raise NotADirectoryError(local_dir)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name in sorted(os.listdir(local_dir)):
            tf.add(os.path.join(local_dir, name), arcname=name, recursive=True)
    return buf.getvalue()


def unpack(data: bytes, local_dir: str) -> None:
    """Extract a tar from a sandbox into ``local_dir``, refusing entries that would land outside
    it (absolute paths, "..", links pointing out) and device files."""
    os.makedirs(local_dir, exist_ok=True)
    root = os.path.realpath(local_dir)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tf:
        members = []
        for mem in tf.getmembers():
            dest = os.path.realpath(os.path.join(root, mem.name))
            if dest != root and not dest.startswith(root + os.sep):
                raise ValueError("tar entry %r leaves %s" % (mem.name, local_dir))
            if mem.isdev():
                continue
            if mem.issym() or mem.islnk():
                base = root if mem.islnk() else os.path.dirname(dest)
                target = os.path.realpath(os.path.join(base, mem.linkname))
                if target != root and not target.startswith(root + os.sep):
                    raise ValueError("tar link %r -> %r leaves %s" % (mem.name, mem.linkname, local_dir))
            mem.uid = mem.gid = os.getuid() if os.getuid() != 0 else mem.uid
            members.append(mem)
        if hasattr(tarfile, "data_filter"):
            tf.extractall(root, members=members, filter="tar")  # type: ignore[call-arg]
        else:
            tf.extractall(root, members=members)
