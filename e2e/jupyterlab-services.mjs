// Drives kernelgate with @jupyterlab/services, as JupyterLab does.
// Usage: KERNELGATE_URL=http://127.0.0.1:8888/ KERNELGATE_TOKEN=t node jupyterlab-services.mjs
import services from '@jupyterlab/services';
import WebSocket from 'ws';

const { KernelManager, KernelSpecManager, SessionManager, ServerConnection } = services;
const baseUrl = process.env.KERNELGATE_URL;
const token = process.env.KERNELGATE_TOKEN;

// A client that offers no subprotocol, so the gateway uses the legacy JSON framing.
class LegacyWebSocket extends WebSocket {
  constructor(url) { super(url); }
}

function settingsFor(WS) {
  return ServerConnection.makeSettings({ baseUrl, wsUrl: baseUrl.replace(/^http/, 'ws'), token, appendToken: true, WebSocket: WS });
}

const strip = (s) => s.replace(/\x1b\[[0-9;]*m/g, '');
const fail = (msg) => { throw new Error(msg); };
const withTimeout = (p, ms, what) => Promise.race([p, new Promise((_, rej) => setTimeout(() => rej(new Error(`timed out: ${what}`)), ms))]);

async function execute(kernel, code) {
  const future = kernel.requestExecute({ code });
  const outputs = [];
  future.onIOPub = (msg) => outputs.push(msg);
  const reply = await withTimeout(future.done, 30000, code);
  return { reply: reply.content, outputs };
}

async function resultOf(kernel, code) {
  const { reply, outputs } = await execute(kernel, code);
  if (reply.status !== 'ok') fail(`${code}: ${JSON.stringify(reply)}`);
  // Deno publishes some results after its idle status; the gateway holds
  // that status back, so the result is among the request's outputs.
  const r = outputs.find((m) => m.header.msg_type === 'execute_result');
  if (!r) fail(`${code}: no execute_result before the request ended: ${outputs.map((m) => m.header.msg_type)}`);
  return strip(r.content.data['text/plain']);
}

async function protocolRun(label, WS) {
  const serverSettings = settingsFor(WS);
  const specs = new KernelSpecManager({ serverSettings });
  await specs.ready;
  const names = Object.keys(specs.specs.kernelspecs).sort();
  if (!names.includes('python3') || !names.includes('deno')) fail(`kernelspecs: ${names}`);
  console.log(`${label}: kernelspecs ${names.join(', ')} (default ${specs.specs.default})`);

  const km = new KernelManager({ serverSettings });
  await km.ready;
  const py = await km.startNew({ name: 'python3' });
  const info = await withTimeout(py.info, 30000, 'kernel_info');
  const expected = label === 'v1' ? 'v1.kernel.websocket.jupyter.org' : '';
  if (py.subprotocol !== undefined && py.subprotocol !== expected && !(expected === '' && py.subprotocol === null)) {
    console.log(`${label}: subprotocol ${JSON.stringify(py.subprotocol)}`);
  }
  console.log(`${label}: python ${info.language_info.name} ${info.language_info.version}`);
  const two = await resultOf(py, '1+1');
  if (two !== '2') fail(`1+1 = ${two}`);

  await execute(py, 'kept = 42');
  // Interrupt once the code runs (it says so on stdout).
  const future = py.requestExecute({ code: "import time; print('sleeping', flush=True); time.sleep(30)" });
  const started = new Promise((resolve) => {
    future.onIOPub = (m) => { if (m.header.msg_type === 'stream') resolve(); };
  });
  const sleeping = withTimeout(future.done, 30000, 'sleep').then((r) => ({ reply: r.content }));
  await withTimeout(started, 30000, 'the sleep to start');
  const t0 = Date.now();
  await py.interrupt();
  const { reply } = await sleeping;
  if (reply.status !== 'error' || reply.ename !== 'KeyboardInterrupt') fail(`interrupt: ${JSON.stringify(reply)}`);
  if (await resultOf(py, 'kept') !== '42') fail('state lost after interrupt');
  console.log(`${label}: interrupt ${Date.now() - t0} ms, state kept`);

  await withTimeout(py.restart(), 60000, 'restart');
  await withTimeout(py.info, 30000, 'kernel_info after restart');
  const after = await execute(py, 'kept');
  if (after.reply.status !== 'error' || after.reply.ename !== 'NameError') fail(`after restart: ${JSON.stringify(after.reply)}`);
  console.log(`${label}: restart cleared state`);

  const deno = await km.startNew({ name: 'deno' });
  if (await resultOf(deno, '1+1') !== '2') fail('deno 1+1');
  // With console output ahead of it, Deno's result follows its idle
  // status in about a quarter of the runs.
  for (let i = 0; i < 40; i++) {
    if (await resultOf(deno, "console.log('hi'); 5") !== '5') fail(`deno run ${i}: wrong result`);
  }
  console.log(`${label}: deno 1+1 = 2; 40 results with output ahead, none lost`);

  const sm = new SessionManager({ serverSettings, kernelManager: km });
  await sm.ready;
  const session = await sm.startNew({ path: `nb-${label}.ipynb`, type: 'notebook', name: `nb-${label}`, kernel: { name: 'python3' } });
  if (await resultOf(session.kernel, '3*3') !== '9') fail('session kernel');
  await sm.refreshRunning();
  const listed = [...sm.running()].map((s) => s.path);
  if (!listed.includes(`nb-${label}.ipynb`)) fail(`sessions: ${listed}`);
  await session.shutdown();
  await sm.refreshRunning();
  if ([...sm.running()].some((s) => s.path === `nb-${label}.ipynb`)) fail('session still listed after shutdown');
  console.log(`${label}: sessions create/list/delete`);

  await py.shutdown();
  await deno.shutdown();
  sm.dispose();
  km.dispose();
}

try {
  await protocolRun('v1', WebSocket);
  await protocolRun('legacy', LegacyWebSocket);
  console.log('ok');
  process.exit(0);
} catch (e) {
  console.error('FAIL:', e.message);
  process.exit(1);
}
