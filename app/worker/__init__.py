"""The worker's orchestration around the pure core: records in, state tables, flushes out.

Nothing here imports faust: `agents/` and `tables/` adapt faust to the Protocols in
`app.worker.ports`, so this logic runs the same under unit tests with the in-memory tables
(app/stores/memory_tables.py).
"""
