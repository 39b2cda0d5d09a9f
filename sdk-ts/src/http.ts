// The HTTP transport: bearer token, JSON bodies, the API's error body, AbortSignal on every call.
// Structural types only, so the SDK compiles in a browser (lib DOM) and under Node (@types/node)
// and a host can pass its own fetch.

import { ApiError, UnavailableError } from "./errors.js";

/** What the SDK reads of a response (a subset of the Fetch API's Response). */
export interface ResponseLike {
  readonly status: number;
  readonly ok: boolean;
  readonly headers: { get(name: string): string | null };
  text(): Promise<string>;
  readonly body: ByteStreamLike | null;
}

/** A response body read chunk by chunk (the Fetch API's ReadableStream<Uint8Array>). */
export interface ByteStreamLike {
  getReader(): {
    read(): Promise<{ done: boolean; value?: Uint8Array | undefined }>;
    cancel(reason?: unknown): Promise<void>;
    releaseLock(): void;
  };
}

export interface RequestInitLike {
  method: string;
  headers: Record<string, string>;
  body?: string;
  signal?: AbortSignal;
  cache?: "no-store";
}

/** A fetch function (globalThis.fetch by default). */
export type FetchLike = (url: string, init: RequestInitLike) => Promise<ResponseLike>;

export interface ClientOptions {
  /** The API's origin, e.g. "https://chat.example/": paths are appended to it. */
  baseUrl: string;
  /** A bearer token, or a function giving the current one (a token refreshed by the host). */
  token: string | (() => string);
  /** Defaults to globalThis.fetch. */
  fetch?: FetchLike;
}

export interface CallOptions {
  /** Aborts the request; the call rejects with the signal's reason. */
  signal?: AbortSignal | undefined;
}

export class HttpClient {
  readonly baseUrl: string;
  private readonly token: string | (() => string);
  private readonly fetchImpl: FetchLike;

  constructor(options: ClientOptions) {
    this.baseUrl = options.baseUrl.replace(/\/+$/, "");
    this.token = options.token;
    const found = options.fetch ?? (globalThis as { fetch?: FetchLike }).fetch;
    if (found === undefined) throw new TypeError("no fetch: pass options.fetch");
    this.fetchImpl = options.fetch ?? ((url, init) => found.call(globalThis, url, init));
  }

  authorization(): string {
    return `Bearer ${typeof this.token === "function" ? this.token() : this.token}`;
  }

  /** One request; `headers` are added to the bearer token. Network failures become
   * UnavailableError; an abort rejects with the signal's reason. */
  async send(
    method: string,
    path: string,
    options: CallOptions & { body?: unknown; headers?: Record<string, string>; auth?: boolean } = {},
  ): Promise<ResponseLike> {
    options.signal?.throwIfAborted();
    const headers: Record<string, string> = { ...(options.headers ?? {}) };
    if (options.auth !== false) headers["Authorization"] = this.authorization();
    const init: RequestInitLike = { method, headers, cache: "no-store" };
    if (options.body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(options.body);
    }
    if (options.signal !== undefined) init.signal = options.signal;
    try {
      return await this.fetchImpl(this.baseUrl + path, init);
    } catch (error) {
      if (options.signal?.aborted) throw options.signal.reason;
      throw new UnavailableError(`${method} ${path}: ${(error as Error)?.message ?? String(error)}`);
    }
  }

  /** A JSON request answered 200 with a JSON object; anything else is an ApiError. */
  async json(
    method: string,
    path: string,
    options: CallOptions & { body?: unknown; auth?: boolean } = {},
  ): Promise<Record<string, unknown>> {
    const response = await this.send(method, path, options);
    const payload = await readJson(response, options.signal);
    if (response.status === 200 && isObject(payload)) return payload;
    throw apiError(response, payload);
  }
}

export async function readJson(response: ResponseLike, signal?: AbortSignal): Promise<unknown> {
  let text: string;
  try {
    text = await response.text();
  } catch (error) {
    if (signal?.aborted) throw signal.reason;
    throw new UnavailableError(`reading the response failed: ${(error as Error)?.message ?? String(error)}`);
  }
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return undefined;
  }
}

export function apiError(response: ResponseLike, payload: unknown): ApiError {
  const error = isObject(payload) && isObject(payload["error"]) ? payload["error"] : {};
  const code = typeof error["code"] === "string" || typeof error["code"] === "number" ? String(error["code"]) : payload === undefined ? "invalid_response" : "?";
  const message = typeof error["message"] === "string" ? error["message"] : "";
  const after = response.headers.get("Retry-After");
  const retryAfterS = after !== null && /^[0-9]+$/.test(after.trim()) ? Number(after.trim()) : null;
  return new ApiError(response.status, code, message, retryAfterS);
}

export function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}
