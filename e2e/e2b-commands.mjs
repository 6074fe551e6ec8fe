// Drives kernelgate's commands with the unmodified E2B SDK (sbx.commands,
// envd's process service over Connect), its apiUrl and sandboxUrl pointed
// at /e2b.
// Usage: KERNELGATE_URL=http://127.0.0.1:8888/ KERNELGATE_TOKEN=t node e2b-commands.mjs
import { Sandbox } from '@e2b/code-interpreter';
import { CommandExitError } from 'e2b';
import assert from 'node:assert/strict';

const base = process.env.KERNELGATE_URL.replace(/\/$/, '');
const token = process.env.KERNELGATE_TOKEN;
const opts = { apiKey: token, apiUrl: `${base}/e2b`, sandboxUrl: `${base}/e2b` };

const sbx = await Sandbox.create(opts);

// run: output, exit code, the streaming callbacks.
const seen = [];
let res = await sbx.commands.run('echo hello; echo oops >&2', {
  onStdout: (d) => seen.push(['out', d]),
  onStderr: (d) => seen.push(['err', d]),
});
assert.equal(res.exitCode, 0);
assert.equal(res.stdout, 'hello\n');
assert.equal(res.stderr, 'oops\n');
assert.ok(seen.some(([k, d]) => k === 'out' && d.includes('hello')), JSON.stringify(seen));
assert.ok(seen.some(([k, d]) => k === 'err' && d.includes('oops')), JSON.stringify(seen));

// A failing command throws CommandExitError with its exit code and output.
await assert.rejects(sbx.commands.run('echo partial; exit 3'), (e) => e instanceof CommandExitError && e.exitCode === 3 && e.stdout === 'partial\n');

// The sandbox's files: what a command writes, code and the file API read.
await sbx.commands.run('mkdir -p out && echo 42 > out/answer.txt', { cwd: '/home/user' });
assert.equal((await sbx.files.read('out/answer.txt')).trim(), '42');
const exec = await sbx.runCode('open("out/answer.txt").read().strip()');
assert.match(exec.text, /42/);
res = await sbx.commands.run('cat answer.txt', { cwd: '/home/user/out', envs: { GREETING: 'hi' } });
assert.equal(res.stdout, '42\n');
res = await sbx.commands.run('echo $GREETING', { envs: { GREETING: 'hi' } });
assert.equal(res.stdout, 'hi\n');

// A background command: listed, given input, waited for.
const bg = await sbx.commands.run('read line; echo "got $line"; sleep 0.2', { background: true, stdin: true });
assert.ok(bg.pid > 0, `pid ${bg.pid}`);
const listed = await sbx.commands.list();
assert.ok(listed.some((p) => p.pid === bg.pid && p.cmd === '/bin/bash'), JSON.stringify(listed));
await sbx.commands.sendStdin(bg.pid, 'abc\n');
res = await bg.wait();
assert.equal(res.stdout, 'got abc\n');
assert.equal(res.exitCode, 0);

// connect to a running command, then kill it.
const long = await sbx.commands.run('echo started; sleep 300', { background: true, timeoutMs: 0 });
const attached = await sbx.commands.connect(long.pid, { timeoutMs: 0 });
assert.equal(attached.pid, long.pid);
assert.equal(await sbx.commands.kill(long.pid), true);
await assert.rejects(attached.wait(), (e) => e instanceof CommandExitError && e.exitCode !== 0);
assert.ok(!(await sbx.commands.list()).some((p) => p.pid === long.pid));
assert.equal(await sbx.commands.kill(long.pid), false);

// A command's timeout kills it.
await assert.rejects(sbx.commands.run('sleep 60', { timeoutMs: 1000 }));

await sbx.kill();
console.log('e2b commands: ok');
process.exit(0);
