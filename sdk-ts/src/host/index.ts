// @session-projector/sdk/host: what only a Node host runs (the SQLite member cache).
export {
  DAY_MS,
  DEFAULT_LIMITS,
  FIELDS,
  FORMAT_VERSION,
  SqliteMemberCache,
  decode,
  encode,
  type CacheLimits,
  type SqliteDatabaseLike,
  type SqliteMemberCacheOptions,
  type SqliteStatementLike,
} from "./sqlite-cache.js";
