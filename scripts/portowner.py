#!/usr/bin/env python3
"""Print `PID CMDLINE` of the process listening on 127.0.0.1/0.0.0.0 TCP PORT (`portowner.py PORT`).

Used for clear errors ("port 9092 is taken by pid 123: …") on machines without ss/lsof.
Standard library only; reads /proc. Exit 1 when no listener (or no permission to see it).
"""

from __future__ import annotations

import os
import sys


def listening_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    local, state, inode = fields[1], fields[3], fields[9]
                    if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                        inodes.add(inode)
        except OSError:
            continue
    return inodes


def main(argv: list[str]) -> int:
    inodes = listening_inodes(int(argv[0]))
    if not inodes:
        return 1
    targets = {f"socket:[{inode}]" for inode in inodes}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in targets for fd in fds):
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
                print(pid, cmd if len(cmd) <= 120 else cmd[:117] + "...")
                return 0
        except OSError:
            continue
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
