// Drives JupyterLab in headless Chromium: opens the prepared 01_seams notebook, runs all cells,
// presses Run in the seams panel and screenshots the live loss curves. Called by
// bench/browser_check.sh, which starts JupyterLab and sets the environment below.
import { chromium } from "playwright-core";
import { writeFileSync } from "node:fs";

const { LAB_URL, LAB_TOKEN, NOTEBOOK, CHROMIUM, OUT } = process.env;
const TIMEOUT_MS = Number(process.env.TIMEOUT_S || 300) * 1000;
const log = (...a) => console.log(`[browser ${new Date().toISOString().slice(11, 19)}]`, ...a);

// A closed network: no background traffic, a fresh profile, no GPU.
const browser = await chromium.launch({
  executablePath: CHROMIUM,
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"],
});
const result = { notebook: NOTEBOOK, screenshots: {}, ok: false };
const page = await browser.newPage({ viewport: { width: 1400, height: 1100 } });
try {
  page.setDefaultTimeout(TIMEOUT_MS);
  page.on("pageerror", (e) => log("page error:", e.message));

  log("opening", NOTEBOOK);
  await page.goto(`${LAB_URL}/lab/tree/${NOTEBOOK}?token=${LAB_TOKEN}`);
  await page.locator(".jp-Notebook").first().waitFor();
  // JupyterLab may ask which kernel to start (the notebook names python3): take the preferred one.
  const select = page.locator(".jp-Dialog button", { hasText: /^Select$/ });
  await select.waitFor({ timeout: 15000 }).then(() => select.click(), () => {});
  await page.locator(".jp-StatusBar-Widget", { hasText: /Idle/ }).first().waitFor();
  // The "get notified about Jupyter news?" toast would cover the figure.
  await page.locator(".jp-toast-button", { hasText: /^No$/ }).click({ timeout: 3000 }).catch(() => {});
  log("kernel idle; Run > Run All Cells");
  await page.locator(".lm-MenuBar-itemLabel", { hasText: /^Run$/ }).click();
  await page.locator(".lm-Menu-itemLabel", { hasText: /^Run All Cells$/ }).click();

  const run = page.locator("button.jupyter-button", { hasText: /^\s*Run\s*$/ });
  await run.waitFor();
  const plot = page.locator(".jp-OutputArea .js-plotly-plot").first();
  await plot.waitFor();
  await plot.scrollIntoViewIfNeeded();
  log("panel shown; pressing Run");
  await run.click();

  // Point counts per trace and the progress bars, as the browser has them.
  const state = () => page.evaluate(() => {
    const gd = document.querySelector(".jp-OutputArea .js-plotly-plot");
    const bars = [...document.querySelectorAll(".widget-inline-hbox progress, .jupyter-widgets.widget-progress")];
    return {
      points: (gd?.data || []).map((t) => ({ name: t.name, n: (t.x || []).length })),
      bars: [...document.querySelectorAll(".progress-bar")].map((b) => b.style.width),
      status: [...document.querySelectorAll(".widget-html-content")].map((e) => e.textContent).join(" | "),
    };
  });

  // The live shot: the e2e curve done, the local one growing (about half way), before the study ends.
  const t0 = Date.now();
  let live = null;
  while (Date.now() - t0 < TIMEOUT_MS) {
    const s = await state();
    const n = Object.fromEntries(s.points.map((p) => [p.name, p.n]));
    const half = Math.max(2, Math.floor((n.e2e || 0) / 2));  // the local curve about half way
    if ((n.e2e || 0) >= 3 && (n.local || 0) >= half && !/complete: report/.test(s.status)) { live = s; break; }
    if (/complete: report|error/.test(s.status)) break;
    await page.waitForTimeout(200);
  }
  if (!live) throw new Error("the loss curves did not grow while training (see done.png)");
  await page.screenshot({ path: `${OUT}/live.png` });
  result.screenshots.live = `${OUT}/live.png`;
  result.live = live;
  log("live:", JSON.stringify(live.points), live.bars.join(" "));

  await page.locator(".widget-html-content", { hasText: /complete: report|error/ }).first().waitFor();
  const done = await state();
  await page.waitForTimeout(1000); // let the report's figures under the panel draw
  await plot.scrollIntoViewIfNeeded();
  await page.screenshot({ path: `${OUT}/done.png` });
  result.screenshots.done = `${OUT}/done.png`;
  result.done = done;
  result.ok = /complete: report/.test(done.status);
  log("done:", JSON.stringify(done.points), done.status);
} catch (e) {
  result.error = String(e);
  log("failed:", e.message);
  await page.screenshot({ path: `${OUT}/failed.png` }).catch(() => {});
  result.screenshots.failed = `${OUT}/failed.png`;
  result.outputs = await page.locator(".jp-OutputArea-output").allTextContents().catch(() => []);
} finally {
  writeFileSync(`${OUT}/result.json`, JSON.stringify(result, null, 2) + "\n");
  await browser.close();
}
process.exit(result.ok ? 0 : 1);
