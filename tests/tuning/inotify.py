"""Which files under a folder were opened: Linux inotify through libc (tests only)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
from pathlib import Path

IN_OPEN = 0x00000020
IN_NONBLOCK = 0o4000
_EVENT = struct.Struct("iIII")


class OpenWatch:
    """Watches the folders given (not their subfolders) for files being opened."""

    def __init__(self, folders: list[Path]) -> None:
        self.libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self.fd = self.libc.inotify_init1(IN_NONBLOCK)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        self.names: dict[int, Path] = {}
        for folder in folders:
            wd = self.libc.inotify_add_watch(self.fd, str(folder).encode(), IN_OPEN)
            if wd < 0:
                raise OSError(ctypes.get_errno(), f"cannot watch {folder}")
            self.names[wd] = folder

    def opened(self) -> list[Path]:
        """The files opened since the last call."""
        found: list[Path] = []
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return found
            offset = 0
            while offset < len(data):
                wd, _mask, _cookie, size = _EVENT.unpack_from(data, offset)
                name = data[offset + _EVENT.size: offset + _EVENT.size + size].rstrip(b"\0")
                found.append(self.names[wd] / name.decode())
                offset += _EVENT.size + size

    def close(self) -> None:
        os.close(self.fd)
