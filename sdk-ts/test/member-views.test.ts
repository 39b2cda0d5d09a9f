import { test } from "node:test";
import assert from "node:assert/strict";

import {
  MemberStoreRegistry,
  MentionPicker,
  ReadReceiptDetails,
  RequestError,
  UnavailableError,
  isUnknownMessage,
  mentionCandidates,
  type BaseMember,
  type MemberPage,
  type MemberSource,
  type PresentationResult,
  type Profile,
  type ReadReceipts,
  type ReadReceiptsRequest,
  type StoreMember,
} from "../src/index.js";

const VIEWER = "5";

function base(id: string): BaseMember {
  return { memberRef: id, userId: id, role: "member", state: "active", joinedAt: 1, leftAt: null };
}

/** A server roster (ids in order), with public names and the viewer's remarks; counts calls. */
class Server implements MemberSource {
  roster: string[];
  names = new Map<string, string>();
  remarks = new Map<string, string>();
  pageCalls = 0;
  presentationCalls = 0;
  profileCalls = 0;
  pageGate: Promise<void> | null = null;

  constructor(ids: string[]) {
    this.roster = ids;
  }

  async page(request: { after?: string | null; limit?: number }): Promise<MemberPage> {
    this.pageCalls += 1;
    if (this.pageGate !== null) await this.pageGate;
    const limit = request.limit ?? 50;
    const start = request.after ? this.roster.findIndex((id) => BigInt(id) > BigInt(request.after!)) : 0;
    const items = start < 0 ? [] : this.roster.slice(start, start + limit).map(base);
    const hasMore = start >= 0 && start + limit < this.roster.length;
    return { items, hasMore, next: hasMore ? items[items.length - 1]!.userId : null, selfRole: "member" };
  }

  async presentation(request: { memberRefs: readonly string[] }): Promise<PresentationResult> {
    this.presentationCalls += 1;
    const held = new Set(this.roster);
    const items = request.memberRefs.filter((r) => held.has(r)).map((r) => ({
      ...base(r), recordCount: null, mentionCount: null, statsKnown: false, remark: this.remarks.get(r) ?? null,
    }));
    return { items, missingRefs: request.memberRefs.filter((r) => !held.has(r)), statsIncluded: true, remarksIncluded: true, selfRole: "member" };
  }

  async profiles(refs: readonly string[]): Promise<ReadonlyMap<string, Profile>> {
    this.profileCalls += 1;
    return new Map(refs.map((r) => [r, { displayName: this.names.get(r) ?? null, avatarUrl: null }]));
  }

  get calls(): number {
    return this.pageCalls + this.presentationCalls + this.profileCalls;
  }
}

function registryOf(server: Server, pageSize = 50): MemberStoreRegistry {
  return new MemberStoreRegistry("test", VIEWER, server, { profiles: server, pageSize });
}

const ids = (from: number, n: number): string[] => Array.from({ length: n }, (_, i) => String(from + i));

function member(id: string, fields: Partial<StoreMember> = {}): StoreMember {
  return {
    ...base(id), displayName: null, remark: null, avatarUrl: null, recordCount: null, mentionCount: null,
    statsKnown: false, profileFailed: false, presented: false, ...fields,
  };
}

test("@-candidates: a prefix of the remark or the display name, case folded; never the viewer", () => {
  const members = [
    member("1", { displayName: "Alice Smith" }),
    member("2", { displayName: "Bob", remark: "alfred (work)" }),
    member("3", { displayName: "Carol", remark: "Boss" }),
    member("4"), // not presented yet: answers to its id
    member(VIEWER, { displayName: "Al the viewer" }),
    member("6", { displayName: "ALBERT", state: "left" }),
  ];
  const refs = (prefix: string): string[] => mentionCandidates(members, prefix, VIEWER).map((m) => m.memberRef);
  assert.deepEqual(refs("al"), ["1", "2"]);
  assert.deepEqual(refs("AL"), ["1", "2"]);
  assert.deepEqual(refs("b"), ["2", "3"]); // Bob by name, Carol by her remark
  assert.deepEqual(refs("smith"), []); // a prefix, not a substring
  assert.deepEqual(refs("4"), ["4"]);
  assert.deepEqual(refs(""), ["1", "2", "3", "4"]);
});

test("the picker reads the drawer's store: nothing is requested again, the objects are the store's", async () => {
  const server = new Server(ids(10, 120));
  server.names.set("11", "Anna");
  server.names.set("70", "Andreas");
  server.remarks.set("100", "Anchor man");
  const registry = registryOf(server);
  const drawer = registry.subscribe("g");
  const store = registry.store("g");
  await store.settled();
  const before = server.calls;
  let changes = 0;
  const picker = new MentionPicker(registry, "g", { viewer: VIEWER, onChange: () => (changes += 1) });
  picker.setPrefix("an");
  assert.deepEqual(picker.matches.map((m) => m.memberRef), ["11", "70", "100"]);
  assert.ok(picker.matches.every((m) => m === store.member(m.memberRef)));
  assert.equal(server.calls, before, "the picker asked the server for members the drawer had loaded");
  assert.ok(picker.complete && changes === 1);

  // On the server: Andreas leaves, Anna gets a remark; the store's next read brings both.
  server.roster = server.roster.filter((id) => id !== "70");
  server.remarks.set("11", "Zed");
  await store.refresh();
  assert.deepEqual(picker.matches.map((m) => m.memberRef), ["11", "100"]); // Anna still by her name
  picker.setPrefix("ze");
  assert.deepEqual(picker.visible.map((m) => m.remark), ["Zed"]);
  assert.ok(changes > 2);
  picker.close();
  drawer.close();
});

