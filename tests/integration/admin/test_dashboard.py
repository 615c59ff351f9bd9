"""The dashboard in a real headless Chromium: its numbers match /stats, and redrive works.

Selenium's calls block, and the broker runs in this test's Trio loop, so every browser
step runs in a worker thread (`trio.to_thread.run_sync`) while the loop keeps serving.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from kiteq import Binding, Consumer, Message, Producer
from tests.helpers import registry_uri, running_broker, wait_until
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

# Non-background pixels drawn on a canvas: proof that a chart was drawn, not just sized.
INK = """
const canvas = document.getElementById(arguments[0]);
const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
let ink = 0;
for (let i = 3; i < data.length; i += 4) if (data[i] > 0) ink++;
return ink;
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
    stats = httpx.get(url + "/stats").json()

    def field(group: str, name: str) -> int:
        selector = f'#groups tr[data-group="{group}"] td[data-field="{name}"]'
        return int(float(driver.find_element(By.CSS_SELECTOR, selector).get_attribute("data-value")))

    def legend(chart: str, group: str) -> int:
        selector = f'#legend-{chart} li[data-series="{group}"]'
        return int(float(driver.find_element(By.CSS_SELECTOR, selector).get_attribute("data-value")))

    row = driver.find_element(By.CSS_SELECTOR, f'#dlq tr[data-message-id="{message_id}"]')
    return {
        "stats": stats,
        "groups": {
            group: {name: field(group, name) for name in ("connections", "inflight", "backlog", "acked")}
            for group in ("slow", "bad")
        },
        "legend": {chart: legend(chart, "slow") for chart in ("backlog", "inflight")},
        "ink": {
            chart: driver.execute_script(INK, f"chart-{chart}") for chart in ("rates", "backlog", "inflight")
        },
        "points": int(driver.find_element(By.ID, "chart-backlog").get_attribute("data-points")),
        "dead_total": int(driver.find_element(By.ID, "dead-total").get_attribute("data-value")),
        "tx_waiting": int(driver.find_element(By.ID, "tx-waiting").get_attribute("data-value")),
        "registry": driver.find_element(By.ID, "registry-state").get_attribute("data-connected"),
        "dead_reason": row.find_element(By.CSS_SELECTOR, 'td[data-field="reason"]').text,
        "status": driver.find_element(By.ID, "status").get_attribute("class"),
    }


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
            tmp_path, delivery=HOLD, tx={"tx_check_after": 0.0, "tx_scan_interval": 0.1}
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
        await orphan.aclose()
        await wait_until(lambda: broker.backscan.waiting == {"gone": 1}, what="a transaction waiting")
        url = f"http://{broker.admin_address}"

        shown = await trio.to_thread.run_sync(read_dashboard, chromium, url, poison)
        stats = shown["stats"]
        for group in ("slow", "bad"):
            expected = stats["groups"][group]
            assert shown["groups"][group] == {
                "connections": expected["connections"],
                "inflight": expected["inflight"],
                "backlog": expected["backlog"],
                "acked": expected["events"].get("acked", 0),
            }
        assert shown["groups"]["slow"]["inflight"] == 2 and shown["groups"]["slow"]["backlog"] == 5
        assert shown["groups"]["bad"]["acked"] == 3
        assert shown["legend"] == {"backlog": 5, "inflight": 2}
        assert all(ink > 0 for ink in shown["ink"].values()), shown["ink"]
        assert shown["points"] >= 3
        assert shown["dead_total"] == stats["dead_letters"]["total"] == 1
        assert shown["tx_waiting"] == sum(stats["tx"]["waiting_for_producer"].values()) == 1
        assert shown["dead_reason"] == "deliver-limit"
        assert shown["registry"] == "true" and shown["status"] != "error"

        poisoned.healed = True
        status = await trio.to_thread.run_sync(click_redrive, chromium, poison)
        assert status == f"redriven {poison}: 1 message(s)"
        await wait_until(lambda: poisoned.acked[poison] == 1, what="delivery after the redrive")
        assert (await broker.store.stats()).dead == 0
        held.release()
