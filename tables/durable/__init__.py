"""Worker state that is crash-consistent by construction (issue 31; docs/durability.md).

One local RocksDB store per mailbox-tail partition and one changelog partition with the same
number. A persist is one produce whose last record is a checkpoint naming it; a reader applies a
persist only once it has read that checkpoint, and writes its data together with the changelog
offset it reflects in one RocksDB write batch.

Nothing here imports faust: the worker drives these objects through their methods.
`tables.durable.kafka` is the only module that talks to Kafka.
"""
