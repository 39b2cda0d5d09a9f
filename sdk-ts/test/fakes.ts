// Test doubles: a fetch answering from a route function, and a controllable byte stream.

import type { FetchLike, RequestInitLike, ResponseLike } from "../src/index.js";

export interface Call {
  method: string;
  url: string;
  path: string;
  headers: Record<string, string>;
  body: unknown;
  signal: AbortSignal | undefined;
}

export type Answer = { status: number; json?: unknown; headers?: Record<string, string>; stream?: FakeStream };

export function jsonResponse(status: number, json: unknown, headers: Record<string, string> = {}): ResponseLike {
  return {
    status,
    ok: status >= 200 && status < 300,
    headers: { get: (name: string) => headers[name] ?? headers[name.toLowerCase()] ?? null },
    text: async () => (json === undefined ? "" : typeof json === "string" ? json : JSON.stringify(json)),
    body: null,
  };
}

/** A fetch whose answers come from `route`; it records every call and honours the signal. */
export function fakeFetch(route: (call: Call) => Answer | Promise<Answer>): FetchLike & { calls: Call[] } {
  const calls: Call[] = [];
  const fn = async (url: string, init: RequestInitLike): Promise<ResponseLike> => {
    const parsed = new URL(url);
    const call: Call = {
      method: init.method,
      url,
      path: parsed.pathname + parsed.search,
      headers: init.headers,
      body: init.body === undefined ? undefined : JSON.parse(init.body),
      signal: init.signal,
    };
    calls.push(call);
    init.signal?.throwIfAborted();
    const answer = await new Promise<Answer>((resolve, reject) => {
      init.signal?.addEventListener("abort", () => reject(init.signal?.reason), { once: true });
      Promise.resolve(route(call)).then(resolve, reject);
    });
    if (answer.stream !== undefined) {
      const stream = answer.stream;
      init.signal?.addEventListener("abort", () => stream.end(), { once: true });
      return { status: answer.status, ok: true, headers: { get: () => null }, text: async () => "", body: stream };
    }
    return jsonResponse(answer.status, answer.json, answer.headers ?? {});
  };
  return Object.assign(fn, { calls });
}

/** A response body the test writes to. */
export class FakeStream {
  private chunks: Uint8Array[] = [];
  private ended = false;
  private wake: (() => void) | null = null;
  private readonly encoder = new TextEncoder();

  write(text: string): void {
    this.chunks.push(this.encoder.encode(text));
    this.wake?.();
  }

  end(): void {
    this.ended = true;
    this.wake?.();
  }

  getReader(): { read(): Promise<{ done: boolean; value?: Uint8Array }>; cancel(): Promise<void>; releaseLock(): void } {
    return {
      read: async () => {
        for (;;) {
          const next = this.chunks.shift();
          if (next !== undefined) return { done: false, value: next };
          if (this.ended) return { done: true };
          await new Promise<void>((resolve) => (this.wake = resolve));
          this.wake = null;
        }
      },
      cancel: async () => this.end(),
      releaseLock: () => undefined,
    };
  }
}

export function sse(event: string, data: unknown, id?: number): string {
  return (id === undefined ? "" : `id: ${id}\n`) + `event: ${event}\ndata: ${JSON.stringify(data)}\n\n`;
}

export const tick = (ms = 0): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));