test("the picker shows rows a screenful at a time and, at the end of an unfinished roster, lets the store read on", async () => {
  const server = new Server(ids(10, 30));
  let open!: () => void;
  server.pageGate = new Promise<void>((resolve) => (open = resolve));
  const registry = registryOf(server, 10);
  const picker = new MentionPicker(registry, "g", { viewer: VIEWER, rows: 4 });
  assert.equal(server.pageCalls, 1, "the picker alone starts the store's traversal");
  assert.equal(picker.complete, false);
  assert.equal(picker.showMore(), true); // nothing held yet: the running traversal is joined
  assert.equal(server.pageCalls, 1);
  open();
  await picker.store.settled();
  assert.equal(picker.matches.length, 30);
  assert.equal(picker.visible.length, 4);
  assert.equal(picker.showMore(), true);
  assert.equal(picker.visible.length, 8);
  picker.setPrefix("2");
  assert.deepEqual(picker.visible.map((m) => m.userId), ["20", "21", "22", "23"]);
  while (picker.showMore());
  assert.equal(picker.visible.length, 10);
  assert.equal(picker.showMore(), false); // the roster is whole: nothing more will come
  picker.close();
});

/** The readers API over a fixed truth: `read` ids have read; pages of `limit` roster members. */
class Readers {
  calls: ReadReceiptsRequest[] = [];
  failNext: Error | null = null;

  constructor(readonly roster: string[], readonly readers: Set<string>, readonly known: number) {}

  async readReceipts(request: ReadReceiptsRequest): Promise<ReadReceipts> {
    this.calls.push(request);
    if (request.conversationSeq !== this.known) throw new RequestError(404, "unknown_message", `no message ${request.conversationSeq}`);
    const failure = this.failNext;
    this.failNext = null;
    if (failure !== null) throw failure;
    const limit = request.limit ?? 100;
    const start = request.pageRef ? this.roster.indexOf(request.pageRef) + 1 : 0;
    const slice = this.roster.slice(start, start + limit);
    const hasMore = start + limit < this.roster.length;
    const readRefs = slice.filter((r) => this.readers.has(r));
    const unreadRefs = slice.filter((r) => !this.readers.has(r));
    return {
      conversationSeq: request.conversationSeq, senderId: "1", readRefs, unreadRefs, readCount: readRefs.length,
      unreadCount: unreadRefs.length, basicOnly: request.basicOnly === true, selfRole: "member", hasMore,
      next: hasMore ? slice[slice.length - 1]! : null,
    };
  }
}

test("read details: the server's facts page by page (basicOnly), presentation from the shared store", async () => {
  const roster = ids(10, 25);
  const server = new Server(roster);
  server.names.set("12", "Twelve");
  const registry = registryOf(server);
  const drawer = registry.subscribe("g");
  const store = registry.store("g");
  await store.settled();
  const calls = server.calls;
  const readers = new Readers([...roster, "999"], new Set(["12", "20", "999"]), 7); // 999: not in the store
  let changes = 0;
  const details = new ReadReceiptDetails(readers, registry, "g", 7, { limit: 10, onChange: () => (changes += 1) });
  await details.nextPage();
  assert.deepEqual(details.read.map((r) => r.memberRef), ["12"]);
  assert.equal(details.unreadCount, 9);
  assert.equal(details.read[0]!.member, store.member("12"));
  assert.equal(details.read[0]!.member?.displayName, "Twelve");
  assert.ok(details.hasMore && changes >= 2);
  while (details.hasMore) await details.nextPage();
  assert.equal(details.pages, 3);
  assert.deepEqual(details.read.map((r) => r.memberRef), ["12", "20", "999"]);
  assert.equal(details.readCount + details.unreadCount, 26);
  assert.ok(readers.calls.every((c) => c.basicOnly === true && c.limit === 10));
  assert.deepEqual(readers.calls.map((c) => c.pageRef ?? null), [null, "19", "29"]);
  // A read fact never creates a member: 999 is a bare id, and the store still has 25.
  assert.equal(details.read[2]!.member, undefined);
  assert.equal(store.size, 25);
  assert.equal(server.calls, calls, "the details asked the server for members the drawer had loaded");
  await details.nextPage(); // past the last page: nothing asked
  assert.equal(readers.calls.length, 3);
  details.close();
  drawer.close();
});

test("read details: a failed page keeps the rows and retries from where it was; an unknown message says so", async () => {
  const roster = ids(10, 20);
  const registry = registryOf(new Server(roster));
  const readers = new Readers(roster, new Set(["10"]), 7);
  const details = new ReadReceiptDetails(readers, registry, "g", 7, { limit: 10 });
  await details.nextPage();
  readers.failNext = new UnavailableError("HTTP 503", 503);
  await details.nextPage();
  assert.ok(details.error instanceof UnavailableError);
  assert.equal(details.readCount + details.unreadCount, 10);
  await details.nextPage();
  assert.equal(details.error, null);
  assert.equal(details.readCount + details.unreadCount, 20);
  assert.deepEqual(readers.calls.map((c) => c.pageRef ?? null), [null, "19", "19"]);
  details.close();

  const unknown = new ReadReceiptDetails(readers, registry, "g", 8);
  await unknown.nextPage();
  assert.ok(isUnknownMessage(unknown.error), String(unknown.error));
  assert.equal(unknown.readCount + unknown.unreadCount, 0);
  unknown.close();
  assert.throws(() => new ReadReceiptDetails(readers, registry, "g", 0), RangeError);
});
