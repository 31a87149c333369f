"""Execute a generated notebook in a fresh kernel, and give its figures the static images a plain viewer shows.

Figures are interactive where the viewer can draw them and a PNG everywhere else, with no plotly.js inside the file
(4.8 MB a copy, inlined by plotly's default notebook renderer):

- a plotly figure is one output bundle: ``application/vnd.plotly.v1+json`` (the figure's JSON, which JupyterLab's
  plotly extension and VS Code draw interactively with their own plotly.js) and ``image/png`` (kaleido's drawing,
  through the Debian Chromium), which GitHub, nbviewer and any viewer without plotly's renderer show instead;
- the head explorer is HTML with its own small script and its data; a screenshot of it (headless Chromium) goes in
  front of it as an ``<img>`` that its script removes where scripts run, so a viewer that strips scripts shows the
  picture.

What is kept: stdout and displays. Stderr (warnings, progress bars) is dropped, and so are kernel timings and
execution metadata, so that regenerating unchanged cells changes only numbers that really changed.
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import platform
import re
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import nbformat
from nbclient import NotebookClient

PLOTLY_JSON = "application/vnd.plotly.v1+json"
EXPLORER_MARK = 'class="lhx"'  # the explorer's root element (lens_heads.viz.explorer_view.MARKUP)
STATIC_OPEN = '<div class="lh-static">'  # the explorer's picture for viewers that strip scripts
# removes the picture where scripts run (the live explorer follows it)
STATIC_CLOSE = "</div><script>document.currentScript.previousElementSibling.remove()</script>"
TIMEOUT_S = 1800  # per cell


@contextmanager
def _environment(**values: str):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def execute(nb: nbformat.NotebookNode, folder: str | Path) -> float:
    """Run ``nb`` top to bottom in a fresh python3 kernel with ``folder`` as its working directory (in place);
    the wall time in seconds. Plotly figures come out as their JSON alone (``PLOTLY_RENDERER``), the torch threads
    are the caller's ``OMP_NUM_THREADS``. Stderr outputs and execution metadata are dropped."""
    start = time.perf_counter()
    with _environment(PLOTLY_RENDERER="plotly_mimetype"):
        NotebookClient(nb, timeout=TIMEOUT_S, kernel_name="python3", record_timing=False,
                       resources={"metadata": {"path": str(folder)}}).execute()
    seconds = time.perf_counter() - start
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = _merged_streams([o for o in cell.outputs
                                            if not (o.output_type == "stream" and o.name == "stderr")])
            cell.metadata.pop("execution", None)
    return seconds


def _merged_streams(outputs: list) -> list:
    """Consecutive stdout outputs as one (how a kernel splits its prints depends on timing)."""
    merged: list = []
    for output in outputs:
        if merged and output.output_type == "stream" and merged[-1].output_type == "stream":
            merged[-1].text += output.text
        else:
            merged.append(output)
    return merged


def run_record(seconds: float) -> dict:
    """What the header's time line says: wall seconds, threads, CPU, date."""
    return {"seconds": round(seconds), "threads": int(os.environ.get("OMP_NUM_THREADS", "0")) or os.cpu_count(),
            "cpu": cpu_name(), "cores": os.cpu_count(), "load": round(os.getloadavg()[0], 1),
            "date": datetime.date.today().isoformat()}


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return re.sub(r"\s+", " ", line.split(":", 1)[1]).strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def time_line(record: dict) -> str:
    """The header's last line, rendered from the execution's record (never typed)."""
    minutes, seconds = divmod(int(record["seconds"]), 60)
    took = f"{minutes} min {seconds} s" if minutes else f"{seconds} s"
    threads = "one thread" if record["threads"] == 1 else f"{record['threads']} threads"
    return (f"*Runs top to bottom in {took} on {threads} of a {record['cores']}-core {record['cpu']} (the embedded "
            f"model already in the cache, load average {record['load']:g} as it finished; measured when this copy was "
            f"executed, {record['date']}).*")


def with_time_line(header: str, record: dict) -> str:
    return f"{header}\n\n{time_line(record)}"


def add_static_images(nb: nbformat.NotebookNode) -> None:
    """Give every plotly figure its PNG and every explorer its screenshot (module docstring), in place."""
    import plotly.io as pio

    from lens_heads.viz.export import png_bytes, png_writer

    with png_writer():  # one Chromium for every figure
        for output in _displays(nb):
            data = output["data"]
            if PLOTLY_JSON in data:
                fig = pio.from_json(json.dumps(data[PLOTLY_JSON]))
                data["image/png"] = base64.b64encode(png_bytes(fig)).decode()
    for output in _displays(nb):
        html = output["data"].get("text/html")
        if isinstance(html, list):
            html = "".join(html)
        if html and EXPLORER_MARK in html and STATIC_OPEN not in html:
            picture = base64.b64encode(screenshot(html)).decode()
            output["data"]["text/html"] = (f'{STATIC_OPEN}<img alt="the head explorer (a picture: its live view needs '
                                           f'JavaScript)" src="data:image/png;base64,{picture}">{STATIC_CLOSE}{html}')


def without_static_image(html: str) -> str:
    """An explorer output as the kernel wrote it (the picture :func:`add_static_images` put in front removed)."""
    if html.startswith(STATIC_OPEN):
        return html.split(STATIC_CLOSE, 1)[1]
    return html


def screenshot(html: str, *, width: int = 1100, height: int = 760) -> bytes:
    """A PNG of an HTML fragment as headless Chromium draws it, scripts run (no network: the page is a local file
    and the explorer requests nothing)."""
    from lens_heads.viz.export import check_png

    check_png()  # says what to install where Chromium is missing
    from choreographer.browsers.chromium import Chromium

    browser = Chromium.find_browser(skip_local=False)
    with tempfile.TemporaryDirectory() as tmp:
        page, png = Path(tmp) / "page.html", Path(tmp) / "shot.png"
        page.write_text(f'<!DOCTYPE html><html><head><meta charset="utf-8"></head><body style="margin:8px">{html}'
                        "</body></html>", encoding="utf-8")
        subprocess.run([str(browser), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        "--disable-dev-shm-usage", f"--user-data-dir={tmp}/profile", f"--screenshot={png}",
                        f"--window-size={width},{height}", "--virtual-time-budget=4000", page.as_uri()],
                       check=True, capture_output=True, timeout=120)
        return png.read_bytes()


def _displays(nb: nbformat.NotebookNode):
    for cell in nb.cells:
        if cell.cell_type == "code":
            for output in cell.outputs:
                if output.output_type in ("display_data", "execute_result"):
                    yield output
