"""The worker's orchestration around the pure core: records in, state tables, flushes out.
No faust here: `agents/` and `tables/` implement the Protocols in `app.worker.ports`."""
