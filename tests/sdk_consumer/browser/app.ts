// A browser page's use of the SDK, compiled with the DOM lib and no Node types: the main entry
// point must not need @types/node (the test compiles this file; nothing runs it).

import {
  AvatarLoader,
  LiveSessionList,
  LiveStream,
  MemberStoreRegistry,
  MembersClient,
  PagedSessionList,
  SessionsClient,
  WebStorageMemberCache,
} from "@session-projector/sdk";

const api = { baseUrl: location.origin, token: () => sessionStorage.getItem("token") ?? "" };
const userId = "11982011376358104761";
const members = new MembersClient(api);
// The browser's own cache (no host): localStorage, signed with a key the page keeps there.
const cache = new WebStorageMemberCache(localStorage, WebStorageMemberCache.pageKey(localStorage));
const directory = new MemberStoreRegistry("web", userId, members, { cache, profiles: members });
const avatars = new AvatarLoader<HTMLImageElement>({ load: (img, url) => void (img.src = url) });
const list = new LiveSessionList(new SessionsClient(api), userId);
const stream = new LiveStream(list, { onNotice: (notice) => void directory.onNotice(notice) });

/** The member drawer of `group`: rows re-rendered from the one store; avatars load when visible. */
export function mountDrawer(root: HTMLElement, group: string): () => void {
  const subscription = directory.subscribe(group, (store) => {
    root.replaceChildren(
      ...store.sorted().map((member) => {
        const row = document.createElement("li");
        const img = document.createElement("img");
        avatars.observe(img, member.avatarUrl);
        row.append(img, member.displayName ?? member.userId, member.statsKnown ? ` ${member.recordCount}` : "");
        return row;
      }),
    );
  });
  return () => subscription.close();
}

export function start(signal: AbortSignal): Promise<void> {
  return stream.run({ signal });
}

/** A "load more" list of the main folder, kept live by the same stream machinery. */
export function pagedList(signal: AbortSignal): PagedSessionList {
  const paged = new PagedSessionList(new SessionsClient(api), null, { limit: 20 });
  void new LiveStream(paged).run({ signal });
  return paged;
}
