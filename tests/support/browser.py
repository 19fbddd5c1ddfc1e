"""Look at a report as a person would: render it in headless Chromium (Debian's `chromium`),
read back the rendered DOM and a screenshot.

A probe script is added to a copy of the page (the reports themselves carry no script): once
the page has loaded, it records what was really laid out (each image decoded with a size,
each SVG drawn with a size, the text of every SVG) into an element `--dump-dom` prints.
Without Chromium the tests skip, unless LIYAGENT_CI is set (.ci/run sets it and installs
Chromium): there a missing browser is a failure, never a silent skip.
"""

from __future__ import annotations

import html
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)
WINDOW = (1280, 2400)

PROBE = """
<script>
window.addEventListener('load', () => {
  const box = (e) => { const r = e.getBoundingClientRect(); return [r.width, r.height]; };
  const out = {
    images: [...document.images].map((i) => ({
      alt: i.alt, complete: i.complete, width: i.naturalWidth, height: i.naturalHeight })),
    svgs: [...document.querySelectorAll('svg')].map((s) => ({
      id: s.closest('section') ? s.closest('section').id : null, size: box(s),
      text: [...s.querySelectorAll('text')].map((t) => t.textContent).join(' | '),
      ids: [...s.querySelectorAll('[id]')].map((e) => e.id) })),
  };
  const pre = document.createElement('pre');
  pre.id = 'probe';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>
"""


@dataclass(frozen=True)
class Rendered:
    """What Chromium made of a page: its DOM, the probe's findings and a screenshot."""

    dom: str
    probe: dict[str, Any]
    screenshot: Path


def chromium() -> str:
    """The Chromium binary, or skip (fail under LIYAGENT_CI) when it is not installed."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        why = (
            "Debian's chromium is not installed (apt-get install -y chromium); the report is "
            "checked in a real browser"
        )
        if os.environ.get("LIYAGENT_CI"):
            pytest.fail(f"{why}, and CI must have it (.ci/run installs it)")
        pytest.skip(why)
    return found


def _run(binary: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [binary, *FLAGS, f"--user-data-dir={profile}", f"--window-size={WINDOW[0]},{WINDOW[1]}"]
    done = subprocess.run(
        [*argv, *args], capture_output=True, text=True, timeout=90, cwd=profile.parent
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def render(page: Path, tmp: Path) -> Rendered:
    """Render `page` in headless Chromium: the DOM after load (with the probe's findings) and
    a full-window screenshot of the page as it is (without the probe)."""
    binary = chromium()
    probed = tmp / f"probed-{page.name}"
    probed.write_text(page.read_text().replace("</body>", PROBE + "</body>", 1))
    dom = _run(
        binary, tmp / "chromium-dom", "--virtual-time-budget=5000", "--dump-dom", probed.as_uri()
    ).stdout
    shot = tmp / f"screenshot-{page.stem}.png"
    _run(binary, tmp / "chromium-shot", f"--screenshot={shot}", page.as_uri())
    start = dom.index('<pre id="probe">') + len('<pre id="probe">')
    raw = dom[start : dom.index("</pre>", start)]
    return Rendered(dom=dom, probe=json.loads(html.unescape(raw)), screenshot=shot)


def colours(png: Path) -> dict[tuple[int, int, int], int]:
    """How many pixels of each colour a screenshot holds."""
    from PIL import Image

    with Image.open(png) as image:
        counts = image.convert("RGB").getcolors(maxcolors=1 << 24) or []
    return {rgb: n for n, rgb in counts}


def near(counts: dict[tuple[int, int, int], int], hex_colour: str, tolerance: int = 24) -> int:
    """Pixels within `tolerance` (per channel) of a colour like `#C0392B`."""
    want = tuple(int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
    close = (
        rgb
        for rgb in counts
        if max(abs(a - b) for a, b in zip(rgb, want, strict=True)) <= tolerance
    )
    return sum(counts[rgb] for rgb in close)
