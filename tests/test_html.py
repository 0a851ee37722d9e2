"""``python -m instrument html``: the page's data, its size, and the page in a real headless
Chromium (Debian's ``chromium`` + ``chromium-driver``, driven by selenium)."""

from __future__ import annotations

import base64
import dataclasses
import gzip
import itertools
import json
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

import instrument
from instrument import cli, html
from instrument.report import RankStats, Report
from instrument.sinks.jsonl import JSONL
from instrument.stats import Stats
from instrument.testing import FakeClock, use_clock

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
BASE = {"data": 0.002, "forward": {"embed": 0.001, "encoder": 0.006, "head": 0.002},
        "backward": 0.012, "optimizer": 0.003}  # fmt: skip
SLOW = {**BASE, "forward": {"embed": 0.001, "encoder": 0.008, "head": 0.002}}  # encoder +2 ms
WORLD = 4
SLOW_RANK = 2
FLUSH_COST = 0.001  # each flush's own time: 0.25 ms per step of the next report


def run(clock: FakeClock, regions: Mapping[str, Any]) -> None:
    for name, inner in regions.items():
        with instrument.timed(name):
            if isinstance(inner, Mapping):
                run(clock, inner)
            else:
                clock.advance(inner)


def write_run(path: Path, regions: Mapping[str, Any], reports: int = 6, steps: int = 4) -> None:
    """``reports`` intervals of ``steps`` steps; every step runs ``regions`` (nested dicts),
    then 0.5 ms outside any region. Interval k takes k·0.1 ms longer in ``backward``
    (some spread across reports, as a real run has). Each flush takes :data:`FLUSH_COST`,
    which the next report shows as its ``(instrument flush)`` line."""
    clock = FakeClock()
    with use_clock(clock):
        sinks = [JSONL(path), lambda _: clock.advance(FLUSH_COST)]
        reporter = instrument.Reporter(every=None, sinks=sinks, memory=False)
        for k in range(reports):
            for _ in range(steps):
                run(clock, {**regions, "backward": regions["backward"] + k * 1e-4})
                clock.advance(0.0005)
                instrument.step(samples=32)
            reporter.flush()
        reporter.close()


def with_ranks(path: Path, out: Path) -> None:
    """The run of ``path`` as if gathered with ``ranks="all"`` over :data:`WORLD` ranks,
    rank :data:`SLOW_RANK` 40 % slower in ``forward/encoder``, which also has device time
    (as on the "cuda" clock; the same as its host time)."""
    reports = [Report.from_dict(json.loads(line)) for line in path.read_text().splitlines()]
    sink = JSONL(out)
    for report in reports:
        nodes = []
        for node in report.nodes:
            slow = 1.4 if node.path == "forward/encoder" else 1.0
            values = tuple(node.total * (slow if r == SLOW_RANK else 1.0 + 0.01 * r)
                           for r in range(WORLD))  # fmt: skip
            ranks = RankStats(
                rank_min=min(values), rank_max=max(values), rank_mean=sum(values) / WORLD,
                rank_argmin=values.index(min(values)), rank_argmax=values.index(max(values)),
                ranks_present=WORLD, per_rank=values,
            )  # fmt: skip
            device = node.host if node.path == "forward/encoder" else None
            nodes.append(dataclasses.replace(node, ranks=ranks, device=device))
        sink.write(dataclasses.replace(report, nodes=tuple(nodes), ranks="all", world_size=1))


def unpack(page: str) -> dict[str, Any]:
    found = re.search(r'<script id="data" type="application/octet-stream">([^<]*)</script>', page)
    assert found is not None
    data: dict[str, Any] = json.loads(gzip.decompress(base64.b64decode(found.group(1))))
    return data


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    write_run(tmp_path / "base.jsonl", BASE)
    write_run(tmp_path / "slow.jsonl", SLOW)
    with_ranks(tmp_path / "slow.jsonl", tmp_path / "ranks.jsonl")
    return {name: tmp_path / f"{name}.jsonl" for name in ("base", "slow", "ranks")}


