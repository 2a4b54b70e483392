"""On-disk kernel cache: compiled kernels keyed by plan, target and tool versions.

Location: ``$NORMC_CACHE_DIR`` if set, else the user's cache directory from ``platformdirs``
(``~/.cache/normc`` on Linux). Each entry is one JSON file named by the SHA-256 of its key; the key covers
normc's version, a digest of its kernel generator's sources, the NVVM version, the driver version, the
target arch and the full plan, so a change of any of them misses instead of loading a stale kernel. Writes
go to a temporary file in the same directory and are renamed into place (atomic on POSIX); each file carries
a SHA-256 of its payload, checked on load, so a truncated or corrupted file is rebuilt rather than used. A directory that cannot be created or written
falls back to the in-memory cache with one warning.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import tempfile
import warnings

_warned = False

# Names of the files the cache writes: entries (make_key's SHA-256 hex digest) and store's temporary files.
_ENTRY_NAME = re.compile(r"[0-9a-f]{64}\.json")
_TEMP_NAME = re.compile(r"\.tmp-\w+\.json")


def cache_dir() -> str:
    """The cache directory (not created here)."""
    env = os.environ.get("NORMC_CACHE_DIR")
    if env:
        return env
    import platformdirs

    return platformdirs.user_cache_dir("normc", appauthor=False)


def make_key(parts: dict) -> str:
    """SHA-256 hex digest of a JSON-serializable key."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def entry_names(temporary=False) -> list:
    """Sorted names of the entry files in :func:`cache_dir` (regular files named like a :func:`make_key` key
    plus ``.json``), with the temporary files of unfinished writes too when ``temporary``. Other files and
    directories there are not the cache's and are left out; no directory means no entries.

    Raises:
        OSError: the directory exists but cannot be listed.
    """
    def ours(e):
        named = _ENTRY_NAME.fullmatch(e.name) or (temporary and _TEMP_NAME.fullmatch(e.name))
        return named and e.is_file(follow_symlinks=False)

    try:
        with os.scandir(cache_dir()) as it:
            return sorted(e.name for e in it if ours(e))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _warn_once(msg):
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(f"normc: {msg}; kernels are cached in memory only", RuntimeWarning, stacklevel=3)


def load(key: str):
    """The cached payload (a dict) for ``key``, or ``None`` when absent, unreadable or corrupt."""
    path = os.path.join(cache_dir(), key + ".json")
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read())
        payload = doc["payload"]
        digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()
        if digest != doc["sha256"]:
            return None
        for k in payload["kernels"]:
            if k.get("cubin"):
                k["cubin"] = base64.b64decode(k["cubin"])
        return payload
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def store(key: str, payload: dict) -> bool:
    """Atomically write ``payload`` (kernels with PTX and optional cubin bytes). Returns success."""
    d = cache_dir()
    enc = dict(payload)
    enc["kernels"] = [
        {**k, "cubin": base64.b64encode(k["cubin"]).decode() if k.get("cubin") else None}
        for k in payload["kernels"]
    ]
    doc = {"sha256": hashlib.sha256(json.dumps(enc, sort_keys=True).encode()).hexdigest(), "payload": enc}
    try:
        os.makedirs(d, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f)
            os.replace(tmp, os.path.join(d, key + ".json"))
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return True
    except OSError as e:
        # makedirs on a path that is a file says "File exists"; say what is wrong with it instead
        why = ("it is a file, not a directory (set NORMC_CACHE_DIR to a directory)"
               if os.path.exists(d) and not os.path.isdir(d) else e.strerror or e)
        _warn_once(f"cannot write the kernel cache at {d} ({why})")
        return False
