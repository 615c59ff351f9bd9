"""The dashboard in a real headless Chromium: its numbers match /stats, charts have a time axis
and no first-sample spike, a dead letter opens its trace, and redrive works.

Selenium's calls block, and the broker runs in this test's Trio loop, so every browser
step runs in a worker thread (`trio.to_thread.run_sync`) while the loop keeps serving.
"""

from __future__ import annotations

import re
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from kiteq import Binding, Consumer, Message, Producer
from protocol.schedule import DELIVER_AT, format_deliver_at
from tests.helpers import RecordingListener, registry_uri, running_broker, wait_until
from tests.integration.admin.workload import HOLD, HeldListener, PoisonListener
from tests.services.ports import require_service
from tests.wire import RawPeer, header

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
# Without the background-networking flags Chromium keeps dialling Google's hosts, which
# this closed network refuses; a fresh profile keeps runs independent.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1000",
)
WAIT = 15.0

pytestmark = pytest.mark.slow


# What the page shows, read from the DOM in one go (tables keyed by their rows' data-* keys).
PAGE_JS = """
const messageId = arguments[0];
const value = (selector) => document.querySelector(selector).dataset.value;
function rows(table, ...keys) {
  const out = {};
  for (const tr of document.querySelectorAll(`#${table} tbody tr`)) {
    const cells = {};
    for (const td of tr.querySelectorAll("td[data-field]")) cells[td.dataset.field] = td.dataset.value;
    out[keys.map((key) => tr.dataset[key]).join("/")] = cells;
  }
  return out;
}
const dead = document.querySelector(`#dlq tr[data-message-id="${messageId}"]`);
return {
  groups: rows("groups", "group"),
  topics: rows("topics", "topic"),
  connections: rows("connections", "group"),
  latency: rows("latency", "kind", "group"),
  multiples: [...document.querySelectorAll("#group-multiples figure")].map((f) => f.dataset.group),
  slow_backlog: value('#group-multiples figure[data-group="slow"] li[data-series="backlog"]'),
  dead_total: Number(value("#dead-total")),
  scheduled_total: Number(value("#scheduled-total")),
  tx_waiting: Number(value("#tx-waiting")),
  registry: document.getElementById("registry-state").dataset.connected,
  dead_reason: dead.querySelector('td[data-field="reason"]').textContent,
  status: document.getElementById("status").className,
};
"""


@pytest.fixture
def chromium(tmp_path: Path) -> Any:
    available = shutil.which(CHROMIUM) is not None and shutil.which(CHROMEDRIVER) is not None
    require_service(available, "Debian's chromium and chromium-driver")
    webdriver = pytest.importorskip("selenium.webdriver")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(flag)
    # A driver path given here keeps Selenium Manager (which downloads drivers) out of it.
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(WAIT)
    yield driver
    driver.quit()


def read_dashboard(driver: Any, url: str, message_id: str) -> dict[str, Any]:
    """Load the page, wait for a few polls, and collect what it shows next to /stats."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url + "/")
    wait = WebDriverWait(driver, WAIT)
    wait.until(lambda d: int(d.find_element(By.TAG_NAME, "body").get_attribute("data-polls")) >= 3)
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, f'#dlq tr[data-message-id="{message_id}"]'))
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, '#group-multiples figure[data-group="slow"]'))
    stats = httpx.get(url + "/stats").json()
    # One script reads the whole page at once: the tables are redrawn every poll.
    return {"stats": stats, **driver.execute_script(PAGE_JS, message_id)}


def open_message(driver: Any, message_id: str) -> dict[str, Any]:
    """Click a dead letter's id; what the detail view shows once it has loaded or failed."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.find_element(By.CSS_SELECTOR, f'#dlq a.message-link[data-message-id="{message_id}"]').click()
    dialog = driver.find_element(By.ID, "message-detail")
    WebDriverWait(driver, WAIT).until(lambda d: dialog.get_attribute("data-state") in ("loaded", "error"))
    shown = {
        "open": dialog.get_attribute("open") is not None,
        "state": dialog.get_attribute("data-state"),
        "id": driver.find_element(By.ID, "message-detail-id").text,
        "error": driver.find_element(By.ID, "message-detail-error").text,
        "fields": [dt.text for dt in dialog.find_elements(By.CSS_SELECTOR, "#message-detail-fields dt")],
    }
    dialog.find_element(By.CSS_SELECTOR, "button.close").click()
    WebDriverWait(driver, WAIT).until(lambda d: dialog.get_attribute("open") is None)
    return shown


