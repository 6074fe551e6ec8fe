// Runs Deno requests with @jupyterlab/services through Jupyter Server's
// GatewayClient (jupyter server --gateway-url=<kernelgate>), as JupyterLab
// does against a gateway: each request's result must be among its outputs.
// Usage: SERVER_URL=http://127.0.0.1:8889/ SERVER_TOKEN=t node gateway-deno.mjs
import services from '@jupyterlab/services';
import WebSocket from 'ws';

const { KernelManager, ServerConnection } = services;
const baseUrl = process.env.SERVER_URL;
const token = process.env.SERVER_TOKEN;
const serverSettings = ServerConnection.makeSettings({ baseUrl, wsUrl: baseUrl.replace(/^http/, 'ws'), token, appendToken: true, WebSocket });

const strip = (s) => s.replace(/\x1b\[[0-9;]*m/g, '');
const fail = (msg) => { throw new Error(msg); };
const withTimeout = (p, ms, what) => Promise.race([p, new Promise((_, rej) => setTimeout(() => rej(new Error(`timed out: ${what}`)), ms))]);

try {
  const km = new KernelManager({ serverSettings });
  await km.ready;
  const deno = await km.startNew({ name: 'deno' });
  await withTimeout(deno.info, 60000, 'kernel_info');
  // With console output ahead of it, Deno's result follows its idle status
  // in about a quarter of the runs.
  for (let i = 0; i < 40; i++) {
    const future = deno.requestExecute({ code: "console.log('hi'); 5" });
    const outputs = [];
    future.onIOPub = (m) => outputs.push(m);
    await withTimeout(future.done, 30000, `run ${i}`);
    const r = outputs.find((m) => m.header.msg_type === 'execute_result');
    if (!r) fail(`run ${i}: no execute_result before the request ended: ${outputs.map((m) => m.header.msg_type)}`);
    if (strip(r.content.data['text/plain']) !== '5') fail(`run ${i}: result ${r.content.data['text/plain']}`);
  }
  console.log('deno through GatewayClient: 40 results, none lost');
  await deno.shutdown();
  km.dispose();
  process.exit(0);
} catch (e) {
  console.error('FAIL:', e.message);
  process.exit(1);
}
