"""Rebuilding projections: from Cassandra state (from_state), by replaying mailbox-tail through
the worker's processing object (by_replay), the diff with the serving namespace (diff), progress
(progress) and the `projector rebuild` command (cli)."""
