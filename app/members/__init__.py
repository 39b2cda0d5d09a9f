"""Group member directory (DESIGN §8, seed 004): the client store and the server's helpers.

Client side (asyncio, no server imports): :mod:`app.members.model` (member objects and the
wire shapes), :mod:`app.members.source` (the member API as a port, plus its HTTP client),
:mod:`app.members.cache` (the signed SQLite cache), :mod:`app.members.directory` (one
:class:`~app.members.directory.MemberDirectory` store per environment/account/group).
Server side: :mod:`app.members.stats` (the stream aggregates behind ``record_count`` /
``mention_count``); the Cassandra queries live in :mod:`app.stores.cassandra_members` and the
routes in :mod:`app.api.members`.
"""
