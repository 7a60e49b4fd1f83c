"""Drive headless Chromium over every page of the built site and report what a reader would hit.

    python docs/browser_check.py --site site --screenshots docs/screenshots

Serves ``--site`` with ``python -m http.server`` on localhost, opens every page (``sitemap.xml``
and every HTML file of the site) in Debian's ``/usr/bin/chromium`` through ``/usr/bin/chromedriver``
(Selenium; nothing is downloaded), and checks on each: no SEVERE entry in the browser's console,
every internal link answers HTTP 200 and its ``#anchor`` exists on the target, no LaTeX left
unrendered and MathML present (and laid out) where the page's source has math, a picture
(an ``<svg>`` with cells) in every clause section of each rule page under ``spec/``; and on the atlas, that its filters
reduce the visible rows and a reproducer opens in the dialog. Prints one line per failure and
exits 1 on any; saves screenshots of the home page, a rule page and the atlas.
"""

from __future__ import annotations

import argparse
import contextlib
import html.parser
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
#: LaTeX a reader should never see: $...$, \( \), \[ \], or any command (\frac, \argmax...) outside code
RAW_LATEX = re.compile(r"(?<![\w$])\$[^$\s][^$\n]*\$|\\\(|\\\[|\\[A-Za-z]{2,}\b")
SOURCE_MATH = re.compile(r"\$[^$\n]+\$|\\\(|\\\[")


class _Ids(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        for k, v in attrs:
            if k in ("id", "name") and v:
                self.ids.add(v)


@contextlib.contextmanager
def serve(site: Path) -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(site)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}/"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(base, timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise RuntimeError(f"http.server did not answer on {base}")
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def site_pages(site: Path) -> list[str]:
    """Every page, as a path relative to the site root ending in "/" or ".html": the sitemap's
    entries and every HTML file but the 404 page (so a page missing from the sitemap is visited too)."""
    pages = set()
    for f in site.rglob("*.html"):
        rel = f.relative_to(site).as_posix()
        if rel == "404.html":
            continue
        pages.add(rel[: -len("index.html")] if rel.endswith("index.html") else rel)
    sitemap = site / "sitemap.xml"
    if sitemap.exists():
        ns = {"s": "http://www.sitemaps.org/schemas/sitemap/0.9"}
        locs = [e.text or "" for e in ET.parse(sitemap).getroot().findall("s:url/s:loc", ns)]
        roots = [loc for loc in locs if loc.count("/") <= 3]
        prefix = min(roots, key=len) if roots else ""
        for loc in locs:
            if prefix and loc.startswith(prefix):
                pages.add(loc[len(prefix) :])
    return sorted(pages, key=lambda p: (p.count("/"), p))


