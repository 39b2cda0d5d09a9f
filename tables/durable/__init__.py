"""Worker state that is crash-consistent by construction: per mailbox-tail partition one RocksDB
store and one changelog partition; a persist is one produce ending with its checkpoint, applied
only once that checkpoint is read, with its changelog offset in one write batch (docs/durability.md,
docs/decisions/0001-one-atomic-checkpoint.md). No faust here; only `kafka` talks to Kafka.
"""
