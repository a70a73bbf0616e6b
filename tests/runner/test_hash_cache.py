"""``.ctrctl/hashes.json`` is a cache: garbage in it is discarded and the files hashed again
(a run refused over ``{"x": [1,2``)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from ctrctl.runner.state import HashCache


@pytest.mark.parametrize("garbage", ['{"x": [1,2', "[1, 2]", '{"x": [1, 2]}', "\udcff"])
def test_garbage_is_discarded_and_rebuilt(garbage: str, tmp_path: Path) -> None:
    cache_file = tmp_path / ".ctrctl" / "hashes.json"
    cache_file.parent.mkdir()
    cache_file.write_bytes(garbage.encode("utf-8", "surrogateescape"))
    data = tmp_path / "data.bin"
    data.write_bytes(b"some bytes")
    cache = HashCache(cache_file)
    assert cache.file(data) == hashlib.sha256(b"some bytes").hexdigest()
    cache.save()
    saved = json.loads(cache_file.read_text())
    assert list(saved) == [str(data.resolve())]
    assert saved[str(data.resolve())]["sha256"] == hashlib.sha256(b"some bytes").hexdigest()


def test_a_sound_cache_is_kept(tmp_path: Path) -> None:
    data = tmp_path / "data.bin"
    data.write_bytes(b"x")
    first = HashCache(tmp_path / "hashes.json")
    first.file(data)
    first.save()
    again = HashCache(tmp_path / "hashes.json")
    again._entries[str(data.resolve())]["sha256"] = "remembered"  # read from the cache ...
    assert again.file(data) == "remembered"  # ... not hashed again