class Checker:
    def __init__(self, site: Path, base: str, docs: Path | None, driver) -> None:
        self.site, self.base, self.docs, self.driver = site, base, docs, driver
        self.failures: list[str] = []
        self.status: dict[str, int] = {}
        self.ids: dict[str, set[str]] = {}
        self.links = 0

    def fail(self, page: str, what: str) -> None:
        self.failures.append(f"FAIL /{page}: {what}")
        print(self.failures[-1], flush=True)

    def _fetch(self, url: str) -> int:
        if url not in self.status:
            try:
                with urllib.request.urlopen(url, timeout=10) as r:
                    self.status[url] = r.status
                    if "html" in r.headers.get("Content-Type", ""):
                        parser = _Ids()
                        parser.feed(r.read().decode("utf-8", "replace"))
                        self.ids[url] = parser.ids
            except urllib.error.HTTPError as e:
                self.status[url] = e.code
            except OSError:
                self.status[url] = 0
        return self.status[url]

    def check_links(self, page: str) -> None:
        hrefs = self.driver.execute_script(
            "return Array.from(document.querySelectorAll('a[href]'), a => a.href)"
        )
        for href in sorted(set(hrefs)):
            if not href.startswith(self.base):
                continue
            self.links += 1
            url, _, frag = href.partition("#")
            code = self._fetch(url)
            if code != 200:
                self.fail(page, f"broken link {href[len(self.base) - 1 :]} (HTTP {code})")
            elif frag and url in self.ids and urllib.parse.unquote(frag) not in self.ids[url]:
                self.fail(page, f"link {href[len(self.base) - 1 :]}: no element #{frag} on the target")

    def check_console(self, page: str) -> None:
        for entry in self.driver.get_log("browser"):
            if entry.get("level") == "SEVERE":
                self.fail(page, f"console error: {entry.get('message', '')[:300]}")
        # a request outside the site (a CDN, web fonts) fails the check even when it happened to load
        outside = self.driver.execute_script(
            "return performance.getEntriesByType('resource').map(e => e.name)"
            ".filter(u => !u.startsWith(location.origin) && !/^(data|blob):/.test(u))"
        )
        for url in sorted(set(outside)):
            self.fail(page, f"loads {url[:200]} from outside the site")

    def _source(self, page: str) -> Path | None:
        if self.docs is None:
            return None
        stem = page.rstrip("/") or "index"
        for cand in (f"{stem}.md", f"{stem}/index.md", f"{stem}/README.md"):
            if (self.docs / cand).exists():
                return self.docs / cand
        return None

    def check_math(self, page: str) -> None:
        text = self.driver.execute_script(
            "const a = document.querySelector('article') || document.body;"
            "const c = a.cloneNode(true); c.querySelectorAll('pre, code, script, math').forEach(e => e.remove());"
            "return c.textContent;"
        )
        raw = RAW_LATEX.search(text or "")
        if raw:
            self.fail(page, f"LaTeX left unrendered: {raw.group(0)[:60]!r}")
        sizes = self.driver.execute_script(
            "return Array.from(document.querySelectorAll('article math'), m => m.getBoundingClientRect().height)"
        )
        leftover = self.driver.execute_script(
            "return Array.from(document.querySelectorAll('article math'), m => m.textContent)"
            ".filter(t => /\\\\[A-Za-z_{}]/.test(t)).slice(0, 3)"
        )
        for t in leftover:
            self.fail(page, f"MathML shows LaTeX source: {' '.join(t.split())[:80]!r}")
        # all, not any: math inside a closed <details> is not laid out until it is opened
        if sizes and all(h <= 0 for h in sizes):
            self.fail(page, f"{len(sizes)} <math> elements, none laid out (MathML not rendered)")
        src = self._source(page)
        if src is not None and not sizes:
            body = re.sub(r"```.*?```|`[^`\n]*`", "", src.read_text(encoding="utf-8"), flags=re.S)
            if SOURCE_MATH.search(body):
                self.fail(page, f"{src.name} has math but the page has no <math> element")

    def check_picture(self, page: str) -> None:
        """Every clause section (an ``h2`` with an id, up to the next ``h2``) holds a drawing: an
        ``<svg>`` with more than one shape, not an icon."""
        found = self.driver.execute_script(
            "const drawing = s => !s.closest('.md-icon, .md-content__button, .twemoji, .headerlink, button')"
            "  && s.querySelectorAll('rect, path, line, polygon').length > 1;"
            "const a = document.querySelector('article'); if (!a) return null;"
            "const out = [];"
            "for (const h of a.querySelectorAll('h2[id]')) {"
            "  let n = 0;"
            "  for (let e = h.nextElementSibling; e && e.tagName !== 'H2'; e = e.nextElementSibling)"
            "    n += [...(e.matches('svg') ? [e] : []), ...e.querySelectorAll('svg')].filter(drawing).length;"
            "  out.push([h.id, n]);"
            "}"
            "return out;"
        )
        if not found:
            self.fail(page, "rule page without clause sections (no <h2 id> in the article)")
            return
        for section, n in found:
            if not n:
                self.fail(page, f"clause section #{section} without a picture (no <svg> drawing in it)")

    def check_atlas(self, page: str, screenshots: Path | None) -> None:
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import WebDriverWait

        d = self.driver
        visible = (
            "return Array.from(document.querySelectorAll('table.atlas-table tbody tr'))"
            ".filter(r => !r.hidden).length"
        )
        try:
            WebDriverWait(d, 10).until(lambda d: d.find_elements(By.ID, "atlas-filter-impl"))
        except Exception:
            self.fail(page, "atlas: the filters never appeared (atlas.js not loaded or failed)")
            return
        total = d.execute_script(visible)
        if screenshots is not None:
            d.save_screenshot(str(screenshots / "atlas.png"))
        box = d.find_element(By.ID, "atlas-filter-impl")
        box.send_keys("mlx")
        narrowed = d.execute_script(visible)
        if not 0 < narrowed < total:
            self.fail(page, f"atlas: filtering by 'mlx' left {narrowed} of {total} rows visible")
        box.clear()
        d.execute_script("arguments[0].dispatchEvent(new Event('input'))", box)
        d.find_element(By.ID, "atlas-deviations-only").click()
        deviating = d.execute_script(visible)
        if not 0 < deviating < total:
            self.fail(page, f"atlas: 'deviations only' left {deviating} of {total} rows visible")
        d.find_element(By.ID, "atlas-deviations-only").click()
        links = d.find_elements(By.CSS_SELECTOR, "table.atlas-table a .atlas-repro-link")
        if not links:
            self.fail(page, "atlas: no reproducer link in any cell")
            return
        d.execute_script("arguments[0].scrollIntoView({block: 'center'})", links[0])
        d.execute_script("arguments[0].closest('a').click()", links[0])
        try:
            WebDriverWait(d, 10).until(
                lambda d: d.execute_script(
                    "const g = document.getElementById('atlas-dialog');"
                    "const t = g && g.querySelector('code').textContent;"
                    "return g && g.open && t && t !== 'loading…' ? t : null"
                )
            )
        except Exception:
            self.fail(page, "atlas: a reproducer link did not open its snippet in the dialog")
            return
        code = d.execute_script("return document.querySelector('#atlas-dialog code').textContent")
        if "fn(" not in code and "import" not in code:
            self.fail(page, f"atlas: the dialog shows no code: {code[:80]!r}")
        if screenshots is not None:
            d.save_screenshot(str(screenshots / "atlas-reproducer.png"))
        d.execute_script("document.getElementById('atlas-dialog').close()")

    def visit(
        self, page: str, rule_page: re.Pattern, screenshots: Path | None, shots: dict[str, str]
    ) -> None:
        d = self.driver
        d.get(self.base + page)
        for _ in range(50):
            if d.execute_script("return document.readyState") == "complete":
                break
            time.sleep(0.1)
        time.sleep(0.2)  # the theme's and the atlas' scripts run after load
        self.check_console(page)
        self.check_links(page)
        self.check_math(page)
        if rule_page.fullmatch(page):
            self.check_picture(page)
            shots.setdefault("rule", page)
            if screenshots is not None and shots["rule"] == page:
                d.execute_script(  # the first picture in view, below its clause's heading
                    "const s = document.querySelector('article figure svg, article svg rect');"
                    "if (s) s.closest('figure, svg').scrollIntoView({block: 'center'})"
                )
                time.sleep(0.2)
                d.save_screenshot(str(screenshots / "rule.png"))
                d.execute_script("window.scrollTo(0, 0)")
        if page == "" and screenshots is not None:
            d.save_screenshot(str(screenshots / "home.png"))
        if d.find_elements("id", "atlas-grid"):
            self.check_atlas(page, screenshots)
            shots["atlas"] = page
        self.check_console(page)  # what the interactions logged


