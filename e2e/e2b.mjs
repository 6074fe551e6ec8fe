// Drives kernelgate with the unmodified E2B code-interpreter SDK, its
// apiUrl and sandboxUrl pointed at /e2b.
// Usage: KERNELGATE_URL=http://127.0.0.1:8888/ KERNELGATE_TOKEN=t node e2b.mjs
import { Sandbox } from '@e2b/code-interpreter';
import assert from 'node:assert/strict';

const base = process.env.KERNELGATE_URL.replace(/\/$/, '');
const token = process.env.KERNELGATE_TOKEN;
const opts = { apiKey: token, apiUrl: `${base}/e2b`, sandboxUrl: `${base}/e2b` };

async function api(path) {
  const res = await fetch(`${base}${path}`, { headers: { Authorization: `Bearer ${token}` } });
  assert.equal(res.status, 200, `${path}: ${res.status}`);
  return res.json();
}

// Refused without a valid key.
await assert.rejects(Sandbox.create({ ...opts, apiKey: 'not-a-key-0123456789' }), /Unauthorized|401/);

const sbx = await Sandbox.create(opts);
assert.ok(sbx.sandboxId, 'sandbox id');
assert.equal(await sbx.isRunning(), true);
const info = await Sandbox.getInfo(sbx.sandboxId, opts);
assert.equal(info.sandboxId, sbx.sandboxId);
assert.equal(info.state, 'running');
assert.ok(info.endAt > info.startedAt, `endAt ${info.endAt} after startedAt ${info.startedAt}`);
await sbx.setTimeout(10 * 60 * 1000);
const page = await Sandbox.list(opts).nextItems();
assert.ok(page.some((s) => s.sandboxId === sbx.sandboxId), JSON.stringify(page));
const again = await Sandbox.connect(sbx.sandboxId, opts);
await again.runCode('connected = True');

// State kept across runs; the last expression is the main result.
await sbx.runCode('x = 40');
let exec = await sbx.runCode('x + 2 if connected else 0');
assert.equal(exec.text, '42');
assert.equal(exec.error, undefined);
assert.ok(exec.executionCount >= 2, `executionCount ${exec.executionCount}`);

// Streaming callbacks.
const seen = [];
exec = await sbx.runCode('import sys\nprint("out one")\nprint("err one", file=sys.stderr)\nprint("out two")', {
  onStdout: (m) => seen.push(['out', m.line]),
  onStderr: (m) => seen.push(['err', m.line]),
});
assert.deepEqual(exec.logs.stdout.join(''), 'out one\nout two\n');
assert.ok(seen.some(([k, l]) => k === 'out' && l.includes('out one')), JSON.stringify(seen));
assert.ok(seen.some(([k, l]) => k === 'err' && l.includes('err one')), JSON.stringify(seen));

// Errors with their name.
let onError;
exec = await sbx.runCode('1/0', { onError: (e) => { onError = e; } });
assert.equal(exec.error.name, 'ZeroDivisionError');
assert.equal(exec.error.value, 'division by zero');
assert.match(exec.error.traceback, /ZeroDivisionError/);
assert.equal(onError.name, 'ZeroDivisionError');

// A matplotlib plot as a PNG result.
exec = await sbx.runCode('import matplotlib\nmatplotlib.use("agg")\n%matplotlib inline\nimport matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()');
const png = exec.results.find((r) => r.png);
assert.ok(png, `no PNG result: ${JSON.stringify(exec.results.map((r) => r.formats()))}`);
assert.equal(Buffer.from(png.png, 'base64').subarray(1, 4).toString(), 'PNG');

// JavaScript, in the sandbox's JavaScript context.
exec = await sbx.runCode('const ys = [1, 2, 3]; ys.map((y) => y * 2).join(",")', { language: 'js' });
assert.equal(exec.error, undefined, JSON.stringify(exec.error));
assert.match(exec.text, /2,4,6/);
exec = await sbx.runCode('ys.length', { language: 'js' });
assert.equal(exec.text, '3');

// A context of its own.
const ctx = await sbx.createCodeContext({ language: 'python' });
assert.ok(ctx.id, 'context id');
assert.equal(ctx.language, 'python');
await sbx.runCode('z = "mine"', { context: ctx });
exec = await sbx.runCode('z', { context: ctx });
assert.equal(exec.text, 'mine');
exec = await sbx.runCode('z', {});
assert.equal(exec.error.name, 'NameError', 'the default context does not see the new one');
const listed = await sbx.listCodeContexts();
assert.ok(listed.some((c) => c.id === ctx.id), JSON.stringify(listed));
await sbx.restartCodeContext(ctx);
exec = await sbx.runCode('z', { context: ctx });
assert.equal(exec.error.name, 'NameError', 'state is gone after restart');
await sbx.removeCodeContext(ctx);
await assert.rejects(sbx.runCode('1', { context: ctx }), /not found/i);

