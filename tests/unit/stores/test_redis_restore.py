"""The projection repair's marker keys (app/stores/redis_restore.py), without a server: on a
Redis Cluster a master that loses its data must lose markers of every partition, whatever slots
it owns, as long as it owns a whole stretch of MARKER_STRETCHES."""

from __future__ import annotations

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from app.stores.redis_restore import MARKER_STRETCHES, marker_tags


def test_one_marker_on_a_single_server() -> None:
    assert marker_tags(cluster=False) == ["m"]


def test_on_a_cluster_one_marker_lands_in_every_stretch_of_the_slot_space() -> None:
    tags = marker_tags(cluster=True)
    width = REDIS_CLUSTER_HASH_SLOTS // MARKER_STRETCHES
    stretches = [key_slot(tag.encode()) // width for tag in tags]
    assert stretches == list(range(MARKER_STRETCHES))
    assert marker_tags(cluster=True) == tags  # every worker and restart names the same keys


def test_a_master_owning_any_whole_stretch_holds_a_marker_of_the_partition() -> None:
    """Checked on the keys' own slots (the hash tag decides them): every aligned stretch holds
    one of the partition's markers."""
    slots = {key_slot(f"ns:alive:{{{tag}}}:3".encode()) for tag in marker_tags(cluster=True)}
    width = REDIS_CLUSTER_HASH_SLOTS // MARKER_STRETCHES
    for start in range(0, REDIS_CLUSTER_HASH_SLOTS - width + 1, width):
        assert any(start <= slot < start + width for slot in slots)
