// Opens the classic notebook (served with --gateway-url=<kernelgate>) in
// headless Chromium and runs a cell through kernelgate.
// Usage: NOTEBOOK_URL=http://127.0.0.1:18890/ NOTEBOOK_TOKEN=t NOTEBOOK_FILE=t.ipynb node classic-notebook.mjs
import { chromium } from 'playwright-core';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const base = process.env.NOTEBOOK_URL;
const token = process.env.NOTEBOOK_TOKEN;
const file = process.env.NOTEBOOK_FILE || 't.ipynb';

const browser = await chromium.launchPersistentContext(mkdtempSync(join(tmpdir(), 'kg-chromium-')), {
  executablePath: '/usr/bin/chromium',
  headless: true,
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
let code = 1;
try {
  const page = await browser.newPage();
  page.setDefaultTimeout(60000);
  await page.goto(`${base}notebooks/${file}?token=${token}`);
  // The kernel indicator turns idle once the notebook is connected through the gateway.
  await page.waitForSelector('#kernel_indicator_icon.kernel_idle_icon');
  await page.click('.cell .CodeMirror');
  await page.keyboard.type('1+1');
  await page.keyboard.press('Shift+Enter');
  const prompt = page.locator('.output_prompt').first();
  await prompt.waitFor();
  const promptText = (await prompt.innerText()).replace(/\s+/g, '');
  const out = (await page.locator('.output_subarea').first().innerText()).trim();
  console.log(`prompt ${promptText} output ${out}`);
  if (promptText !== 'Out[1]:' || out !== '2') throw new Error(`want Out[1]: 2, got ${promptText} ${out}`);
  console.log('ok');
  code = 0;
} catch (e) {
  console.error('FAIL:', e.message);
} finally {
  await browser.close();
}
process.exit(code);
