"""A web browser as an environment: a real headless Chromium driven by Playwright, one fresh
browser context (no cookies, storage or history) per episode, and five tools -- `goto(url)`,
`click(target)`, `type(target, text)`, `read()`, `back()`.

The model sees a page as simplified text: headings, text, and each link, button, field and
select as `[N] kind "label"`, where `N` is an element id `click` and `type` accept (a CSS
selector works too). `goto`, `click` and `back` answer with the page they lead to; every
observation is bounded.

Navigation is restricted to an allow-list of origins (default: only the task's own site):
a `goto`, a link or a redirect elsewhere, and any HTTP request or WebSocket a page opens
elsewhere, is refused and observed as an error; `file:` URLs, downloads and popups are refused
too. WebRTC may not send UDP outside a proxy, DNS prefetching is off, and when every allowed
origin is on 127.0.0.1 no other host name resolves at all. Chromium runs with its own sandbox
except as root, where it cannot. The site is a
`LocalSite` the environment starts on 127.0.0.1 and resets every episode, so a task's checker
reads the site's state (`env.site`) to decide pass/fail, like any `ToolTask`.

Chromium is the system's (`chromium` on Debian), found on PATH or passed as `executable_path`;
nothing downloads a browser at run time. Playwright's sync API is bound to the thread that
started it, so every browser call runs on the environment's own browser thread.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import re
import shutil
import urllib.parse
from typing import Any, Callable, Protocol, Sequence, cast

from forge_bridge.core.errors import ForgeBridgeError, InvalidArgument, InvalidState
from forge_bridge.core.extras import require
from forge_bridge.envs.tool import ToolEnvironment, ToolError, ToolTask, bounded, function_schema

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

# The page as text: headings, text, and every interactive element numbered (data-fb-id) so the
# model can name it. Invisible elements, scripts and styles are skipped.
_READ_PAGE_JS = r"""() => {
  let n = 0; const lines = [];
  const squash = s => (s || '').replace(/\s+/g, ' ').trim();
  const isInteractive = el => el.matches('a[href], button, input, select, textarea, [role=button], [onclick]');
  const isVisible = el => { const s = getComputedStyle(el); return s.display !== 'none' && s.visibility !== 'hidden'; };
  document.querySelectorAll('[data-fb-id]').forEach(el => el.removeAttribute('data-fb-id'));
  function describe(el) {
    const tag = el.tagName.toLowerCase(), type = (el.getAttribute('type') || '').toLowerCase();
    const label = squash(el.innerText || el.getAttribute('aria-label') || el.getAttribute('placeholder')
                         || (type === 'submit' || type === 'button' ? el.value : '') || el.getAttribute('name')).slice(0, 80);
    if (tag === 'a') return `link "${label}"`;
    if (tag === 'select') {
      const options = [...el.options].map(o => squash(o.text)).join(' | ');
      return `select "${label}" options: ${options}; selected: "${squash(el.selectedOptions[0]?.text)}"`;
    }
    if (tag === 'button' || type === 'submit' || type === 'button' || !['input', 'textarea'].includes(tag))
      return `button "${label}"`;
    if (type === 'checkbox' || type === 'radio') return `${type} "${label}" ${el.checked ? 'checked' : 'unchecked'}`;
    return `field "${label}" value: "${squash(el.value).slice(0, 80)}"`;
  }
  function walk(node) {
    for (const child of node.childNodes) {
      if (child.nodeType === Node.TEXT_NODE) { const t = squash(child.textContent); if (t) lines.push(t); continue; }
      if (child.nodeType !== Node.ELEMENT_NODE || ['SCRIPT', 'STYLE', 'NOSCRIPT', 'TEMPLATE'].includes(child.tagName)
          || !isVisible(child)) continue;
      if (isInteractive(child)) {
        child.setAttribute('data-fb-id', String(++n));
        lines.push(`[${n}] ${describe(child)}`);
      } else if (/^H[1-6]$/.test(child.tagName)) {
        lines.push('#'.repeat(Number(child.tagName[1])) + ' ' + squash(child.innerText));
      } else walk(child);
    }
  }
  if (document.body) walk(document.body);
  return lines.join('\n');
}"""


# Popups are refused inside the page itself (window.open, links with a target), so a click that
# would open one is answered deterministically; the context's "page" handler is the safety net.
_NO_POPUPS_JS = r"""(() => {
  const refuse = url => { window.__fbRefused = (window.__fbRefused || []).concat(['popup ' + url]); };
  window.open = url => { refuse(String(url)); return null; };
  document.addEventListener('click', event => {
    const link = event.target instanceof Element ? event.target.closest('a[target]') : null;
    if (link && !['', '_self', '_top', '_parent'].includes(link.target)) { event.preventDefault(); refuse(link.href); }
  }, true);
})();"""


class BrowserUnavailable(ForgeBridgeError, RuntimeError):
    """No Chromium or no Playwright on this machine; the message says what to install."""


class LocalSite(Protocol):
    """A web app the browser environment serves for its tasks on 127.0.0.1."""

    def start(self) -> str:
        """Serve (once) and return the base URL, e.g. 'http://127.0.0.1:41234'."""

    def reset(self) -> None:
        """Back to the initial state, before each episode."""

    def close(self) -> None:
        """Stop serving."""


def origin_of(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


def find_chromium() -> str:
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    raise BrowserUnavailable("no Chromium found on PATH (tried " + ", ".join(CHROMIUM_NAMES) + "); install it "
                             "(Debian/Ubuntu: apt-get install chromium) or pass executable_path=")


class BrowserEnvironment(ToolEnvironment):
    """Browser tools over a `LocalSite` (or a base URL) in real headless Chromium."""

    def __init__(self, site: LocalSite | None = None, *, start_url: str | None = None,
                 allowed_origins: Sequence[str] = (), executable_path: str | None = None,
                 action_timeout_s: float = 10.0, max_observation_chars: int = 4000) -> None:
        """`site`: the app to serve and reset per episode (its origin is allowed); `start_url`:
        where each episode opens (default: the site's base URL); `allowed_origins`: further
        origins the browser may load, as 'http://host:port'."""
        if site is None and start_url is None:
            raise InvalidArgument("BrowserEnvironment: pass a site to serve, or a start_url")
        if isinstance(action_timeout_s, bool) or not isinstance(action_timeout_s, (int, float)) or action_timeout_s <= 0:
            raise InvalidArgument(f"action_timeout_s: expected a number > 0, got {action_timeout_s!r}")
        self.site, self.action_timeout_s = site, float(action_timeout_s)
        self.executable_path = executable_path or find_chromium()
        allowed = {origin_of(o) for o in allowed_origins} | ({origin_of(start_url)} if start_url else set())
        for origin in allowed:
            if not origin.startswith(("http://", "https://")):
                raise InvalidArgument(f"allowed_origins: only http(s) origins can be allowed, got {origin!r}")
        base = site.start() if site is not None else None  # only once the settings are known good
        self.start_url: str = cast(str, start_url or base)  # one of the two is given: checked above
        self.allowed_origins = frozenset(allowed | ({origin_of(base)} if base else set()))
        self.refused: list[str] = []
        """What this episode's pages tried and were refused (navigations, requests, popups, downloads)."""
        super().__init__(max_observation_chars, tool_timeout_s=self.action_timeout_s * 3 + 10)
        self._thread: concurrent.futures.ThreadPoolExecutor | None = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="forge-browser")
        # Playwright's objects (an optional dependency, imported on the browser thread), set by _launch
        self._playwright: Any = None
        self._browser: Any = None
        self._context: Any = None
        self._page: Any = None
        try:
            self._call(self._launch)
        except BaseException:
            self._thread.shutdown(wait=True)
            self._thread = None
            if site is not None:
                site.close()
            raise

    # ------------------------------------------------------------------ the browser thread
    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run `fn` on the browser thread (Playwright's sync API lives there) and wait."""
        if self._thread is None:
            raise InvalidState("the browser environment is closed")
        return self._thread.submit(fn, *args).result()

    def _launch(self) -> None:
        require("playwright", "browser")  # the Python package only: the browser is the system's Chromium
        from playwright.sync_api import sync_playwright

        self._playwright = sync_playwright().start()
        args = ["--force-webrtc-ip-handling-policy=disable_non_proxied_udp", "--dns-prefetch-disable",
                "--disable-background-networking"]
        hosts = {urllib.parse.urlsplit(o).hostname for o in self.allowed_origins}
        if hosts <= {"127.0.0.1", "localhost"}:  # a local site only: no name resolves to anything else
            args.append("--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1, EXCLUDE localhost")
        try:
            # Chromium's own sandbox needs an unprivileged user; as root it cannot start with one
            self._browser = self._playwright.chromium.launch(executable_path=self.executable_path, headless=True,
                                                             args=args, chromium_sandbox=os.geteuid() != 0)
        except Exception as exc:
            self._playwright.stop()
            raise BrowserUnavailable(f"Chromium at {self.executable_path} did not start: {exc}") from exc

    def _new_context(self) -> None:
        if self._context is not None:
            self._context.close()
        self.refused = []
        self._context = self._browser.new_context(accept_downloads=False, service_workers="block")
        self._context.set_default_timeout(self.action_timeout_s * 1000)
        self._context.route("**/*", self._route)
        self._context.route_web_socket(re.compile(".*"), self._route_web_socket)  # route() does not see these
        self._context.add_init_script(_NO_POPUPS_JS)
        self._page = self._context.new_page()
        self._context.on("page", self._on_page)  # after our own page, or it would count as a popup
        self._page.on("download", lambda download: self._refuse(f"download of {download.url}"))
        self._page.on("dialog", lambda dialog: dialog.dismiss())

    def _route(self, route: Any) -> None:
        url = route.request.url
        if origin_of(url) in self.allowed_origins:
            route.continue_()
        else:
            what = "navigation to" if route.request.is_navigation_request() else "request to"
            self._refuse(f"{what} {url}")
            route.abort("blockedbyclient")

    def _route_web_socket(self, socket: Any) -> None:
        if origin_of(re.sub(r"^ws", "http", socket.url)) in self.allowed_origins:
            socket.connect_to_server()
        else:
            self._refuse(f"websocket to {socket.url}")
            socket.close(code=1008, reason="refused by the environment")

    def _on_page(self, page: Any) -> None:
        if page is not self._page:  # a popup or a new tab
            self._refuse(f"popup {page.url}")
            page.close()

    def _refuse(self, what: str) -> None:
        self.refused.append(what)

    # ------------------------------------------------------------------ episode
    def tool_functions(self) -> dict[str, tuple[dict, Callable[..., Any]]]:
        target = {"type": "string", "description": "an element id from the page, like 4, or a CSS selector"}
        return {
            "goto": (function_schema("goto", "Open a URL of the site; returns the page.",
                                     {"url": {"type": "string"}}, ("url",)), self.goto),
            "click": (function_schema("click", "Click a link or button; returns the page after it.",
                                      {"target": target}, ("target",)), self.click),
            "type": (function_schema("type", "Type text into a field (replacing what is there) or choose an "
                                     "option of a select.", {"target": target, "text": {"type": "string"}},
                                     ("target", "text")), self.type),
            "read": (function_schema("read", "Read the current page.", {}, ()), self.read),
            "back": (function_schema("back", "Go back to the previous page; returns it.", {}, ()), self.back),
        }

    def begin(self, task: ToolTask) -> None:
        if self.site is not None:
            self.site.reset()
        try:
            self._call(self._new_context)
        except InvalidState:
            raise
        except Exception as exc:  # the browser died under us
            raise BrowserUnavailable(f"could not open a fresh browser context: {exc}") from exc

    def reset(self, task: ToolTask) -> list[dict]:
        first = super().reset(task)
        try:
            page = self.goto(self.start_url)
        except ToolError as exc:
            raise BrowserUnavailable(f"the start page {self.start_url} did not load: {exc}") from exc
        first[0]["content"] = f"{task.prompt}\n\nThe browser shows {page}"
        return first

    def close(self) -> None:
        if self._thread is None:
            return

        def shut() -> None:
            for thing in (self._context, self._browser):
                if thing is not None:
                    thing.close()
            if self._playwright is not None:
                self._playwright.stop()

        try:
            self._call(shut)
        finally:
            self._thread.shutdown(wait=True)
            self._thread = None
            if self.site is not None:
                self.site.close()

    # ------------------------------------------------------------------ tools
    @property
    def url(self) -> str:
        return self._call(lambda: self._page.url)

    def _act(self, action: Callable[[], None]) -> str:
        """Run a page action on the browser thread; refused navigations become a ToolError."""
        if self._thread is None:
            raise InvalidState("the browser environment is closed")
        if self._page is None or self.task is None:
            raise ToolError("no episode is running")

        def run() -> str:
            before = len(self.refused)
            try:
                action()
                self._page.wait_for_load_state()
            except ToolError:
                raise
            except Exception as exc:  # Playwright's own errors: timeouts, no such element
                if len(self.refused) == before:
                    raise ToolError(_playwright_message(exc)) from None
            with contextlib.suppress(Exception):  # a page mid-navigation has nothing to say
                self.refused += self._page.evaluate("() => (window.__fbRefused || []).splice(0)")
            if len(self.refused) > before:
                if self._page.url.startswith("chrome-error://"):
                    self._page.go_back()
                raise ToolError(f"refused: {'; '.join(self.refused[before:])} (allowed origins: "
                                f"{', '.join(sorted(self.allowed_origins))})")
            return self._describe()

        return self._call(run)

    def _describe(self) -> str:
        text = self._page.evaluate(_READ_PAGE_JS)
        return bounded(f"{self._page.url} (title: {self._page.title()!r}):\n{text}", self.max_observation_chars)

    def _locate(self, target: str) -> Any:
        """An element id from the last observation, a CSS selector, or the exact text of a link,
        button or field label."""
        target = target.strip()
        bare = target.strip("[]#")
        if bare.isdigit():
            candidates = [self._page.locator(f'[data-fb-id="{bare}"]')]
        else:
            candidates = [self._page.get_by_role(role, name=target, exact=True) for role in ("link", "button")]
            candidates += [self._page.get_by_label(target, exact=True)]
            with contextlib.suppress(Exception):  # not valid CSS: then it was meant as text
                self._page.locator(target).count()
                candidates.insert(0, self._page.locator(target))
        for locator in candidates:
            if locator.count():
                return locator.first
        raise ToolError(f"no element {target!r} on this page (the page lists element ids as [N])")

    def goto(self, url: str) -> str:
        if ":" not in url.split("/", 1)[0]:  # no scheme: a path on the current site
            url = urllib.parse.urljoin(self.url if self._page is not None else self.start_url, url)
        if origin_of(url) not in self.allowed_origins:
            scheme = urllib.parse.urlsplit(url).scheme
            reason = f"{scheme}: URLs are refused" if scheme not in ("http", "https") else "not an allowed origin"
            self._refuse(f"navigation to {url}")
            raise ToolError(f"refused: {url} ({reason}; allowed origins: {', '.join(sorted(self.allowed_origins))})")
        return self._act(lambda: self._page.goto(url))

    def click(self, target: str) -> str:
        return self._act(lambda: self._locate(target).click())

    def type(self, target: str, text: str) -> str:
        def fill() -> None:
            element = self._locate(target)
            if element.evaluate("el => el.tagName") == "SELECT":
                element.select_option(label=text)
            else:
                element.fill(text)

        self._act(fill)
        return f"typed {text!r} into {target}"

    def read(self) -> str:
        return self._act(lambda: None)

    def back(self) -> str:
        return self._act(lambda: self._page.go_back())


def _playwright_message(exc: Exception) -> str:
    first = str(exc).strip().split("\n")[0]
    return f"{type(exc).__name__}: {first}"[:300]


__all__ = ["BrowserEnvironment", "BrowserUnavailable", "LocalSite", "find_chromium"]
