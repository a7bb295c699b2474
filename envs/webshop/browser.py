"""Browser mode: WebShop actions executed by Playwright in headless Debian ``chromium``.

One process-wide :class:`BrowserWorker` thread owns Playwright and one chromium: the
sync Playwright API is bound to the thread that started it, while servers run engine
calls on a thread pool, so every browser call is handed to that thread. Each
environment instance gets its own :class:`BrowserTab` (an isolated browser context).

After every action the tab reads the page back from the DOM: its visible text (the
observation), its clickable elements (links and buttons, named by their text, as in
text mode) and the ``data-*`` attributes the site puts on ``<body>``.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from agentgym.contract.errors import EngineError

CHROMIUM = "/usr/bin/chromium"
"""Debian's chromium: ``playwright install`` cannot download browsers on offline machines."""
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
TIMEOUT_MS = 20_000
T = TypeVar("T")

# Reads the page back: visible text, clickables (the search form's submit button is the
# search bar, not a clickable) and the site's data attributes. Clickables get an index
# attribute so a click addresses exactly the element the agent saw.
_SNAPSHOT_JS = """() => {
  const body = document.body;
  const elements = [...document.querySelectorAll('a, button')]
    .filter(e => e.dataset.role !== 'search-submit');
  elements.forEach((e, i) => e.setAttribute('data-agentgym-index', String(i)));
  const reward = document.querySelector('#reward');
  return {
    text: body.innerText,
    page: body.dataset.page || '',
    asin: body.dataset.asin || '',
    chosen: JSON.parse(body.dataset.chosen || '[]'),
    clickables: elements.map(e => e.innerText.trim().toLowerCase()),
    has_search_bar: !!document.querySelector('form[role=search] input[name=q]'),
    reward: reward ? parseFloat(reward.dataset.reward) : null,
  };
}"""


@dataclass(frozen=True)
class Snapshot:
    """One page as the browser shows it."""

    text: str
    page: str
    asin: str
    chosen: frozenset[str]
    clickables: list[str]
    has_search_bar: bool
    reward: float | None


class BrowserWorker:
    """The thread that owns Playwright and chromium; :meth:`call` runs work on it.

    A daemon thread with a job queue rather than a ThreadPoolExecutor: executors are shut
    down before ``atexit`` handlers run, and :meth:`stop` (an atexit handler) still needs
    the thread to close chromium."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="agentgym-chromium", daemon=True).start()
        self._playwright: Any = None
        self.browser: Any = None
        self.call(self._start)

    def _serve(self) -> None:
        while True:
            self._jobs.get()()

    def _start(self) -> None:
        from playwright.sync_api import sync_playwright

        self._playwright = sync_playwright().start()
        self.browser = self._playwright.chromium.launch(executable_path=CHROMIUM, args=list(CHROMIUM_ARGS))

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the browser thread; Playwright failures become EngineError."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def job() -> None:
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # handed to the caller, who re-raises it
                future.set_exception(exc)

        self._jobs.put(job)
        try:
            return future.result()
        except EngineError:
            raise
        except Exception as exc:  # Playwright's errors: timeouts, a crashed page or browser
            raise EngineError(f"browser: {type(exc).__name__}: {exc}") from exc

    def stop(self) -> None:
        """Close chromium and Playwright's driver."""
        if self.browser is not None:
            self.call(self.browser.close)
        if self._playwright is not None:
            self.call(self._playwright.stop)
        self.browser = self._playwright = None


_worker: BrowserWorker | None = None
_worker_lock = threading.Lock()


def browser_worker() -> BrowserWorker:
    """The process-wide browser, launched on first use and closed at exit."""
    global _worker
    with _worker_lock:
        if _worker is None:
            _worker = BrowserWorker()
            atexit.register(_worker.stop)
        return _worker


class BrowserTab:
    """One isolated browsing context: navigate, search, click, read the page back."""

    def __init__(self, worker: BrowserWorker) -> None:
        self.worker = worker
        self._page: Any = worker.call(self._open)

    def _open(self) -> Any:
        context = self.worker.browser.new_context()
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        return page

    def goto(self, url: str) -> Snapshot:
        return self.worker.call(self._goto, url)

    def search(self, query: str) -> Snapshot:
        return self.worker.call(self._search, query)

    def click(self, index: int) -> Snapshot:
        """Click the ``index``-th clickable of the last snapshot."""
        return self.worker.call(self._click, index)

    def close(self) -> None:
        page, self._page = self._page, None
        if page is not None:
            self.worker.call(page.context.close)

    def _goto(self, url: str) -> Snapshot:
        response = self._page.goto(url)
        if response is None or not response.ok:
            raise EngineError(f"the WebShop site answered {response and response.status} for {url}")
        return self._snapshot()

    def _search(self, query: str) -> Snapshot:
        self._page.fill("form[role=search] input[name=q]", query)
        with self._page.expect_navigation():
            self._page.click("form[role=search] [data-role=search-submit]")
        return self._snapshot()

    def _click(self, index: int) -> Snapshot:
        with self._page.expect_navigation():
            self._page.click(f'[data-agentgym-index="{index}"]')
        return self._snapshot()

    def _snapshot(self) -> Snapshot:
        raw = self._page.evaluate(_SNAPSHOT_JS)
        return Snapshot(
            text=raw["text"].strip(),
            page=raw["page"],
            asin=raw["asin"],
            chosen=frozenset(raw["chosen"]),
            clickables=list(raw["clickables"]),
            has_search_bar=bool(raw["has_search_bar"]),
            reward=raw["reward"],
        )
