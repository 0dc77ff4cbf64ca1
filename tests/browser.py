"""Headless Chromium for the page tests: render a page at a window width and measure it.

``layout`` copies the page beside itself (so relative links still resolve) with a script
that, once the page has loaded, measures the document's scroll width against the window's
and lists the elements that stick out on the right; Chromium's ``--dump-dom`` prints the
DOM with that measurement in it.  Real Chromium, real layout: no mock of the browser.
"""

from __future__ import annotations

import html
import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

_MEASURE = """<script>
window.addEventListener("load", () => {
  const root = document.documentElement;
  const wide = [...document.querySelectorAll("body *")]
    .filter((e) => e.getBoundingClientRect().right > root.clientWidth + 0.5)
    .slice(0, 12)
    .map((e) => `${e.tagName.toLowerCase()}${e.className ? "." + e.className : ""}: `
                + (e.textContent || "").trim().slice(0, 80));
  const out = document.createElement("pre");
  out.id = "wf-layout";
  out.hidden = true;
  const rows = [...document.querySelectorAll("tbody tr")]
    .map((r) => Math.round(r.getBoundingClientRect().height));
  out.textContent = JSON.stringify({scrollWidth: root.scrollWidth,
                                    clientWidth: root.clientWidth, wide: wide, rows: rows});
  document.body.appendChild(out);
});
</script>
"""


@dataclass(frozen=True)
class Layout:
    scroll_width: int
    client_width: int
    wide: tuple[str, ...]  # elements reaching past the window's right edge
    row_heights: tuple[int, ...] = ()  # each table body row's height, px

    @property
    def overflows(self) -> bool:
        return self.scroll_width > self.client_width or bool(self.wide)


def chromium_argv(chromium: str, profile: Path, width: int, height: int) -> list[str]:
    return [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--hide-scrollbars", f"--user-data-dir={profile}",
            f"--window-size={width},{height}"]


def layout(chromium: str, page: Path, profile: Path, *, width: int = 1400,
           height: int = 900) -> Layout:
    html = page.read_text(encoding="utf-8")
    assert "</body>" in html, f"{page} has no </body>"
    probe = page.with_name(f".layout-{page.name}")
    probe.write_text(html.replace("</body>", _MEASURE + "</body>", 1), encoding="utf-8")
    try:
        done = subprocess.run([*chromium_argv(chromium, profile, width, height),
                               "--virtual-time-budget=5000", "--dump-dom", probe.as_uri()],
                              capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
    finally:
        probe.unlink()
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    dom = done.stdout.decode()
    start = dom.index('<pre id="wf-layout" hidden="">') + len('<pre id="wf-layout" hidden="">')
    text = dom[start:dom.index("</pre>", start)]
    text = text.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"')
    data = json.loads(text.replace("&amp;", "&"))
    return Layout(int(data["scrollWidth"]), int(data["clientWidth"]), tuple(data["wide"]),
                  tuple(int(h) for h in data.get("rows", [])))


def screenshot(chromium: str, page: Path, profile: Path, out: Path, *, width: int = 1400,
               height: int = 900) -> Path:
    done = subprocess.run([*chromium_argv(chromium, profile, width, height),
                           f"--screenshot={out}", page.as_uri()],
                          capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    return out


# ------------------------------------------------------------------ probes: colours, breaks

_PROBE = """<script>
window.addEventListener("load", () => {
  const out = document.createElement("pre");
  out.id = "wf-probe";
  out.hidden = true;
  out.textContent = JSON.stringify((%s)());
  document.body.appendChild(out);
});
</script>
"""

def _luminance(rgb: tuple[float, ...]) -> float:
    """WCAG 2's relative luminance of an sRGB colour (0-255 channels)."""
    def channel(c: float) -> float:
        c /= 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4
    r, g, b = (channel(c) for c in rgb[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(fg: str, bg: str) -> float:
    """WCAG 2's contrast ratio of two CSS colours as Chromium computes them (rgb(...))."""
    lum = sorted(_luminance(tuple(float(x) for x in re.findall(r"[\d.]+", c)[:3]))
                 for c in (fg, bg))
    return (lum[1] + 0.05) / (lum[0] + 0.05)


def colours_script(selector: str = "body *") -> str:
    """A probe script: every element matching ``selector`` with text of its own that is
    shown, its text colour and the background it is drawn on (the nearest ancestor's,
    itself included, that is not transparent)."""
    return "() => [...document.querySelectorAll(" + json.dumps(selector) + ")]" + """
  .filter((e) => e.getClientRects().length && [...e.childNodes].some(
    (n) => n.nodeType === 3 && n.textContent.trim()))
  .map((e) => {
    let bg = "rgb(255, 255, 255)";
    for (let a = e; a; a = a.parentElement) {
      const c = getComputedStyle(a).backgroundColor;
      if (c !== "transparent" && !c.startsWith("rgba(0, 0, 0, 0)")) { bg = c; break; }
    }
    return {what: e.tagName.toLowerCase() + (e.className ? "." + e.className : "") + ": "
                  + e.textContent.trim().slice(0, 50),
            fg: getComputedStyle(e).color, bg: bg};
  })"""


#: every element with text of its own that is shown, on the whole page
COLOURS = colours_script()

#: for every element matching SELECTOR: its text split where its lines break
LINES = """() => [...document.querySelectorAll(%s)].map((e) => {
  const lines = [];
  let top = null;
  const walk = document.createTreeWalker(e, NodeFilter.SHOW_TEXT);
  for (let n = walk.nextNode(); n; n = walk.nextNode()) {
    for (let i = 0; i < n.textContent.length; i++) {
      const r = document.createRange(); r.setStart(n, i); r.setEnd(n, i + 1);
      const rect = r.getBoundingClientRect();
      if (top === null || rect.top > top + 2) { lines.push(""); top = rect.top; }
      lines[lines.length - 1] += n.textContent[i];
    }
  }
  return lines;
})"""


def probe(chromium: str, page: Path, profile: Path, script: str, *, width: int = 1400,
          height: int = 900, dark: bool = False) -> object:
    """What ``script`` (a JavaScript function's source) returns on the page once it has
    loaded, in headless Chromium; ``dark``: with the page's prefers-color-scheme: dark
    rules in force (they are made unconditional in the copy that is loaded)."""
    text = page.read_text(encoding="utf-8")
    if dark:
        assert "@media (prefers-color-scheme: dark)" in text, f"{page} has no dark rules"
        text = text.replace("@media (prefers-color-scheme: dark)", "@media all")
    copy = page.with_name(f".probe-{page.name}")
    copy.write_text(text.replace("</body>", _PROBE % script + "</body>", 1), encoding="utf-8")
    try:
        done = subprocess.run([*chromium_argv(chromium, profile, width, height),
                               "--virtual-time-budget=5000", "--dump-dom", copy.as_uri()],
                              capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
    finally:
        copy.unlink()
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    dom = done.stdout.decode()
    start = dom.index('<pre id="wf-probe" hidden="">') + len('<pre id="wf-probe" hidden="">')
    return json.loads(html.unescape(dom[start:dom.index("</pre>", start)]))