def click_redrive(driver: Any, message_id: str) -> str:
    """Press the row's button; return the status line once the row has left the table."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.find_element(By.CSS_SELECTOR, f'button.redrive[data-message-id="{message_id}"]').click()
    wait = WebDriverWait(driver, WAIT)
    wait.until(lambda d: d.find_element(By.ID, "dlq-status").get_attribute("data-redriven") == "1")
    wait.until(lambda d: not d.find_elements(By.CSS_SELECTOR, f'#dlq tr[data-message-id="{message_id}"]'))
    return driver.find_element(By.ID, "dlq-status").text


async def test_dashboard_shows_stats_and_redrives_a_dead_letter(tmp_path: Path, chromium: Any) -> None:
    registry = registry_uri(tmp_path)
    held, poisoned = HeldListener(), PoisonListener()
    async with (
        running_broker(
            tmp_path,
            delivery=HOLD,
            tx={"tx_check_after": 0.0, "tx_scan_interval": 0.1},
            server={"topics": ["later"]},
        ) as broker,
        Consumer(registry, group="slow", bindings=[Binding.direct("t", "x", watermark=2)], listener=held),
        Consumer(registry, group="bad", bindings=[Binding.direct("p", "x")], listener=poisoned),
        Producer(registry, group="p", topics=["t", "p"]) as producer,
    ):
        await wait_until(lambda: len(broker.router.bindings) == 2)
        await producer.send_many([Message("t", "x", b"m") for _ in range(5)])
        await producer.send_many([Message("p", "x", b"fine") for _ in range(3)])
        poison = await producer.send(Message("p", "x", b"poison", deliver_limit=2))
        await wait_until(lambda: held.received == 2, what="two held deliveries")
        await wait_until(lambda: broker.events.total("dead_lettered") == 1, what="the dead letter")
        orphan = await RawPeer.login(broker.address, "gone")  # leaves a transaction nobody can answer
        assert (await orphan.produce(header("gone", topic="t", commit=False))).status
        reminder = header("gone", topic="later")  # a delayed message, due in an hour
        reminder.properties.add(key=DELIVER_AT, value=format_deliver_at(time.time() + 3600))
        assert (await orphan.produce(reminder)).status
        await orphan.aclose()
        await wait_until(lambda: broker.backscan.waiting == {"gone": 1}, what="a transaction waiting")
        url = f"http://{broker.admin_address}"

        shown = await trio.to_thread.run_sync(read_dashboard, chromium, url, poison)
        stats = shown["stats"]
        for group in ("slow", "bad"):
            expected = stats["groups"][group]
            assert {
                key: shown["groups"][group][key] for key in ("connections", "inflight", "backlog", "acked")
            } == {
                "connections": str(expected["connections"]),
                "inflight": str(expected["inflight"]),
                "backlog": str(expected["backlog"]),
                "acked": str(expected["events"].get("acked", 0)),
            }
        assert shown["groups"]["slow"]["inflight"] == "2" and shown["groups"]["slow"]["backlog"] == "5"
        assert shown["groups"]["bad"]["acked"] == "3"
        for topic, expected in stats["topics"].items():
            assert {key: shown["topics"][topic][key] for key in ("backlog", "inflight", "stored")} == {
                "backlog": str(expected["backlog"]),
                "inflight": str(expected["inflight"]),
                "stored": str(expected["events"].get("stored", 0)),
            }
        assert shown["topics"]["t"]["backlog"] == "5" and shown["topics"]["p"]["stored"] == "4"
        assert shown["connections"] == {
            group: {"connections": str(n)} for group, n in stats["connections"]["by_group"].items()
        }
        assert {"slow", "bad", "p"} <= set(shown["connections"])
        bad = shown["latency"]["end_to_end/bad"]
        assert bad["cumulative_count"] == "3", "three acks of group bad"
        assert float(bad["cumulative_p50"]) > 0 and float(bad["cumulative_p99"]) >= float(
            bad["cumulative_p50"]
        )
        assert "end_to_end/slow" not in shown["latency"], "slow has acked nothing yet"
        assert int(shown["latency"]["store/"]["cumulative_count"]) >= 9
        multiples = shown["multiples"]  # one small chart per group: no two lines share one
        assert {"bad", "slow", "p"} <= set(multiples) and multiples == sorted(set(multiples))
        assert shown["slow_backlog"] == "5"
        assert shown["dead_total"] == stats["dead_letters"]["total"] == 1
        assert shown["scheduled_total"] == stats["scheduled"]["total"] == 1
        assert shown["tx_waiting"] == sum(stats["tx"]["waiting_for_producer"].values()) == 1
        assert shown["dead_reason"] == "deliver-limit"
        assert shown["registry"] == "true" and shown["status"] != "error"

        detail = await trio.to_thread.run_sync(open_message, chromium, poison)
        async with httpx.AsyncClient(base_url=url) as admin:
            trace = await admin.get(f"/messages/{poison}")
        assert detail["open"] and detail["id"] == poison
        if trace.status_code == 200:
            assert detail["state"] == "loaded" and detail["fields"] == list(trace.json())
        else:  # the route answers an error: the view shows its text, not an empty page
            assert detail["state"] == "error" and trace.json()["error"] in detail["error"]

        poisoned.healed = True
        status = await trio.to_thread.run_sync(click_redrive, chromium, poison)
        assert status == f"redriven {poison}: 1 message(s)"
        await wait_until(lambda: poisoned.acked[poison] == 1, what="delivery after the redrive")
        assert (await broker.store.stats()).dead == 0
        held.release()


def read_charts(driver: Any, url: str, samples: int) -> dict[str, Any]:
    """Load the page once the broker has `samples` samples; the overview chart as drawn."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url + "/")
    wait = WebDriverWait(driver, WAIT)
    wait.until(lambda d: int(d.find_element(By.TAG_NAME, "body").get_attribute("data-samples")) >= samples)
    chart = driver.find_element(By.ID, "chart-rates")
    ticks = chart.find_elements(By.CSS_SELECTOR, "text.tick-x")
    stored = chart.find_element(By.CSS_SELECTOR, 'path[data-series="stored"]').get_attribute("data-values")
    history = httpx.get(url + "/stats/history").json()
    return {
        "history": history,
        "since": httpx.get(url + "/stats/history", params={"since": history[-2]["t"]}).json(),
        "bad_since": httpx.get(url + "/stats/history", params={"since": "yesterday"}),
        "points": int(chart.get_attribute("data-points")),
        "labels": [tick.text for tick in ticks],
        "label_times": [float(tick.get_attribute("data-t")) for tick in ticks],
        "stored": [float(v) for v in stored.split(",")],
        "stored_rate": driver.find_element(By.ID, "stored-rate").get_attribute("data-value"),
    }


