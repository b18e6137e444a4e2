"""Blob stores: where payloads too large for the journal are kept.

With ``Engine.open(..., blobs=..., offload_over="256KiB")``, a payload whose
encoded bytes (after the codec chain: an encrypted store keeps encrypted
blobs) are larger than ``offload_over`` goes to the blob store; its record
keeps a reference and a SHA-256 digest. The blob is written and synced
before the record that refers to it is committed, and a blob found missing
or altered at read is a `fusee.PayloadError`, never a wrong value.

Built in: `Directory` (the default beside an SQLite data directory) and
`S3` (S3-compatible object storage, the ``s3`` extra). A `BlobStore` is
called from worker threads; its methods block.

Example:
    >>> import tempfile
    >>> blobs = Directory(tempfile.mkdtemp())
    >>> blobs.put("a/1/7", b"big"); blobs.get("a/1/7")
    b'big'
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

__all__ = ["S3", "BlobStore", "Directory"]


@runtime_checkable
class BlobStore(Protocol):
    """Durable storage of blobs by key (``"<run key>/<run>/<position>-<field>"``).

    Keys are made of ASCII letters, digits, ``-``, ``_``, ``.`` and ``/``.
    Methods block (the engine calls them from worker threads).

    Example:
        >>> isinstance(Directory("/tmp/fusee-blobs-doc"), BlobStore)
        True
    """

    def put(self, key: str, data: bytes) -> None:
        """Stores ``data`` under ``key``, durably once it returns (replaces any blob there)."""
        ...

    def get(self, key: str) -> bytes | None:
        """Returns the blob under ``key``, or None when there is none."""
        ...

    def delete(self, key: str) -> None:
        """Deletes the blob under ``key``; deleting a missing blob is harmless."""
        ...

    def delete_prefix(self, prefix: str) -> None:
        """Deletes every blob whose key starts with ``prefix`` (a deleted run's: its key, ``/``)."""
        ...


class Directory:
    """Blobs as files in a directory (fsync'd file, then its directory).

    Args:
        path: The directory (made on the first write).

    Example:
        >>> import tempfile
        >>> d = Directory(tempfile.mkdtemp())
        >>> d.put("r/1/3-0", b"x"); d.get("r/1/3-0"), d.get("nope")
        (b'x', None)
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"Directory({str(self.path)!r})"

    def _file(self, key: str) -> Path:
        if not key or key.startswith("/") or ".." in key.split("/"):
            raise ValueError(f"not a blob key: {key!r}")
        return self.path / key

    def put(self, key: str, data: bytes) -> None:
        """Writes the blob to a temporary file, syncs it, renames it, syncs the directory."""
        file = self._file(key)
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp = file.with_name(f".{file.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, file)
        dir_fd = os.open(file.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def get(self, key: str) -> bytes | None:
        """Returns the file's bytes, or None when it does not exist."""
        try:
            return self._file(key).read_bytes()
        except FileNotFoundError:
            return None

    def delete(self, key: str) -> None:
        """Removes the file (a missing one is fine)."""
        self._file(key).unlink(missing_ok=True)

    def delete_prefix(self, prefix: str) -> None:
        """Removes the files whose keys start with ``prefix`` (a whole directory for ``"a/"``)."""
        head, _, rest = prefix.rpartition("/")
        base = self._file(head) if head else self.path
        if not base.is_dir():
            return
        for file in sorted(base.rglob("*"), reverse=True):
            if file.relative_to(base).as_posix().startswith(rest):
                if file.is_dir():
                    with contextlib.suppress(OSError):  # a directory a writer just filled
                        file.rmdir()
                else:
                    file.unlink(missing_ok=True)
        if not rest and head:
            with contextlib.suppress(OSError):
                base.rmdir()


class S3:
    """Blobs as objects of an S3-compatible bucket (the ``s3`` extra: ``boto3``).

    boto3 is AWS's own client, the best kept one, and speaks to every
    S3-compatible service (MinIO, R2, moto) through ``endpoint_url``. A
    successful PUT is durable on S3's side, so `put` returning means the
    blob is stored.

    Args:
        bucket: The bucket (it must exist).
        prefix: Put in front of every key (e.g. ``"fusee/prod/"``).
        client: A boto3 S3 client to use (default: made from the other
            arguments and boto3's usual configuration: environment, profile).
        **options: Passed to ``boto3.client("s3", ...)`` (``endpoint_url``,
            ``region_name``, ``aws_access_key_id``, ...).

    Example:
        >>> blobs = S3("my-bucket", prefix="fusee/", region_name="eu-west-1")  # doctest: +SKIP
    """

    def __init__(
        self, bucket: str, *, prefix: str = "", client: Any = None, **options: Any
    ) -> None:
        if not isinstance(bucket, str) or not bucket:
            raise ValueError("S3(bucket) needs a bucket name")
        self.bucket = bucket
        self.prefix = prefix
        if client is None:
            try:
                import boto3
            except ImportError:
                raise ImportError(
                    "fusee.blobs.S3 needs the 'boto3' package: pip install 'fusee[s3]'"
                ) from None
            client = boto3.client("s3", **options)
        self._client = client

    def __repr__(self) -> str:
        return f"S3({self.bucket!r}, prefix={self.prefix!r})"

    def put(self, key: str, data: bytes) -> None:
        """PUTs the object."""
        self._client.put_object(Bucket=self.bucket, Key=self.prefix + key, Body=data)

    def get(self, key: str) -> bytes | None:
        """GETs the object, or None for a missing one."""
        try:
            answer = self._client.get_object(Bucket=self.bucket, Key=self.prefix + key)
        except self._client.exceptions.NoSuchKey:
            return None
        body: bytes = answer["Body"].read()
        return body

    def delete(self, key: str) -> None:
        """DELETEs the object (S3 answers the same for a missing one)."""
        self._client.delete_object(Bucket=self.bucket, Key=self.prefix + key)

    def delete_prefix(self, prefix: str) -> None:
        """Lists the objects under ``prefix`` and deletes them, a thousand per request."""
        pages = self._client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.prefix + prefix
        )
        for page in pages:
            keys = [{"Key": o["Key"]} for o in page.get("Contents", ())]
            if keys:
                self._client.delete_objects(Bucket=self.bucket, Delete={"Objects": keys})