def make_page(
    capsys: pytest.CaptureFixture[str], run_file: Path, out: Path, *extra: str | Path
) -> dict[str, Any]:
    code = cli.main(["html", str(run_file), "-o", str(out), *map(str, extra)])
    stdout, stderr = capsys.readouterr()
    assert (code, stderr) == (0, ""), stderr
    assert stdout == f"wrote {out}\n"
    return unpack(out.read_text())


# -- the page's data ----------------------------------------------------------------------


def test_the_page_is_self_contained(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r.html"
    make_page(capsys, files["ranks"], out, "--base", files["base"])
    page = out.read_text()
    assert "<script src" not in page
    assert "<link" not in page
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", page)  # only the SVG namespace
    assert "default-src 'none'" in page  # the browser may fetch nothing either


def test_the_data_holds_every_interval_in_ms_per_step(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = make_page(capsys, files["slow"], tmp_path / "r.html")
    assert data["per"] == "step"
    paths = data["paths"]  # in the registry's order: parents before children
    assert set(paths) == {"data", "forward", "forward/embed", "forward/encoder", "forward/head",
                          "backward", "optimizer"}  # fmt: skip
    parents = {
        path: paths[i] if i >= 0 else "" for path, i in zip(paths, data["parents"], strict=True)
    }
    assert parents["forward/encoder"] == "forward"
    assert parents["data"] == ""
    assert len(data["intervals"]) == 6
    last = data["intervals"][-1]
    assert (last["s"], last["n"]) == (24, 4)
    assert last["st"] == pytest.approx(2 + 11 + 12.5 + 3 + 0.5 + 0.25)
    assert (last["o"], last["f"]) == pytest.approx((0.5, 0.25))  # (other), the flush line
    assert "f" not in data["intervals"][0]  # no flush before the first
    rows = {data["paths"][row[0]]: row for row in last["d"]}
    assert rows["forward"][1:3] == pytest.approx([11.0, 4])  # ms per step, calls
    assert len(rows["forward"]) == 6  # no device time, not open
    assert rows["forward/encoder"][1] == pytest.approx(8.0)
    assert last["tp"]["samples/s"] == pytest.approx(4 * 32 / (4 * 0.029 + FLUSH_COST))
    assert data["heat"] is None
    assert data["diff"] is None


def test_device_time_rides_along_with_host_time() -> None:
    from instrument import html
    from instrument.report import Node

    def stats(total: float) -> Stats:  # per step over 2 steps, 1 call per step
        return Stats(2, total, total, total, total, 0.0, total, total, total)

    gpu = Node(path="matmul", host=stats(0.001), device=stats(0.004), clock="cuda")
    cpu = Node(path="data", host=stats(0.002))
    report = Report(nodes=(gpu, cpu), steps=2, step_time=stats(0.010), normalizer="steps")
    data = html.page_data([report], title="t", run_name="r", rank=0)
    rows = {data["paths"][row[0]]: row for row in data["intervals"][0]["d"]}
    assert rows["matmul"] == pytest.approx([0, 4.0, 2, 4.0, 4.0, 4.0, 1.0, 4.0, 0])
    assert rows["data"] == pytest.approx([1, 2.0, 2, 2.0, 2.0, 2.0])


def test_a_call_split_over_intervals_keeps_its_own_mean() -> None:
    """A region that ended in this interval after starting in the last one: one call whose
    mean (its whole duration) is more than its time inside the interval."""
    from instrument import html
    from instrument.report import Node

    split = Node(path="epoch", host=Stats(1, 0.003, 0.010, 0.010, 0.010, 0.0, 0.01, 0.01, 0.01))
    report = Report(nodes=(split,), steps=1, step_time=Stats.empty(), normalizer="steps")
    row = html.page_data([report], title="t", run_name="r", rank=0)["intervals"][0]["d"][0]
    assert row == pytest.approx([0, 3.0, 1, 10.0, 10.0, 10.0, 3.0, None, 0, 10.0])


def test_the_heatmap_marks_the_slow_rank(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    heat = make_page(capsys, files["ranks"], tmp_path / "r.html")["heat"]
    assert heat["world"] == WORLD
    assert heat["mode"] == "all"
    assert [(s["p"], s["r"]) for s in heat["stragglers"]] == [("forward/encoder", SLOW_RANK)]
    assert heat["stragglers"][0]["pct"] == pytest.approx(
        100 * (1.4 / 1.02 - 1), abs=0.1
    )  # median of 1, 1.01, 1.03, 1.4


def _claiming(path: Path, out: Path, world: int, per_rank: int | None) -> list[Report]:
    """The reports of ``path`` with each node's values across ranks replaced: ``per_rank``
    ranks' values (rank 17 the slowest), or only a min and a max that name rank ``world - 1``
    (a claim no value backs)."""
    reports = [Report.from_dict(json.loads(line)) for line in path.read_text().splitlines()]
    changed = []
    for report in reports:
        nodes = []
        for node in report.nodes:
            if per_rank is None:
                values: tuple[float, ...] | None = None
                low, high, argmax = node.total, node.total * 2, world - 1
            else:
                values = tuple(node.total * (3.0 if r == 17 else 1.0) for r in range(per_rank))
                low, high, argmax = min(values), max(values), 17
            ranks = RankStats(
                rank_min=low, rank_max=high, rank_mean=(low + high) / 2, rank_argmin=0,
                rank_argmax=argmax, ranks_present=2, per_rank=values,
            )  # fmt: skip
            nodes.append(dataclasses.replace(node, ranks=ranks))
        changed.append(
            dataclasses.replace(report, nodes=tuple(nodes), ranks="all", world_size=world)
        )
    sink = JSONL(out)
    for report in changed:
        sink.write(report)
    sink.close()
    return changed


def test_a_claimed_rank_number_does_not_size_the_page(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A small file claiming rank 20,000,000 in a world of that size: two columns, the
    ranks that hold values, not a list (or an SVG cell) per claimed rank."""
    _claiming(files["base"], tmp_path / "claim.jsonl", 20_000_000, None)
    page = tmp_path / "claim.html"
    heat = make_page(capsys, tmp_path / "claim.jsonl", page)["heat"]
    assert heat["labels"] == ["0", "19999999"]
    assert page.stat().st_size < 200_000


def test_many_ranks_share_the_heatmap_s_columns(files: dict[str, Path], tmp_path: Path) -> None:
    reports = _claiming(files["base"], tmp_path / "many.jsonl", 300, 300)
    heat = html.heatmap(reports, ["forward"])
    assert heat is not None
    assert len(heat["labels"]) == 100  # 300 ranks, 3 a column
    assert heat["labels"][:2] == ["0-2", "3-5"]
    assert [(s["p"], s["r"]) for s in heat["stragglers"]] == [("forward", 17)]  # exact rank
    assert heat["rows"][0]["s"] == [5]  # its column, ranks 15-17


def test_a_file_named_like_the_page_s_placeholders_stays_a_name(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "{{DATA}}{{TITLE}}.jsonl"
    run.write_bytes(files["base"].read_bytes())
    out = tmp_path / "page.html"
    make_page(capsys, run, out)
    page = out.read_text()
    title = re.search("<title>(.*)</title>", page)
    assert title is not None
    assert "{{DATA}}{{TITLE}}.jsonl" in title.group(1)
    assert len(title.group(1)) < 100  # the data blob was not pasted into it


def test_stragglers_the_run_named_are_kept(files: dict[str, Path]) -> None:
    """Newer files carry ``report.stragglers``; older ones (and this version's Report) do
    not: the page reads the field when it is there."""
    from types import SimpleNamespace

    from instrument import html

    reports = [
        Report.from_dict(json.loads(line)) for line in files["ranks"].read_text().splitlines()
    ]
    assert html.heatmap(reports, ["forward"])["reported"] == []
    named = SimpleNamespace(rank=3, host="node7", regions=("backward",), scores=(0.6,), intervals=5)
    object.__setattr__(reports[-1], "stragglers", (named,))
    assert html.heatmap(reports, ["forward"])["reported"] == [
        {"r": 3, "host": "node7", "regions": ["backward"], "intervals": 5}
    ]


def test_the_diff_lists_the_slowed_region_first(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    diff = make_page(capsys, files["slow"], tmp_path / "r.html", "--base", files["base"])["diff"]
    rows = diff["rows"]
    assert rows[0]["p"] == "forward/encoder"  # its own time grew: before forward and (step)
    assert rows[0]["v"] == "slower"
    assert (rows[0]["a"], rows[0]["b"]) == pytest.approx((6.0, 8.0))
    assert rows[0]["lo"] == pytest.approx(100 * 2 / 6, abs=0.01)
    assert [r["p"] for r in rows if r["v"] == "slower"] == ["forward/encoder", "(step)", "forward"]
    assert {r["v"] for r in rows if r["p"] in ("backward", "data")} == {""}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_thousand_intervals_of_500_paths_stay_under_a_few_mb() -> None:
    """50 kinds of interval with varied times, cycled: repeats lie far outside gzip's window."""
    from instrument import html

    paths = [f"layers.{i // 25}/block.{i % 25}" if i % 25 else f"layers.{i // 25}"
             for i in range(500)]  # fmt: skip

    def stats(j: int, k: int) -> Stats:  # 3 calls in 10 steps, varied times
        total = 1e-3 * (1 + (7 * j + 13 * k) % 997 / 331)
        return Stats(3, total, total / 3, 2e-4, 5e-4, 1e-5, 3.1e-4 + k * 1e-6,
                     4.2e-4 + j * 1e-7, 4.9e-4)  # fmt: skip

    kinds = [
        tuple(instrument.report.Node(path=p, host=stats(j, k)) for j, p in enumerate(paths))
        for k in range(50)
    ]
    reports = [
        Report(nodes=kinds[k % 50], steps=10, step_time=Stats.empty(), index=k, step=10 * k)
        for k in range(1000)
    ]
    data = html.page_data(reports, title="big", run_name="big.jsonl", rank=0)
    assert data["parents"][:3] == [-1, 0, 0]
    assert len(data["intervals"]) == 1000
    assert len(data["paths"]) == 500
    page = html.render(data)
    assert len(page.encode()) < 4 * 2**20, len(page.encode())


def test_bad_output_and_missing_base_are_named(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["html", str(files["slow"]), "-o", str(tmp_path / "nope" / "r.html")])
    assert code == 2
    assert "r.html: cannot write the report" in capsys.readouterr().err
    code = cli.main(["html", str(files["slow"]), "-o", "x.html", "--base", str(tmp_path / "b")])
    assert code == 2
    assert "no such file" in capsys.readouterr().err


def test_the_page_names_files_by_their_base_name(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = make_page(capsys, files["slow"], tmp_path / "r.html", "--base", files["base"])
    assert data["run"] == "slow.jsonl"
    assert (data["diff"]["a"], data["diff"]["b"]) == ("base.jsonl", "slow.jsonl")
    assert str(tmp_path) not in (tmp_path / "r.html").read_text()


def test_two_files_of_one_name_are_told_apart_by_their_folder() -> None:
    from instrument import html

    assert html.file_label("/x/a/run.jsonl", "/x/b/run.jsonl") == "a/run.jsonl"
    assert html.file_label("/x/a/run.jsonl", "/x/b/base.jsonl") == "run.jsonl"
    assert html.file_label("run.jsonl") == "run.jsonl"


# -- the page in a real browser -----------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Debian Chromium through selenium; skipped (saying why) when it cannot start."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
    from selenium.webdriver.chrome.service import Service

    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        pytest.skip(f"no browser: install Debian's chromium and chromium-driver ({CHROMIUM})")
    profile = tempfile.mkdtemp(prefix="instrument-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 f"--user-data-dir={profile}", "--window-size=1200,1750"):  # fmt: skip
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    try:
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    except Exception as exc:  # the browser cannot start here: say so, do not fail
        shutil.rmtree(profile, ignore_errors=True)
        pytest.skip(f"headless Chromium could not start: {exc}")
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def open_page(driver: Any, page: Path) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get_log("browser")  # drop what earlier pages logged
    driver.get_log("performance")
    driver.get(page.as_uri())
    WebDriverWait(driver, 20).until(
        lambda d: (
            d.execute_script("return document.body.dataset.ready === '1'")
            or d.execute_script("return document.getElementById('summary').className === 'error'")
        )
    )


# Chromium's own pages and resources (chrome://..., an icon of its UI) and inline data:
# URLs (a 1x1 gif Chromium itself sometimes asks for) never leave the browser; everything
# else the page could fetch (http, https, ws, file, ...) counts.
INTERNAL_SCHEMES = (
    "chrome:",
    "chrome-extension:",
    "chrome-untrusted:",
    "devtools:",
    "about:",
    "data:",
)


def requests_made(driver: Any) -> list[str]:
    """Every request the browser sent for the page, Chromium's internal resources aside."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            url = message["params"]["request"]["url"]
            if not url.startswith(INTERNAL_SCHEMES):
                urls.append(url)
    return urls


def shown_paths(driver: Any) -> set[str]:
    from selenium.webdriver.common.by import By

    return {
        g.get_attribute("data-path")
        for g in driver.find_elements(By.CSS_SELECTOR, "#icicle g.node")
    }


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_page_in_chromium(
    browser: Any, files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from selenium.webdriver.common.by import By

    page = tmp_path / "report.html"
    make_page(capsys, files["ranks"], page, "--base", files["base"])
    open_page(browser, page)
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []
    assert browser.find_element(By.ID, "summary").get_attribute("class") != "error"
    assert requests_made(browser) == [page.as_uri()]  # the page itself, nothing else
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0

    # the run's verdict on top, as `instrument summary` says it
    from instrument.diagnosis.saved import summarize

    verdict = summarize([files["ranks"]]).verdict
    assert verdict is not None
    assert browser.find_element(By.ID, "verdict-section").is_displayed()
    headline = browser.find_element(By.CSS_SELECTOR, "#verdict .headline").text
    assert headline.startswith(f"{verdict.kind.replace('_', '-').upper()} ({verdict.severity})")
    assert browser.find_element(By.CSS_SELECTOR, "#verdict .next").text == f"next: {verdict.next}"

    # the tree shows the run's regions
    shown = {
        g.get_attribute("data-path")
        for g in browser.find_elements(By.CSS_SELECTOR, "#icicle g.node")
    }
    assert {"data", "forward", "forward/encoder", "forward/head", "backward", "optimizer",
            "(instrument flush)", "(other)"} <= shown  # fmt: skip
    fills = {
        path: browser.execute_script(
            "return getComputedStyle(document.querySelector("
            f"'#icicle g.node[data-path=\"{path}\"] rect')).fill"
        )
        for path in ("(instrument flush)", "(other)")
    }
    assert fills == {"(instrument flush)": "rgb(184, 170, 142)", "(other)": "rgb(228, 231, 236)"}
    top_row = browser.execute_script(
        "return [...document.querySelectorAll('#icicle g.node')]"
        ".filter((g) => !g.dataset.path.includes('/') && g.dataset.path !== '(root)')"
        ".map((g) => [g.dataset.path, g.getBoundingClientRect().x])"
    )
    left_to_right = [path for path, _ in sorted(top_row, key=lambda item: item[1])]
    assert left_to_right[-2:] == ["(instrument flush)", "(other)"]  # as in the text tree
    labels = browser.find_element(By.ID, "icicle").text
    assert "encoder" in labels
    assert "backward" in labels

    # click a node: it zooms to it
    width = float(browser.find_element(By.ID, "icicle").get_dom_attribute("viewBox").split()[2])
    browser.find_element(By.CSS_SELECTOR, '#icicle g.node[data-path="forward"] rect').click()
    focus = browser.find_element(By.CSS_SELECTOR, "#icicle g.node.focus")
    assert focus.get_attribute("data-path") == "forward"
    assert float(focus.find_element(By.TAG_NAME, "rect").get_dom_attribute("width")) == width
    shown = {
        g.get_attribute("data-path")
        for g in browser.find_elements(By.CSS_SELECTOR, "#icicle g.node")
    }
    assert "backward" not in shown
    assert "forward/encoder" in shown
    assert browser.find_element(By.ID, "crumb").text == "zoomed into forward"
    encoder = browser.find_element(
        By.CSS_SELECTOR, '#icicle g.node[data-path="forward/encoder"] rect'
    )
    assert float(encoder.get_dom_attribute("width")) == pytest.approx(width * 8 / 11, rel=1e-3)

    # hover: the statistics
    from selenium.webdriver.common.action_chains import ActionChains

    ActionChains(browser).move_to_element(encoder).perform()
    tip = browser.find_element(By.ID, "tip").text
    assert "forward/encoder" in tip
    for label in ("calls", "mean", "p50", "p90", "p99", "self", "host per step",
                  "device per step"):  # fmt: skip
        assert label in tip

    # the diff lists the slowed region first; the heatmap marks the slow rank
    first = browser.find_element(By.CSS_SELECTOR, "#diff-table tbody tr")
    assert first.get_attribute("data-path") == "forward/encoder"
    assert first.get_attribute("class") == "slower"
    marked = browser.find_elements(By.CSS_SELECTOR, "#heatmap g.cell.straggler")
    assert [(g.get_attribute("data-path"), g.get_attribute("data-rank")) for g in marked] == [
        ("forward/encoder", str(SLOW_RANK))
    ]
    assert (
        f"rank {SLOW_RANK} in forward/encoder" in browser.find_element(By.ID, "straggler-list").text
    )

    # back out, then a picture
    browser.find_element(By.ID, "unzoom").click()
    assert browser.find_element(By.ID, "crumb").text == ""
    ActionChains(browser).move_by_offset(0, 0).perform()
    browser.execute_script("document.getElementById('tip').hidden = true")
    browser.save_screenshot(str(tmp_path / "report.png"))
    assert (tmp_path / "report.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_tree_deeper_than_the_browsers_stack_is_drawn(
    browser: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from contextlib import ExitStack

    depth = 4000  # recursive walks overflow Chromium's stack at a few thousand levels
    clock = FakeClock()
    run_file = tmp_path / "deep.jsonl"
    instrument.configure(max_depth=depth)  # (the autouse reset puts the cap back)
    with use_clock(clock):
        reporter = instrument.Reporter(every=None, sinks=[JSONL(run_file)], memory=False)
        with ExitStack() as stack:
            for _ in range(depth):
                stack.enter_context(instrument.timed("l"))
                clock.advance(1e-6)
        instrument.step()
        reporter.flush()
        reporter.close()
    page = tmp_path / "deep.html"
    make_page(capsys, run_file, page)
    open_page(browser, page)
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []
    assert browser.execute_script("return document.body.dataset.ready") == "1"
    deepest = "/".join(["l"] * depth)
    assert deepest in shown_paths(browser)


def test_numbers_too_large_for_json_are_left_out_not_a_crash(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A percentile or an MFU of 1e308 s is finite, but not in ms or in %: the page leaves
    those values out (a case of the CLI fuzz test)."""
    huge = tmp_path / "huge.jsonl"
    lines = []
    for line in files["base"].read_text().splitlines():
        data = json.loads(line)
        data["nodes"][0]["host"]["p50"] = 1e308
        data["throughput"]["mfu"] = 1e308
        lines.append(json.dumps(data))
    huge.write_text("\n".join(lines) + "\n")
    page = make_page(capsys, huge, tmp_path / "huge.html")
    json.dumps(page, allow_nan=False)  # raises on an infinity or a NaN anywhere in the page
    assert all(interval["tp"]["MFU %"] is None for interval in page["intervals"])


# regions named up to 40 characters, one of them under 1 % of the step
LONG = {
    "data": 0.0002,
    "a_forward_pass_region_named_in_forty_chr": {
        "embedding_lookup_for_the_token_ids_here_": 0.008,
        "encoder": 0.004,
        "head": 0.002,
    },
    "backward": 0.012,
    "optimizer": 0.003,
}


def icicle_nodes(driver: Any) -> list[dict[str, Any]]:
    """Every bar of the icicle: path, row, x, width, fill, label, and the widths of its
    full name and of its shortest cut label (measured by the browser)."""
    result: list[dict[str, Any]] = driver.execute_script(
        r"""
        const svg = document.getElementById("icicle");
        const probe = document.createElementNS("http://www.w3.org/2000/svg", "text");
        svg.appendChild(probe);
        const out = [...svg.querySelectorAll("g.node")].map((g) => {
          const rect = g.querySelector("rect"), text = g.querySelector("text");
          const path = g.dataset.path, name = path.slice(path.lastIndexOf("/") + 1);
          probe.textContent = name;
          const nameWidth = probe.getComputedTextLength();
          probe.textContent = name[0] + "…";
          const m = /translate\(([^,]+),([^)]+)\)/.exec(g.getAttribute("transform"));
          return { path, x: Number(m[1]), row: Number(m[2]),
                   width: Number(rect.getAttribute("width")), fill: getComputedStyle(rect).fill,
                   label: text ? text.textContent : null,
                   labelWidth: text ? text.getComputedTextLength() : 0, nameWidth,
                   shortest: probe.getComputedTextLength(), aria: g.getAttribute("aria-label"),
                   cls: g.getAttribute("class") };
        });
        probe.remove();
        return out;
        """
    )
    return result


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_labels_colours_search_and_the_small_regions_switch_in_chromium(
    browser: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from selenium.webdriver.common.by import By

    assert (
        max(len(name) for name in [*LONG, *LONG["a_forward_pass_region_named_in_forty_chr"]]) == 40
    )
    write_run(tmp_path / "long.jsonl", LONG)
    page = tmp_path / "long.html"
    make_page(capsys, tmp_path / "long.jsonl", page)
    open_page(browser, page)
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []

    # labels: the whole name where it fits, cut with "…" only where it does not, and
    # never wider than the bar; the full path is on the bar
    nodes = [n for n in icicle_nodes(browser) if n["path"] != "(root)"]
    by_path = {n["path"]: n for n in nodes}
    forward = "a_forward_pass_region_named_in_forty_chr"
    embed = f"{forward}/embedding_lookup_for_the_token_ids_here_"
    for name in (forward, "backward", "optimizer", embed):
        label = by_path[name]["label"]
        assert label is not None
        assert label.startswith(name.rpartition("/")[2]), (name, label)
    for node in nodes:
        assert node["aria"] == node["path"]
        if node["label"]:
            assert node["labelWidth"] <= node["width"] - 4, node
            cut = node["label"].endswith("…")
            assert cut == (node["nameWidth"] > node["width"] - 8), node
        else:
            assert node["shortest"] > node["width"] - 8, node  # only a sliver goes unlabelled

    # colours: bars side by side differ, and so does a bar from the one above it
    rows: dict[float, list[dict[str, Any]]] = {}
    for node in nodes:
        rows.setdefault(node["row"], []).append(node)
    for row in rows.values():
        row.sort(key=lambda n: n["x"])
        for left, right in itertools.pairwise(row):
            assert left["fill"] != right["fill"], (left["path"], right["path"])
    for node in nodes:
        parent = by_path.get(node["path"].rpartition("/")[0])
        if parent is not None:
            assert node["fill"] != parent["fill"], node["path"]

    # search: the matching bars are marked, the others faded, and counted
    search = browser.find_element(By.ID, "search")
    search.send_keys("EMBEDDING")
    marked = {n["path"]: n["cls"] for n in icicle_nodes(browser) if n["path"] != "(root)"}
    assert "match" in marked.pop(embed).split()
    assert all("dim" in cls.split() for cls in marked.values())
    assert browser.find_element(By.ID, "search-count").text == "1 region"
    search.clear()
    search.send_keys(" ")  # an input event with an empty query
    assert not any("dim" in n["cls"] or "match" in n["cls"] for n in icicle_nodes(browser))

    # hide regions under 1 % of the step: data (0.2 ms of 31.7 ms) goes and comes back
    assert "data" in shown_paths(browser)
    switch = browser.find_element(By.ID, "hide-small")
    switch.click()
    assert "data" not in shown_paths(browser)
    assert "backward" in shown_paths(browser)
    switch.click()
    assert "data" in shown_paths(browser)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_timeline_and_the_diff_noise_in_chromium(
    browser: Any, files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from selenium.webdriver.common.by import By

    page = tmp_path / "report.html"
    data = make_page(capsys, files["ranks"], page, "--base", files["base"])
    open_page(browser, page)
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []

    # the timeline: the step time, one point per report, the top-level regions stacked
    def timeline() -> tuple[str, int, set[str]]:
        chart = browser.find_element(By.CSS_SELECTOR, "#timeline .chart")
        points = chart.find_elements(By.CSS_SELECTOR, "circle.point")
        areas = {
            a.get_attribute("data-series")
            for a in chart.find_elements(By.CSS_SELECTOR, "path[fill-opacity]")
        }
        return chart.find_element(By.TAG_NAME, "h3").text, len(points), areas

    title, points, areas = timeline()
    assert title == "time per step (ms)"
    assert points == len(data["intervals"]) == 6
    assert {"forward", "backward", "optimizer", "data", "(instrument flush)"} <= areas
    # zoomed into forward, it shows forward's parts
    browser.find_element(By.CSS_SELECTOR, '#icicle g.node[data-path="forward"] rect').click()
    title, points, areas = timeline()
    assert (title, points) == ("time per step in forward (ms)", 6)
    assert {"forward/embed", "forward/encoder", "forward/head"} <= areas
    # a point picks that interval for the tree
    browser.execute_script(
        "const chart = document.querySelector('#timeline .chart');"
        "const p = chart.querySelectorAll('circle.point')[1].getBoundingClientRect();"
        "chart.querySelector('rect[fill=transparent]').dispatchEvent(new MouseEvent('click',"
        " {clientX: p.x + p.width / 2, clientY: p.y, bubbles: true}));"
    )
    assert browser.find_element(By.ID, "interval").get_attribute("value") == "1"

    # the diff: only the regions that changed beyond the noise, the rest behind a toggle
    def diff_rows() -> list[str]:
        return [
            tr.get_attribute("data-path")
            for tr in browser.find_elements(By.CSS_SELECTOR, "#diff-table tbody tr")
        ]

    changed = [row["p"] for row in data["diff"]["rows"] if row["v"]]
    assert diff_rows() == changed == ["forward/encoder", "(step)", "forward"]
    toggle = browser.find_element(By.ID, "show-noise")
    assert (
        f"show the {len(data['diff']['rows']) - 3} rows"
        in browser.find_element(By.CSS_SELECTOR, ".diff-controls").text
    )
    toggle.click()
    assert diff_rows() == [row["p"] for row in data["diff"]["rows"]]
    browser.find_element(By.ID, "search").send_keys("encoder")
    marked = {
        tr.get_attribute("data-path"): tr.get_attribute("class")
        for tr in browser.find_elements(By.CSS_SELECTOR, "#diff-table tbody tr")
    }
    assert marked.pop("forward/encoder") == "slower match"
    assert all(cls.endswith(" dim") for cls in marked.values())
    assert (
        browser.find_element(By.CSS_SELECTOR, '#heatmap text[data-path="forward"]').get_attribute(
            "class"
        )
        == "dim"
    )
    browser.find_element(By.ID, "show-noise").click()
    assert diff_rows() == ["forward/encoder", "(step)", "forward"]
