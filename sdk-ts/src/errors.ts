// The SDK's failures. Member reads are classified once, here, so a store never guesses:
// MemberAccessDeniedError (2001/2002: the only "drop the cached roster" answers),
// MemberApiMissingError (the backend has no paging API: a clear request error, caches kept),
// RequestError (a refusal that says nothing about membership), UnavailableError (network, 5xx,
// 408/429: keep what is shown, retry later). An aborted call rejects with the signal's reason.

/** Root of every error the SDK raises on purpose. */
export class SdkError extends Error {
  constructor(message: string) {
    super(message);
    this.name = new.target.name;
  }
}

/** The API answered with an error body `{error: {status, code, message}}` (or not JSON). */
export class ApiError extends SdkError {
  readonly status: number;
  readonly code: string;
  readonly retryAfterS: number | null;
  constructor(status: number, code: string, message: string, retryAfterS: number | null = null) {
    super(`${status} ${code}: ${message}`);
    this.status = status;
    this.code = code;
    this.retryAfterS = retryAfterS;
  }
}

/** A network failure, a timeout, 5xx, 408 or 429: transient; what is shown stays. */
export class UnavailableError extends SdkError {
  readonly status: number | null;
  constructor(message: string, status: number | null = null) {
    super(message);
    this.status = status;
  }
}

/** The server refused the request for a reason that says nothing about membership (400, 404...). */
export class RequestError extends SdkError {
  readonly status: number;
  readonly code: string;
  constructor(status: number, code: string, message: string) {
    super(`request refused: HTTP ${status} ${code}${message ? ": " + message : ""}`);
    this.status = status;
    this.code = code;
  }
}

/** Seed 004's access codes: 2001 = not (or no longer) an active member, 2002 = conversation disabled. */
export const NOT_A_MEMBER = "2001";
export const CONVERSATION_DISABLED = "2002";
export type AccessCode = typeof NOT_A_MEMBER | typeof CONVERSATION_DISABLED;

/** 2001 or 2002: the roster is gone for this account; the store clears memory and cache. */
export class MemberAccessDeniedError extends SdkError {
  readonly code: AccessCode;
  constructor(code: AccessCode, message = "") {
    super(`member access denied (${code})${message ? ": " + message : ""}`);
    this.code = code;
  }
}

/** The backend does not serve the member paging API (deploy the paging API first, seed 004):
 * a request error, never a fallback to a full roster read. */
export class MemberApiMissingError extends RequestError {
  readonly operation: string;
  constructor(operation: string, status: number, detail = "") {
    super(status, "member_api_missing", `the server has no ${operation} API${detail ? " (" + detail + ")" : ""}`);
    this.operation = operation;
  }
}

/** A response or frame that breaks the contract (ids not strings, versions not safe integers...). */
export class ProtocolError extends SdkError {}

/** A walk past its page bound (seed 004: at most 200 pages), or restarted too often. */
export class TraversalLimitError extends SdkError {}

/** Whether `error` is the rejection of an aborted call: an AbortError, a TimeoutError
 * (AbortSignal.timeout), or the reason the given signal was aborted with. */
export function isAbort(error: unknown, signal?: AbortSignal): boolean {
  if (signal?.aborted && error === signal.reason) return true;
  const name = typeof error === "object" && error !== null ? (error as { name?: unknown }).name : undefined;
  return name === "AbortError" || name === "TimeoutError";
}
