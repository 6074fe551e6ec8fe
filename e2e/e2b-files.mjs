// Writes several files at once through the unmodified E2B SDK (2.x), which
// sends them as one multipart form whose parts carry the files' paths, and
// checks each lands at its own path.
// Usage: KERNELGATE_URL=http://127.0.0.1:8888/ KERNELGATE_TOKEN=t node e2b-files.mjs
import { Sandbox } from '@e2b/code-interpreter';
import assert from 'node:assert/strict';

const base = process.env.KERNELGATE_URL.replace(/\/$/, '');
const opts = { apiKey: process.env.KERNELGATE_TOKEN, apiUrl: `${base}/e2b`, sandboxUrl: `${base}/e2b` };

const sbx = await Sandbox.create(opts);
try {
  // Several files in one call: absolute paths in the sandbox's home and
  // relative ones keep their folders; same names in other folders stay apart.
  const written = await sbx.files.write([
    { path: '/home/user/sub/dir/a.csv', data: 'x\n1\n' },
    { path: 'other/b.csv', data: 'x\n2\n' },
    { path: 'a.csv', data: 'x\n3\n' },
  ]);
  assert.deepEqual(written.map((e) => e.path), ['/home/user/sub/dir/a.csv', '/home/user/other/b.csv', '/home/user/a.csv']);
  assert.equal(await sbx.files.read('/home/user/sub/dir/a.csv'), 'x\n1\n');
  assert.equal(await sbx.files.read('other/b.csv'), 'x\n2\n');
  assert.equal(await sbx.files.read('a.csv'), 'x\n3\n');
  assert.deepEqual((await sbx.files.list('sub/dir')).map((e) => e.name), ['a.csv']);
  // The kernel finds them where their paths say.
  const exec = await sbx.runCode('[open(p).read().split()[1] for p in ("sub/dir/a.csv", "other/b.csv", "a.csv")]');
  assert.equal(exec.text, "['1', '2', '3']", JSON.stringify(exec.error));

  // The same, sent as bytes one file at a time.
  await sbx.files.write([{ path: 'octet/c.txt', data: 'c' }, { path: '/home/user/octet/d/c.txt', data: 'd' }], { useOctetStream: true });
  assert.equal(await sbx.files.read('octet/c.txt'), 'c');
  assert.equal(await sbx.files.read('octet/d/c.txt'), 'd');

  // A path outside the sandbox's home is refused, not written at the top.
  await assert.rejects(sbx.files.write([{ path: '/etc/x', data: 'x' }]), /outside the sandbox/);
  await assert.rejects(sbx.files.write([{ path: 'ok.txt', data: 'ok' }, { path: '/tmp/y', data: 'y' }]), /outside the sandbox/);
  assert.equal(await sbx.files.exists('x'), false);
  assert.equal(await sbx.files.exists('y'), false);
  // One path twice in one call is refused; the first stays.
  await assert.rejects(sbx.files.write([{ path: 'twice.txt', data: '1' }, { path: '/home/user/twice.txt', data: '2' }]), /twice/);
  assert.equal(await sbx.files.read('twice.txt'), '1');

  // A single file is as before.
  const one = await sbx.files.write('/home/user/single/one.txt', 'one');
  assert.equal(one.path, '/home/user/single/one.txt');
  assert.equal(await sbx.files.read('single/one.txt'), 'one');
} finally {
  await sbx.kill();
}
console.log('e2b files: ok');
