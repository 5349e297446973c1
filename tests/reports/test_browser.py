"""The HTML report renders in a real headless browser with every image decoded (skipped without chromium)."""

import shutil
import subprocess
from pathlib import Path

import pytest

BROWSERS = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
CHECK = """<script>
window.addEventListener('load', () => {
  const imgs = [...document.images];
  const ok = imgs.filter(i => i.complete && i.naturalWidth > 0).length;
  const out = document.createElement('div');
  out.id = 'imgcheck';
  out.textContent = 'decoded ' + ok + '/' + imgs.length;
  document.body.appendChild(out);
});
</script>"""


def browser() -> str | None:
    return next((b for b in BROWSERS if Path(b).exists()), None) or shutil.which("chromium")


@pytest.mark.skipif(browser() is None, reason="no chromium installed (apt-get install -y chromium)")
def test_html_renders_with_every_image_decoded(full_html, tmp_path):
    html = full_html.read_text()
    n_images = html.count("<img ")
    assert n_images == 8  # time, memory, four Gantt charts, search, run  # time, memory, three Gantt charts, search
    page = tmp_path / "check.html"
    page.write_text(html.replace("</body>", CHECK + "\n</body>"))
    cmd = [browser(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
           "--virtual-time-budget=5000", "--dump-dom", page.as_uri()]
    dom = subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout
    assert f'<div id="imgcheck">decoded {n_images}/{n_images}</div>' in dom
