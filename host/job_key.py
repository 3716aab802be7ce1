"""The key of a keyed job (docs/security.md): OPTIREDUCE_KEY_FILE names a file that every
host of the job holds (at least 16 random bytes, e.g. `head -c 32 /dev/urandom`); its
contents, hashed to ubt.KEY_LEN bytes, key the tag each datagram carries. Unset: an unkeyed
job. The ranks compare fingerprints of their keys at rendezvous (the key never travels), so
a host with another key or none fails at start with a message, not with silent drops."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path

from optireduce.ubt import KEY_LEN

KEY_FILE_VAR = "OPTIREDUCE_KEY_FILE"
MIN_KEY_BYTES = 16
NO_KEY = "none"  # the fingerprint of an unkeyed job


class JobKeyError(ValueError):
    """The key file is unusable, or the ranks' keys differ; the message says what to do."""


def job_key(environ: Mapping[str, str] = os.environ) -> bytes | None:
    """The job's key from OPTIREDUCE_KEY_FILE, or None when it is not set."""
    path = environ.get(KEY_FILE_VAR, "")
    if not path:
        return None
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise JobKeyError(f"{KEY_FILE_VAR}={path}: cannot read it ({e.strerror}); give every "
                          "host of the job the same key file") from e  # fmt: skip
    if len(data) < MIN_KEY_BYTES:
        raise JobKeyError(f"{KEY_FILE_VAR}={path} holds {len(data)} bytes, a key needs at "
                          f"least {MIN_KEY_BYTES} random ones: head -c 32 /dev/urandom > "
                          f"{path}")  # fmt: skip
    return hashlib.blake2b(data, digest_size=KEY_LEN, person=b"optireduce-key").digest()


def fingerprint(key: bytes | None) -> str:
    """What the ranks compare at rendezvous: says nothing of the key but whether it is equal."""
    if key is None:
        return NO_KEY
    # another digest size and personalisation than the tags': never a valid tag itself
    return hashlib.blake2b(b"optireduce key check", key=key, digest_size=16,
                           person=b"optireduce-fp").hexdigest()  # fmt: skip


def check_fingerprints(prints: list[str], rank: int) -> None:
    """Raise unless every rank has this rank's key (or every rank none)."""
    other = [r for r, f in enumerate(prints) if f != prints[rank]]
    if other:
        have = "no key" if prints[rank] == NO_KEY else "a key"
        raise JobKeyError(f"rank {rank} has {have} ({KEY_FILE_VAR}) and ranks {other} differ: "
                          f"give every host of the job the same key file, or none")  # fmt: skip
