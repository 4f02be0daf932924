"""What a sandboxed run may have left on the host: files a payload wrote, processes found by their command line."""

from __future__ import annotations

import os
import time


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


def host_is_clean(path, marker: str) -> None:
    """Assert that no payload wrote ``path`` on the host, nor left a process whose command line holds ``marker``."""
    assert not path.exists(), f"{path} was written on the host"
    time.sleep(0.05)  # a `&` started just before the check ended would be visible by now
    assert cmdline_pids(marker) == [], "a process started by the completion outlived the step"
