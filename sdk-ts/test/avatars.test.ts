import { test } from "node:test";
import assert from "node:assert/strict";

import { AvatarLoader, type IntersectionEntryLike, type IntersectionObserverLike } from "../src/index.js";

interface Row { id: number }

class FakeViewport {
  callback: ((entries: readonly IntersectionEntryLike<Row>[]) => void) | null = null;
  observed = new Set<Row>();
  factory = (callback: (entries: readonly IntersectionEntryLike<Row>[]) => void): IntersectionObserverLike<Row> => {
    this.callback = callback;
    return { observe: (t) => this.observed.add(t), unobserve: (t) => this.observed.delete(t), disconnect: () => this.observed.clear() };
  };
  show(rows: Row[]): void {
    this.callback?.(rows.filter((r) => this.observed.has(r)).map((target) => ({ target, isIntersecting: true })));
  }
}

test("500 cached rows start no avatar read; only rows that become visible load, once", () => {
  const viewport = new FakeViewport();
  const loaded: number[] = [];
  const loader = new AvatarLoader<Row>({ observer: viewport.factory, load: (row) => loaded.push(row.id) });
  const rows = Array.from({ length: 500 }, (_, id) => ({ id }));
  for (const row of rows) loader.observe(row, `https://cdn/a/${row.id}`);
  assert.equal(loaded.length, 0);
  viewport.show(rows.slice(0, 12));
  assert.equal(loaded.length, 12);
  viewport.show(rows.slice(0, 12)); // scrolled back: no second read
  assert.equal(loaded.length, 12);
  loader.unobserve(rows[20]!);
  viewport.show(rows.slice(20, 22));
  assert.deepEqual(loaded.slice(12), [21]);
  loader.observe(rows[30]!, null); // no avatar: nothing to load
  assert.equal(loader.waiting, 500 - 12 - 2 - 1);
  loader.close();
  viewport.show(rows);
  assert.equal(loader.loads, 13);
});