// A client that stops waiting interrupts the run, and the kernel keeps its state.
await assert.rejects(sbx.runCode('import time\nfor i in range(600): time.sleep(0.1)', { timeoutMs: 1500 }), /timed out|abort/i);
exec = await sbx.runCode('x');
assert.equal(exec.text, '40');

// Files: written through the SDK, read by the code, and back.
const written = await sbx.files.write('/home/user/data/input.csv', 'a,b\n1,2\n3,4\n');
assert.equal(written.path, '/home/user/data/input.csv');
await sbx.files.write('notes.txt', 'relative paths are in the workspace');
exec = await sbx.runCode('import csv\nrows = list(csv.DictReader(open("data/input.csv")))\nopen("out.txt", "w").write(str(sum(int(r["b"]) for r in rows)))\nlen(rows)');
assert.equal(exec.text, '2', JSON.stringify(exec.error));
assert.equal(await sbx.files.read('/home/user/out.txt'), '6');
assert.equal(await sbx.files.read('notes.txt'), 'relative paths are in the workspace');
const bytes = await sbx.files.read('data/input.csv', { format: 'bytes' });
assert.equal(Buffer.from(bytes).toString(), 'a,b\n1,2\n3,4\n');
const entries = await sbx.files.list('/home/user');
const names = entries.map((e) => `${e.name}:${e.type}`).sort();
for (const want of ['data:dir', 'notes.txt:file', 'out.txt:file']) assert.ok(names.includes(want), `${want} in ${names}`);
const csvEntry = (await sbx.files.list('data')).find((e) => e.name === 'input.csv');
assert.equal(csvEntry.size, 12);
assert.equal(csvEntry.path, '/home/user/data/input.csv');
assert.equal(await sbx.files.exists('notes.txt'), true);
assert.equal(await sbx.files.exists('nope.txt'), false);
assert.equal(await sbx.files.makeDir('made/deep'), true);
assert.equal(await sbx.files.makeDir('made/deep'), false);
assert.equal((await sbx.files.getInfo('made/deep')).type, 'dir');
await sbx.files.remove('notes.txt');
assert.equal(await sbx.files.exists('notes.txt'), false);
await assert.rejects(sbx.files.read('missing.txt'), /not found|no such/i);
await assert.rejects(sbx.files.read('/etc/passwd'), /outside the sandbox/);
await assert.rejects(sbx.files.write('../escape.txt', 'x'), /\.\./);
// The JavaScript context shares the sandbox's files.
exec = await sbx.runCode('Deno.readTextFileSync("out.txt")', { language: 'js' });
assert.match(exec.text, /6/);

// Another sandbox is apart, and its token does not open this one.
const other = await Sandbox.create(opts);
exec = await other.runCode('x');
assert.equal(exec.error.name, 'NameError');
assert.equal(await other.files.exists('out.txt'), false, 'sandboxes have workspaces of their own');
const stolen = await fetch(`${base}/e2b/execute`, {
  method: 'POST',
  headers: { 'Content-Type': 'application/json', 'E2b-Sandbox-Id': sbx.sandboxId, 'X-Access-Token': other.envdAccessToken },
  body: JSON.stringify({ code: 'x' }),
});
assert.equal(stolen.status, 401);

// Every kernel of a sandbox is gone after kill.
const prefix = `e2b-${sbx.sandboxId}-`;
const mine = (await api('/api/contexts')).filter((c) => c.id.startsWith(prefix));
assert.ok(mine.length >= 2, `sandbox contexts: ${JSON.stringify(mine.map((c) => c.id))}`);
const kernelIds = mine.map((c) => c.kernelId).filter(Boolean);
assert.equal(await sbx.kill(), true);
assert.equal(await sbx.isRunning(), false);
const left = (await api('/api/contexts')).filter((c) => c.id.startsWith(prefix));
assert.deepEqual(left, []);
const kernels = (await api('/api/kernels')).map((k) => k.id);
for (const id of kernelIds) assert.ok(!kernels.includes(id), `kernel ${id} of the killed sandbox still runs`);
await assert.rejects(sbx.runCode('1'), /killed|timeout|not found/i);
assert.equal(await Sandbox.kill(sbx.sandboxId, opts), false);

// The other sandbox is untouched.
exec = await other.runCode('1 + 1');
assert.equal(exec.text, '2');
await other.kill();
console.log('e2b: ok');
// The SDK leaves its request timer running after a refused runCode: do not
// wait for it.
process.exit(0);
