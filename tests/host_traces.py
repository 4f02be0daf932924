"""What a sandboxed run may have left on the host: processes found by their command line."""

from __future__ import annotations

import os


def cmdline_pids(marker: str) -> list[int]:
    """Pids (other than this process) whose command line contains ``marker``."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as fh:
                    if marker.encode() in fh.read():
                        found.append(int(name))
            except OSError:
                pass
    return found