def driver(width: int, height: int):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--window-size={width},{height}",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
    ):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=opts, service=Service(executable_path=CHROMEDRIVER))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--site", type=Path, default=Path("site"), help="the built site (mkdocs build)")
    ap.add_argument(
        "--docs",
        type=Path,
        default=Path("docs"),
        help="the docs sources, to know which pages have math (skipped when absent)",
    )
    ap.add_argument("--screenshots", type=Path, default=None, help="where to save the PNG screenshots")
    ap.add_argument(
        "--rule-pages",
        default=r"spec/(?!index\.html$)[^#?]+",
        help="regex (on the page path) of the rule pages, each clause section of which must show a picture",
    )
    ap.add_argument("--pages", default="", help="regex: visit only the pages it finds (all when empty)")
    ap.add_argument("--size", default="1400x1000", help="the window, WIDTHxHEIGHT")
    args = ap.parse_args(argv)
    if not (args.site / "index.html").exists():
        print(f"FAIL: {args.site}/index.html does not exist (build the site first)")
        return 1
    for exe in (CHROMIUM, CHROMEDRIVER):
        if not Path(exe).exists():
            print(f"FAIL: {exe} is missing: apt-get install -y chromium chromium-driver")
            return 1
    if args.screenshots is not None:
        args.screenshots.mkdir(parents=True, exist_ok=True)
    width, height = (int(x) for x in args.size.split("x"))
    pages = [p for p in site_pages(args.site) if re.search(args.pages, p)]
    start = time.monotonic()
    shots: dict[str, str] = {}
    with serve(args.site) as base:
        d = driver(width, height)
        try:
            checker = Checker(args.site, base, args.docs if args.docs.exists() else None, d)
            for page in pages:
                checker.visit(page, re.compile(args.rule_pages), args.screenshots, shots)
        finally:
            d.quit()
    if "atlas" not in shots and not args.pages:
        checker.fail("atlas/", "no page holds the atlas grid (#atlas-grid)")
    if "rule" not in shots and not args.pages:
        checker.fail("spec/", f"no rule page matched --rule-pages {args.rule_pages!r}")
    took = time.monotonic() - start
    print(
        f"browser check: {len(pages)} pages, {checker.links} internal links, {len(checker.failures)} failures "
        f"({took:.0f} s; rule page shown: /{shots.get('rule', '-')}, atlas: /{shots.get('atlas', '-')})"
    )
    return 1 if checker.failures else 0


if __name__ == "__main__":
    sys.exit(main())
