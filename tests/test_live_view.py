"""The live denoising page (`/`) in a real headless browser: Debian's chromium and
chromium-driver, driven by Selenium, against a live server on the tiny model."""

import os
import shutil
from pathlib import Path
from urllib.parse import urlencode

import httpx
import pytest

import caidllm
from caidllm.serve.app import ServerConfig, create_app
from caidllm.serve.local import LocalServer
from caidllm.serve.protocol import ServerDefaults

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
PROMPT = "not ( True ) and ( True ) is"
ARTIFACTS = Path(os.environ.get("CAIDLLM_TEST_ARTIFACTS", Path(__file__).parent.parent / "test-artifacts"))

if not (CHROMIUM and DRIVER):
    if os.environ.get("CI"):
        raise RuntimeError("CI must have Debian's chromium and chromium-driver (.ci/run installs them)")
    pytest.skip(
        "needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)",
        allow_module_level=True,
    )

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


@pytest.fixture(scope="module")
def server():
    lm = caidllm.load("tiny", device="cpu", dtype="float32")
    defaults = ServerDefaults(model_name="tiny", gen_length=64, block_length=16, max_gen_length=512)
    with LocalServer(create_app(lm, ServerConfig(defaults=defaults))) as s:
        yield s


@pytest.fixture(scope="module")
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,800",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=options)
    yield driver
    driver.quit()


def lanes_settled(driver):
    lanes = driver.find_elements(By.CSS_SELECTOR, "section.lane")
    return (
        lanes
        if lanes and all(lane.get_attribute("data-state") in ("done", "error") for lane in lanes)
        else False
    )


def api_answer(url, method, gen_length, block_length):
    body = {
        "messages": [{"role": "user", "content": PROMPT}],
        "method": method,
        "gen_length": gen_length,
        **({"block_length": block_length} if block_length else {}),
    }
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120).json()
    return r["choices"][0]["message"]["content"], r["caidllm"]["nfe"]


def test_a_two_lane_race_finishes_like_the_api(server, browser):
    query = urlencode(
        {"prompt": PROMPT, "methods": "vanilla,cai", "gen_length": 64, "block_length": 16, "autorun": 1}
    )
    browser.get(f"{server.url}/?{query}")
    lanes = WebDriverWait(browser, 120).until(lanes_settled)
    assert [lane.get_attribute("data-method") for lane in lanes] == ["vanilla", "cai"]
    for lane in lanes:
        method = lane.get_attribute("data-method")
        assert lane.get_attribute("data-state") == "done", lane.text
        text, nfe = api_answer(server.url, method, 64, 16)
        assert lane.find_element(By.CSS_SELECTOR, '[data-role="answer"]').get_attribute("textContent") == text
        assert lane.find_element(By.CSS_SELECTOR, '[data-role="nfe"]').text == str(nfe)
        cells = lane.find_elements(By.CSS_SELECTOR, ".cell")
        # none left masked
        assert len(cells) == 64 and not lane.find_elements(By.CSS_SELECTOR, ".cell.masked")
        assert lane.find_elements(By.CSS_SELECTOR, "svg circle")  # the commit-step chart is drawn
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(ARTIFACTS / "live-view-race.png"))


def test_elastic_races_a_block_wise_method_at_the_pages_block_length(server, browser):
    """The page's block_length is the block-wise lanes': Elastic-Cache's official loop (one block of
    gen_length) is sent none, so the server does not refuse it, and its canvas is one block."""
    query = urlencode(
        {"prompt": PROMPT, "methods": "fastdllm,elastic", "gen_length": 32, "block_length": 16, "autorun": 1}
    )
    browser.get(f"{server.url}/?{query}")
    lanes = WebDriverWait(browser, 120).until(lanes_settled)
    for lane, block, blocks in zip(lanes, (16, None), (2, 1)):
        method = lane.get_attribute("data-method")
        assert lane.get_attribute("data-state") == "done", lane.text
        text, nfe = api_answer(server.url, method, 32, block)
        assert lane.find_element(By.CSS_SELECTOR, '[data-role="answer"]').get_attribute("textContent") == text
        assert len(lane.find_elements(By.CSS_SELECTOR, ".block")) == blocks


def test_a_bad_parameter_shows_the_server_error_in_the_lane(server, browser):
    query = urlencode(
        {"prompt": PROMPT, "methods": "turbo,cai", "gen_length": 40, "block_length": 16, "autorun": 1}
    )
    browser.get(f"{server.url}/?{query}")
    lanes = WebDriverWait(browser, 60).until(lanes_settled)
    for lane in lanes:
        assert lane.get_attribute("data-state") == "error"
    messages = [lane.find_element(By.CSS_SELECTOR, '[data-role="error"]').text for lane in lanes]
    assert "unknown method 'turbo'" in messages[0]
    assert "multiple of block_length" in messages[1]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "live-view-error.png"))


