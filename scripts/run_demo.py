"""`make run`: the main job on live traffic. Starts one `projector worker`, drives it with
`projector simulate`, waits until the Redis projection has caught up with the generated stream
and checks it against `projector replay` of the same stream, then stops the worker (or keeps it
running with --keep). Settings come from PROJECTOR_* (defaults: the local servers)."""

from __future__ import annotations

import argparse
import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson

from app.settings import Settings
from app.stores.redis_projection import RedisProjectionStore

ROOT = Path(__file__).resolve().parents[1]
PROJECTOR = [sys.executable, "-m", "app"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=200.0, help="messages per second")
    parser.add_argument("--keep", action="store_true", help="leave the worker running at the end")
    args = parser.parse_args()
    settings = Settings.from_env()
    out = ROOT / ".local" / "run"
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "worker.log"
    print(f"==> projector worker (log: {log_path})", flush=True)
    worker = subprocess.Popen(
        [*PROJECTOR, "worker"],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=log_path.open("ab"),
        stderr=subprocess.STDOUT,
    )
    try:
        stream = out / "stream.jsonl"
        print(f"==> projector simulate: {args.messages} messages at {args.rate:g}/s", flush=True)
        subprocess.run(
            [
                *PROJECTOR,
                "simulate",
                "--messages",
                str(args.messages),
                "--rate",
                str(args.rate),
                "--seed",
                str(int(time.time())),
                "--out",
                str(stream),
            ],
            cwd=ROOT,
            check=True,
        )
        print("==> projector replay of the same stream (the expected projection)", flush=True)
        subprocess.run(
            [
                *PROJECTOR,
                "replay",
                "--input",
                str(stream),
                "--out",
                str(out / "replay"),
                "--lanes",
                str(settings.processing.lanes),
                "--progress",
                "never",
            ],
            cwd=ROOT,
            check=True,
        )
        badges = [orjson.loads(line) for line in (out / "replay" / "badges.jsonl").read_bytes().splitlines()]
        caught_up = asyncio.run(wait_and_compare(settings, badges, worker))
        return 0 if caught_up else 1
    finally:
        if args.keep and worker.poll() is None:
            print(f"worker left running (pid {worker.pid}); stop it with: kill {worker.pid}")
        else:
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=60)


async def wait_and_compare(
    settings: Settings, badges: list[dict[str, int]], worker: subprocess.Popen[bytes]
) -> bool:
    store = RedisProjectionStore.from_settings(settings.redis, settings.redis.projection_namespace)
    users = [badge["user_id"] for badge in badges]
    want = {badge["user_id"]: badge["projection_mailbox_seq"] for badge in badges}
    started = time.monotonic()
    tty = sys.stdout.isatty()
    shown = -1
    try:
        while True:
            versions = await store.versions(users)
            behind = sum(1 for user, version in zip(users, versions, strict=True) if version < want[user])
            if tty or behind != shown:  # a terminal gets one live line, a log one line per change
                text = f"==> waiting for the projection: {len(users) - behind}/{len(users)} users current"
                print(f"\r{text}" if tty else text, end="" if tty else "\n", flush=True)
                shown = behind
            if not behind:
                break
            if worker.poll() is not None or time.monotonic() - started > 300:
                print("\nthe worker did not catch up; see .local/run/worker.log")
                return False
            await asyncio.sleep(0.5)
        print(f"\n==> caught up in {time.monotonic() - started:.1f}s after the last message")
        mismatched = 0
        for badge in badges:
            stored = await store.load(badge["user_id"])
            got = (stored.total_unread, stored.total_mention, stored.muted_unread)
            if got != (badge["total_unread"], badge["total_mention"], badge["muted_unread"]):
                mismatched += 1
        print(f"==> badges equal to replay for {len(badges) - mismatched}/{len(badges)} users")
        sample = sorted(badges, key=lambda b: -b["total_unread"])[:5]
        for badge in sample:
            user, unread, mentions = badge["user_id"], badge["total_unread"], badge["total_mention"]
            print(f"    user {user}: unread {unread}, mentions {mentions}")
        return mismatched == 0
    finally:
        await store.aclose()


if __name__ == "__main__":
    sys.exit(main())
