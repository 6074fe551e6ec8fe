// Drives kernelgate's /mcp with the official TypeScript MCP SDK.
// Usage: KERNELGATE_URL=http://127.0.0.1:8888/ KERNELGATE_TOKEN=t node mcp.mjs
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import assert from 'node:assert/strict';

const base = process.env.KERNELGATE_URL.replace(/\/$/, '');
const token = process.env.KERNELGATE_TOKEN;

async function connect(auth) {
  const client = new Client({ name: 'kernelgate-e2e', version: '1.0.0' });
  const headers = auth ? { Authorization: auth } : {};
  await client.connect(new StreamableHTTPClientTransport(new URL(`${base}/mcp`), { requestInit: { headers } }));
  return client;
}
const text = (res) => res.content.filter((c) => c.type === 'text').map((c) => c.text).join('\n');

// Refused without credentials.
await assert.rejects(connect(null), (e) => e.code === 401 && /UNAUTHORIZED/.test(e.message));

const client = await connect(`Bearer ${token}`);
const { tools } = await client.listTools();
const names = tools.map((t) => t.name);
for (const n of ['run_code', 'run_command', 'create_context', 'list_contexts', 'delete_context', 'interrupt', 'write_file', 'read_file', 'list_files']) {
  assert.ok(names.includes(n), `${n} in ${names}`);
}

// State kept across calls in a context, and across clients.
let res = await client.callTool({ name: 'create_context', arguments: { id: 'ts-mcp' } });
assert.equal(res.isError ?? false, false, text(res));
assert.equal(res.structuredContent.id, 'ts-mcp');
await client.callTool({ name: 'run_code', arguments: { code: 'total = 40', context: 'ts-mcp' } });
const again = await connect(`Bearer ${token}`);
res = await again.callTool({ name: 'run_code', arguments: { code: 'print("hello")\ntotal + 2', context: 'ts-mcp' } });
assert.match(text(res), /hello/);
assert.match(text(res), /42/);
assert.equal(res.structuredContent.context, 'ts-mcp');
assert.equal(res.structuredContent.process.reason, 'completed');

// A plot comes back as image content.
res = await client.callTool({ name: 'run_code', arguments: { context: 'ts-mcp', code: 'import matplotlib\nmatplotlib.use("agg")\n%matplotlib inline\nimport matplotlib.pyplot as plt\nplt.plot([3, 1, 2])\nplt.show()' } });
const img = res.content.find((c) => c.type === 'image');
assert.ok(img, JSON.stringify(res.content.map((c) => c.type)));
assert.equal(img.mimeType, 'image/png');
assert.equal(Buffer.from(img.data, 'base64').subarray(1, 4).toString(), 'PNG');

// Errors are named.
res = await client.callTool({ name: 'run_code', arguments: { code: 'undefined_name', context: 'ts-mcp' } });
assert.equal(res.isError, true);
assert.match(text(res), /NameError: name 'undefined_name' is not defined/);
res = await client.callTool({ name: 'interrupt', arguments: { context: 'nope' } });
assert.equal(res.isError, true);
assert.match(text(res), /^SESSION_NOT_FOUND:/);

// JavaScript runs on Deno.
res = await client.callTool({ name: 'run_code', arguments: { language: 'typescript', code: 'const n: number = 6 * 7; n' } });
assert.equal(res.isError ?? false, false, text(res));
assert.match(text(res), /42/);

// Files written and read.
res = await client.callTool({ name: 'write_file', arguments: { context: 'ts-mcp', path: 'in/numbers.txt', content: '1\n2\n3\n' } });
assert.equal(res.isError ?? false, false, text(res));
res = await client.callTool({ name: 'run_code', arguments: { context: 'ts-mcp', code: 'n = sum(int(l) for l in open("in/numbers.txt"))\nopen("out.txt", "w").write(f"sum={n}")\nn' } });
assert.match(text(res), /6/);
res = await client.callTool({ name: 'read_file', arguments: { context: 'ts-mcp', path: 'out.txt' } });
assert.equal(text(res), 'sum=6');
res = await client.callTool({ name: 'list_files', arguments: { context: 'ts-mcp' } });
assert.ok(res.structuredContent.files.some((f) => f.path === 'out.txt' && f.type === 'file'), JSON.stringify(res.structuredContent));
res = await client.callTool({ name: 'read_file', arguments: { context: 'ts-mcp', path: '../../etc/passwd' } });
assert.equal(res.isError, true);
assert.match(text(res), /^BAD_REQUEST:/);

// A command beside the kernel, in its workspace.
res = await client.callTool({ name: 'run_command', arguments: { context: 'ts-mcp', command: 'cat out.txt; echo; ls in' } });
assert.equal(res.isError ?? false, false, text(res));
assert.match(text(res), /sum=6\nnumbers\.txt/);
assert.equal(res.structuredContent.process.exitCode, 0);
res = await client.callTool({ name: 'run_command', arguments: { context: 'ts-mcp', command: 'exit 3' } });
assert.equal(res.isError, true);
assert.equal(res.structuredContent.process.exitCode, 3);

res = await client.callTool({ name: 'list_contexts', arguments: {} });
assert.ok(res.structuredContent.contexts.some((c) => c.id === 'ts-mcp'));
res = await client.callTool({ name: 'delete_context', arguments: { context: 'ts-mcp' } });
assert.equal(res.isError ?? false, false, text(res));
await client.close();
await again.close();
console.log('mcp: ok');