async def test_charts_have_a_time_axis_and_no_first_sample_spike(tmp_path: Path, chromium: Any) -> None:
    registry = registry_uri(tmp_path)
    listener = RecordingListener()
    async with (
        running_broker(tmp_path, server={"history_interval": 0.5}) as broker,
        Consumer(registry, group="g", bindings=[Binding.direct("t", "x")], listener=listener),
        Producer(registry, group="p", topics=["t"]) as producer,
        trio.open_nursery() as traffic,
    ):
        await wait_until(lambda: len(broker.router.bindings) == 1)

        async def steady() -> None:  # about 100 messages a second, as long as the test runs
            while True:
                await producer.send_many([Message("t", "x", b"m") for _ in range(10)])
                await trio.sleep(0.1)

        traffic.start_soon(steady)
        # Traffic ran for seconds before the page opens: a rate from the page's first poll
        # (or from the broker's start) would be all of it at once.
        await wait_until(lambda: len(broker.history.samples) >= 8, timeout=WAIT, what="eight samples")
        shown = await trio.to_thread.run_sync(read_charts, chromium, f"http://{broker.admin_address}", 8)
        traffic.cancel_scope.cancel()

    history = shown["history"]
    first, last = history[0]["t"], history[-1]["t"]
    assert history[0]["rates"] is None, "the broker's first sample has no rate"
    assert shown["since"][0] == history[-1], "only the samples after `since`"
    assert shown["bad_since"].status_code == 400 and "since" in shown["bad_since"].json()["error"]
    assert shown["points"] >= 8
    assert len(shown["labels"]) >= 2 and all(
        re.fullmatch(r"\d\d:\d\d:\d\d", label) for label in shown["labels"]
    )
    assert shown["label_times"] == sorted(shown["label_times"])
    assert all(first <= t <= last + 1 for t in shown["label_times"]), (first, shown["label_times"], last)
    stored = shown["stored"]
    assert len(stored) == shown["points"] - 1, "every sample but the first is plotted"
    steady_rate = statistics.median(stored[1:])
    assert steady_rate > 20, stored
    assert stored[0] <= 3 * steady_rate, f"a spike on the first plotted rate: {stored}"
    assert float(shown["stored_rate"]) > 0
