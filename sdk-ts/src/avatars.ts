// Avatars load only when their row is visible (seed 004: 500 cached rows must not start 500
// avatar reads). A small helper over IntersectionObserver: observe(element, url) starts the load
// the first time the element intersects the viewport, once per element, and never for an element
// unobserved (or a loader closed) before it became visible. Structural types: the SDK compiles
// without the DOM lib; in a browser pass nothing and window.IntersectionObserver is used.

export interface IntersectionEntryLike<E> {
  readonly target: E;
  readonly isIntersecting: boolean;
}

export interface IntersectionObserverLike<E> {
  observe(target: E): void;
  unobserve(target: E): void;
  disconnect(): void;
}

export type IntersectionObserverFactory<E> = (
  callback: (entries: readonly IntersectionEntryLike<E>[]) => void,
  options: { rootMargin?: string; threshold?: number },
) => IntersectionObserverLike<E>;

export interface AvatarLoaderOptions<E> {
  /** What to do when `element` becomes visible (e.g. set an <img>'s src). */
  load: (element: E, url: string) => void;
  /** Defaults to the global IntersectionObserver. */
  observer?: IntersectionObserverFactory<E>;
  /** Start a little before the row scrolls in. Default "100px". */
  rootMargin?: string;
}

export class AvatarLoader<E extends object> {
  private readonly pending = new Map<E, string>();
  private readonly observer: IntersectionObserverLike<E>;
  private readonly loadFn: (element: E, url: string) => void;
  /** Loads started (tests and diagnostics). */
  loads = 0;

  constructor(options: AvatarLoaderOptions<E>) {
    this.loadFn = options.load;
    const factory = options.observer ?? defaultFactory<E>();
    this.observer = factory((entries) => this.intersect(entries), { rootMargin: options.rootMargin ?? "100px", threshold: 0 });
  }

  /** Load `url` into `element` once it is visible; a new url replaces a pending one. A null url
   * (no avatar, or the profile failed and there is none to keep) observes nothing. */
  observe(element: E, url: string | null): void {
    if (url === null) {
      this.unobserve(element);
      return;
    }
    const had = this.pending.has(element);
    this.pending.set(element, url);
    if (!had) this.observer.observe(element);
  }

  unobserve(element: E): void {
    if (this.pending.delete(element)) this.observer.unobserve(element);
  }

  /** How many elements wait to become visible. */
  get waiting(): number {
    return this.pending.size;
  }

  close(): void {
    this.pending.clear();
    this.observer.disconnect();
  }

  private intersect(entries: readonly IntersectionEntryLike<E>[]): void {
    for (const entry of entries) {
      if (!entry.isIntersecting) continue;
      const url = this.pending.get(entry.target);
      if (url === undefined) continue;
      this.pending.delete(entry.target);
      this.observer.unobserve(entry.target);
      this.loads += 1;
      this.loadFn(entry.target, url);
    }
  }
}

function defaultFactory<E>(): IntersectionObserverFactory<E> {
  const Ctor = (globalThis as unknown as { IntersectionObserver?: new (cb: (entries: readonly IntersectionEntryLike<E>[]) => void, options: object) => IntersectionObserverLike<E> }).IntersectionObserver;
  if (Ctor === undefined) throw new TypeError("no IntersectionObserver here: pass options.observer");
  return (callback, options) => new Ctor(callback, options);
}