def test_the_page_is_readable_on_a_narrow_window(server, browser):
    browser.set_window_size(420, 900)
    try:
        query = {"prompt": PROMPT, "methods": "fastdllm", "gen_length": 32, "block_length": 16, "autorun": 1}
        browser.get(f"{server.url}/?{urlencode(query)}")
        (lane,) = WebDriverWait(browser, 60).until(lanes_settled)
        assert lane.get_attribute("data-state") == "done"
        width = browser.execute_script("return document.documentElement.scrollWidth")
        assert width <= 420  # no sideways scrolling
    finally:
        browser.set_window_size(1280, 800)


@pytest.fixture(scope="module")
def bd_server():
    """tiny-bd with the prefix store on: a prompt's second run takes its blocks from the store."""
    lm = caidllm.load("tiny-bd", device="cpu", dtype="float32")
    defaults = ServerDefaults(
        model_name="tiny-bd", method="llada2", gen_length=32, block_length=8, max_gen_length=128
    )
    with LocalServer(create_app(lm, ServerConfig(defaults=defaults, prefix_cache_mb=16))) as s:
        yield s


def test_the_prompts_blocks_from_the_prefix_cache_are_drawn_as_such(bd_server, browser):
    prompt = "Q: True and not False or ( False and True ) is"
    query = urlencode(
        {"prompt": prompt, "methods": "llada2", "gen_length": 32, "block_length": 8, "autorun": 1}
    )
    drawn = []
    for _ in range(2):  # the first run fills the store, the second takes from it
        browser.get(f"{bd_server.url}/?{query}")
        (lane,) = WebDriverWait(browser, 120).until(lanes_settled)
        assert lane.get_attribute("data-state") == "done", lane.text
        strip = lane.find_element(By.CSS_SELECTOR, '[data-role="prompt-blocks"]')
        drawn.append(
            (
                len(strip.find_elements(By.CSS_SELECTOR, ".tile.reused")),
                len(strip.find_elements(By.CSS_SELECTOR, ".tile.prefilled")),
                strip.find_element(By.CSS_SELECTOR, '[data-role="prompt-caption"]').text,
            )
        )
    (first_reused, first_prefilled, _), (reused, prefilled, caption) = drawn
    assert first_reused == 0 and reused > 0 and reused + prefilled == first_prefilled
    assert f"{8 * reused} of" in caption and "from the prefix cache" in caption
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "live-view-prefix-cache.png"))


@pytest.fixture(scope="module")
def dg_server():
    """A small random DiffusionGemma: its uniform-state decoders drawn from their draft stream."""
    from test_diffusion_gemma_serve import SMALL

    lm = caidllm.load(SMALL, device="cpu", dtype="float32")
    defaults = ServerDefaults(model_name="dg", gen_length=32, block_length=16, max_gen_length=128)
    with LocalServer(create_app(lm, ServerConfig(defaults=defaults))) as s:
        yield s


def test_the_uniform_decoders_canvases_converge_step_by_step(dg_server, browser):
    query = urlencode({"prompt": PROMPT, "methods": "greedy,diffusiongemma", "gen_length": 24, "autorun": 1})
    browser.get(f"{dg_server.url}/?{query}")
    lanes = WebDriverWait(browser, 120).until(lanes_settled)
    assert [lane.get_attribute("data-method") for lane in lanes] == ["greedy", "diffusiongemma"]
    for lane in lanes:
        assert lane.get_attribute("data-state") == "done", lane.text
        nfe = int(lane.find_element(By.CSS_SELECTOR, '[data-role="nfe"]').text)
        assert int(lane.get_attribute("data-draft-steps")) == nfe > 0  # every step's draft drawn
        cells = lane.find_elements(By.CSS_SELECTOR, ".cell")
        assert len(cells) == 24 and len(lane.find_elements(By.CSS_SELECTOR, ".block")) == 2  # canvases of 16
        assert not lane.find_elements(By.CSS_SELECTOR, ".cell.accepted, .cell.renoised, .cell.masked")
    text, nfe = api_answer(dg_server.url, "greedy", 24, None)  # greedy is seeded (0) without a seed
    greedy = lanes[0]
    assert greedy.find_element(By.CSS_SELECTOR, '[data-role="answer"]').get_attribute("textContent") == text
    assert greedy.find_element(By.CSS_SELECTOR, '[data-role="nfe"]').text == str(nfe)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "live-view-diffusiongemma.png"))
