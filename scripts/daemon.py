#!/usr/bin/env python3
"""Start a server detached from the caller: `daemon.py PIDFILE LOGFILE -- CMD...`.

Why not `nohup cmd &` in bash: a server left running must not keep the caller's pipes open
(CI reads `make test`'s output to EOF), so every inherited descriptor is closed, stdin is
/dev/null, stdout/stderr go to LOGFILE, and the server gets its own session so that a
Ctrl-C on `make` does not kill it. Prints the pid. Standard library only (runs on python3).
"""

from __future__ import annotations

import os
import subprocess
import sys


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: daemon.py PIDFILE LOGFILE -- CMD [ARG...]", file=sys.stderr)
        return 2
    pidfile, logfile, cmd = argv[0], argv[1], argv[3:]
    with open(logfile, "ab") as log, open(os.devnull, "rb") as devnull:
        proc = subprocess.Popen(
            cmd,
            stdin=devnull,
            stdout=log,
            stderr=subprocess.STDOUT,
            close_fds=True,
            start_new_session=True,
        )
    tmp = pidfile + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"{proc.pid}\n")
    os.replace(tmp, pidfile)
    print(proc.pid)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
