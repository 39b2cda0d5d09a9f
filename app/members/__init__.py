"""Group member directory (docs/contract.md §8, seed 004): the client store and the server's helpers.

Client side (asyncio, no server imports): :mod:`app.members.model` (member objects and the
wire shapes), :mod:`app.members.source` (the member API as a port, plus its HTTP client),
:mod:`app.members.cache` (the signed SQLite cache), :mod:`app.members.directory` (one
:class:`~app.members.directory.MemberDirectory` store per environment/account/group).
Server side: :mod:`app.members.server` (access, pages with capabilities and join events,
presentation with query-time statistics, paged read receipts); the Cassandra queries live in
:mod:`app.stores.cassandra_members` and :mod:`app.stores.cassandra_profiles` (public profiles),
the routes and the opaque page references in :mod:`app.api.members` / :mod:`app.api.member_refs`.

Client usage (one registry per environment and account; the runtime, not a subscriber,
switches accounts by closing the registry and making a new one)::

    cache = SqliteMemberCache(env_dir / "members.sqlite", runtime_key, clock_ms=now_ms)
    async with aiohttp.ClientSession() as http:
        source = HttpMemberSource("http://127.0.0.1:8080", token, http)
        profiles = HttpProfileSource("http://127.0.0.1:8080", token, http)
        registry = MemberDirectoryRegistry("prod", str(user_id), source, cache, profiles=profiles)
        sub = registry.subscribe(group_uid, on_change)  # cache restore + first page, together
        directory = registry.directory(group_uid)       # .sorted_members(), .self_role, .fresh, .error
        ...
        sub.close()                                     # last subscriber: outstanding work stops
        await registry.aclose()
"""
