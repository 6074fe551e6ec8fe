// Drives kernelgate's R kernel with the unmodified E2B code-interpreter SDK
// (runCode with language 'r'), its apiUrl and sandboxUrl pointed at /e2b.
// Usage: KERNELGATE_URL=http://127.0.0.1:8888/ KERNELGATE_TOKEN=t node e2b-r.mjs
import { Sandbox } from '@e2b/code-interpreter';
import assert from 'node:assert/strict';

const base = process.env.KERNELGATE_URL.replace(/\/$/, '');
const opts = { apiKey: process.env.KERNELGATE_TOKEN, apiUrl: `${base}/e2b`, sandboxUrl: `${base}/e2b` };

const sbx = await Sandbox.create(opts);
try {
  // The value of the code is the main result; state is kept.
  let exec = await sbx.runCode('sales <- c(120, 95)\nsum(sales)', { language: 'r' });
  assert.equal(exec.error, undefined, JSON.stringify(exec.error));
  assert.equal(exec.text, '[1] 215');
  exec = await sbx.runCode('length(sales)', { language: 'r' });
  assert.equal(exec.text, '[1] 2');

  // cat and print to stdout, message and warning to stderr, streamed too.
  const seen = [];
  exec = await sbx.runCode('cat("out one\\n"); message("a note"); warning("careful"); print("out two")', {
    language: 'r',
    onStdout: (m) => seen.push(['out', m.line]),
    onStderr: (m) => seen.push(['err', m.line]),
  });
  assert.equal(exec.logs.stdout.join(''), 'out one\n[1] "out two"\n');
  assert.match(exec.logs.stderr.join(''), /a note[\s\S]*careful/);
  assert.ok(seen.some(([k, l]) => k === 'err' && l.includes('a note')), JSON.stringify(seen));

  // A plot as PNG; a data frame as HTML and text.
  exec = await sbx.runCode('plot(1:10)', { language: 'r' });
  const png = exec.results.find((r) => r.png);
  assert.ok(png, `no PNG result: ${JSON.stringify(exec.results.map((r) => r.formats()))}`);
  assert.equal(Buffer.from(png.png, 'base64').subarray(1, 4).toString(), 'PNG');
  exec = await sbx.runCode('data.frame(region = c("north", "south"), sales = c(10, 32))', { language: 'r' });
  const df = exec.results.find((r) => r.isMainResult);
  assert.match(df.html, /<table/);
  assert.match(df.text, /south\s+32/);

  // Errors.
  let onError;
  exec = await sbx.runCode('stop("boom")', { language: 'r', onError: (e) => { onError = e; } });
  assert.match(exec.error.value, /boom/);
  assert.match(onError.value, /boom/);

  // A context of its own, apart from the default R context; the files of
  // the sandbox are its files.
  const ctx = await sbx.createCodeContext({ language: 'r' });
  assert.equal(ctx.language, 'r');
  exec = await sbx.runCode('exists("sales")', { context: ctx });
  assert.equal(exec.text, '[1] FALSE');
  await sbx.files.write('data/sales.csv', 'region,sales\nnorth,10\nsouth,32\n');
  exec = await sbx.runCode('d <- read.csv("data/sales.csv"); sum(d$sales)', { context: ctx });
  assert.equal(exec.text, '[1] 42', JSON.stringify(exec.error));
  await sbx.removeCodeContext(ctx);
} finally {
  await sbx.kill();
}
console.log('e2b R ok');
