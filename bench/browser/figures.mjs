// Renders every standalone HTML figure in FIGURES (reports/figures from `seamkit reproduce`) to a
// PNG beside it, in headless Chromium, offline (plotly.min.js sits beside the HTML files).
// Called by `bench/browser_check.sh figures`.
import { chromium } from "playwright-core";
import { readdirSync } from "node:fs";
import { join, resolve } from "node:path";

const { CHROMIUM, FIGURES } = process.env;
const dir = resolve(FIGURES);
const files = readdirSync(dir).filter((f) => f.endsWith(".html")).sort();
const browser = await chromium.launch({
  executablePath: CHROMIUM,
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"],
});
let failed = 0;
try {
  const page = await browser.newPage({ viewport: { width: 1000, height: 560 } });
  for (const f of files) {
    await page.goto("file://" + join(dir, f));
    const ok = await page.locator(".js-plotly-plot .main-svg").first().waitFor({ timeout: 30000 }).then(() => true, () => false);
    if (!ok) { console.log(`figures: ${f} did not draw`); failed++; continue; }
    const png = join(dir, f.replace(/\.html$/, ".png"));
    await page.screenshot({ path: png });
    console.log(`figures: ${png}`);
  }
} finally {
  await browser.close();
}
process.exit(failed ? 1 : 0);
