// Real-browser test of the live dashboard: JupyterLab + the trainbook kernel + headless Chromium.
// Runs notebooks/bert.ipynb (tiny parameters) with "Run All Cells" and checks from the DOM that
// the training cell holds exactly one dashboard that redraws in place, then the final view; then
// runs notebooks/sweep.ipynb the same way and checks that the sweep cell holds one view whose
// trial table changes in place (trials going from pending/running to succeeded/pruned).
// Entry point: scripts/test-browser.sh (checks prerequisites, installs node_modules).
// Environment: TRAINBOOK_ARTIFACTS (screenshots, logs; default target/test-artifacts/browser),
// CHROMIUM (default /usr/bin/chromium), TRAINBOOK_BROWSER_TIMEOUT (seconds, default 900),
// TRAINBOOK_BROWSER_KEEP=1 keeps the temporary directory.

import { spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const VENV = path.join(ROOT, '.venv');
const NOTEBOOK = path.join(ROOT, 'notebooks', 'bert.ipynb');
const ARTIFACTS = path.resolve(
  process.env.TRAINBOOK_ARTIFACTS || path.join(ROOT, 'target', 'test-artifacts', 'browser'),
);
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const TOTAL_S = Number(process.env.TRAINBOOK_BROWSER_TIMEOUT || 900);
const KERNEL = 'trainbook';
const NB_NAME = 'bert.ipynb';
// Tiny preset, but enough steps (~15 s of training on 2 cores) for many 0.5 s redraws.
const PARAMS = [['preset', 'tiny'], ['epochs', '3'], ['train_rows', '2000']];
const EPOCHS = 3;
// Identifies the training cell by its source.
const TRAIN_NEEDLE = 'trainer.fit()';
// The sweep: 8 trials of the tiny BERT (4 learning rates × 2 warm-ups), 2 at a time, ASHA; 512
// rows make each trial a few seconds, so the table is seen in many states.
const SWEEP_NOTEBOOK = path.join(ROOT, 'notebooks', 'sweep.ipynb');
const SWEEP_NB = 'sweep.ipynb';
const SWEEP_PARAMS = [['preset', 'tiny'], ['train_rows', '512'], ['eval_rows', '128'], ['max_length', '32']];
const SWEEP_NEEDLE = '.launch()?';
const SWEEP_TRIALS = 8;
const SAMPLE_MS = 250;

const t0 = Date.now();
const since = () => ((Date.now() - t0) / 1000).toFixed(1);
const log = (...a) => console.log(`[${since()}s]`, ...a);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

class TestFailure extends Error {}
function check(cond, msg, detail) {
  if (!cond) {
    const e = new TestFailure(msg);
    e.detail = detail;
    throw e;
  }
}

// ---- state shared with cleanup -------------------------------------------------------------
const token = randomBytes(24).toString('hex');
// Every process the server starts (kernel, compilers, workers) inherits this, so leftovers can
// be found by it after shutdown and nothing else is ever touched.
const MARK = `TRAINBOOK_BROWSER_TEST=${randomBytes(8).toString('hex')}`;
let tmp;
let server; // ChildProcess of `jupyter lab`
let serverExit = null; // {code, signal} once it exited
let base; // http://127.0.0.1:PORT
let browser;
let page;
const serverLog = []; // tail of the server's (and kernel's) stdout/stderr
let serverLogFile;

// ---- small helpers -------------------------------------------------------------------------

/** Polls `fn` until it returns a truthy value; every wait has a deadline. */
async function waitFor(what, seconds, fn, intervalMs = 500) {
  const end = Date.now() + seconds * 1000;
  let last;
  for (;;) {
    if (serverExit) throw new TestFailure(`JupyterLab exited (${JSON.stringify(serverExit)}) while waiting for ${what}`);
    try {
      const v = await fn();
      if (v) return v;
      last = undefined;
    } catch (e) {
      if (e instanceof TestFailure) throw e;
      last = e;
    }
    if (Date.now() > end) {
      throw new TestFailure(`timed out after ${seconds} s waiting for ${what}${last ? `: ${last.message}` : ''}`);
    }
    await sleep(intervalMs);
  }
}

async function api(p, { method = 'GET', body, timeoutMs = 10000 } = {}) {
  const res = await fetch(base + p, {
    method,
    headers: { Authorization: `token ${token}`, 'Content-Type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
    signal: AbortSignal.timeout(timeoutMs),
  });
  if (!res.ok) throw new Error(`${method} ${p}: HTTP ${res.status}`);
  const text = await res.text();
  return text ? JSON.parse(text) : null;
}

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.unref();
    s.on('error', reject);
    // Port 0: the OS picks a free one; JupyterLab may still retry upwards if it was taken.
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

function writeJson(file, value) {
  fs.mkdirSync(path.dirname(file), { recursive: true });
  fs.writeFileSync(file, JSON.stringify(value, null, 2));
}

/** Processes carrying this run's marker, as [{pid, comm}]. */
function markedProcesses() {
  const found = [];
  for (const d of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const env = fs.readFileSync(`/proc/${d}/environ`, 'latin1');
      if (env.split('\0').includes(MARK)) {
        // argv names the program (`comm` is cut at 15 characters); for scripts, the script.
        const argv = fs.readFileSync(`/proc/${d}/cmdline`, 'latin1').split('\0').map((a) => path.basename(a));
        found.push({ pid: Number(d), comm: (/^python/.test(argv[0]) && argv[1] ? argv[1] : argv[0]) || '?' });
      }
    } catch {
      // gone or not ours to read
    }
  }
  return found;
}

// ---- phases --------------------------------------------------------------------------------

/** A copy of `notebook` named `name` in `dir` with `params` (and the runs root) injected. */
function prepareNotebook(dir, runsRoot, { notebook = NOTEBOOK, name = NB_NAME, params = PARAMS, needle = TRAIN_NEEDLE } = {}) {
  check(fs.existsSync(notebook), `${notebook} not found`);
  const out = path.join(dir, name);
  const args = ['scripts/notebook.py', 'params', notebook, out];
  for (const [param, value] of [...params, ['runs_root', runsRoot]]) args.push('-p', param, value);
  const r = spawnSync(path.join(VENV, 'bin', 'python'), args, { cwd: ROOT, encoding: 'utf8', timeout: 60000 });
  check(r.status === 0, `scripts/notebook.py params failed (${r.status ?? r.signal}): ${r.stderr}`);
  const nb = JSON.parse(fs.readFileSync(out, 'utf8'));
  check(nb.metadata?.kernelspec?.name === KERNEL, `notebook's kernelspec is ${JSON.stringify(nb.metadata?.kernelspec)}, expected ${KERNEL}`);
  const trainCells = nb.cells.filter((c) => c.cell_type === 'code' && [].concat(c.source).join('').includes(needle));
  check(trainCells.length === 1, `expected one code cell containing ${needle}, found ${trainCells.length}`);
  return out;
}

async function spawnServer(jdir, nbdir) {
  for (const d of ['config', 'data', 'runtime', 'settings', 'workspaces']) fs.mkdirSync(path.join(jdir, d), { recursive: true });
  const settings = path.join(jdir, 'settings');
  // All cells stay attached to the DOM (the default windowing may detach off-screen cells),
  // and no news/update toast covers the page.
  writeJson(path.join(settings, '@jupyterlab/notebook-extension/tracker.jupyterlab-settings'), { windowingMode: 'none' });
  writeJson(path.join(settings, '@jupyterlab/apputils-extension/notification.jupyterlab-settings'), {
    fetchNews: 'false',
    checkForUpdates: false,
  });
  const env = {
    ...process.env,
    // Isolated from the user's Jupyter set-up: only the venv's kernelspecs, no saved workspace.
    JUPYTER_CONFIG_DIR: path.join(jdir, 'config'),
    JUPYTER_DATA_DIR: path.join(jdir, 'data'),
    JUPYTER_RUNTIME_DIR: path.join(jdir, 'runtime'),
    JUPYTERLAB_SETTINGS_DIR: settings,
    JUPYTERLAB_WORKSPACES_DIR: path.join(jdir, 'workspaces'),
    JUPYTER_TOKEN: token, // not on the command line, so not visible in `ps`
    [MARK.split('=')[0]]: MARK.split('=')[1],
  };
  const port = await freePort();
  const args = [
    'lab', '--no-browser', '--ip=127.0.0.1', `--port=${port}`, '--ServerApp.port_retries=20',
    `--ServerApp.root_dir=${nbdir}`, '--ServerApp.terminals_enabled=False',
    // Safety net if this process is SIGKILLed: the server stops by itself once idle.
    '--MappingKernelManager.cull_idle_timeout=1200', '--MappingKernelManager.cull_interval=60',
    '--ServerApp.shutdown_no_activity_timeout=300',
  ];
  // Containers often run as root; the server refuses that unless told.
  if (process.getuid?.() === 0) args.push('--allow-root');
  serverLogFile = fs.createWriteStream(path.join(ARTIFACTS, 'jupyterlab.log'));
  // Own process group, so a last-resort kill reaches the server and nothing of ours else.
  server = spawn(path.join(VENV, 'bin', 'jupyter'), args, { cwd: nbdir, env, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
  server.on('exit', (code, signal) => { serverExit = { code, signal }; });
  for (const s of [server.stdout, server.stderr]) {
    s.setEncoding('utf8');
    s.on('data', (chunk) => {
      serverLogFile.write(chunk);
      serverLog.push(...chunk.split('\n').filter(Boolean));
      if (serverLog.length > 400) serverLog.splice(0, serverLog.length - 400);
    });
  }
}

async function waitForServer(jdir) {
  // The real port is in the server's info file (it moves up if the chosen port was taken).
  const runtime = path.join(jdir, 'runtime');
  const info = await waitFor('JupyterLab to start', 90, () => {
    const f = fs.readdirSync(runtime).find((n) => /^jpserver-\d+\.json$/.test(n));
    return f && JSON.parse(fs.readFileSync(path.join(runtime, f), 'utf8'));
  });
  base = `http://127.0.0.1:${info.port}`;
  await waitFor('the server API', 60, () => api('/api/status'));
  const specs = await api('/api/kernelspecs');
  check(specs.kernelspecs?.[KERNEL], `no "${KERNEL}" kernelspec in ${VENV} (have: ${Object.keys(specs.kernelspecs || {}).join(', ')}); run \`make build\` (scripts/install-kernel.sh)`);
  log(`JupyterLab ${base} (pid ${server.pid}), kernel ${KERNEL}: ${specs.kernelspecs[KERNEL].spec.argv[0]}`);
}

/** One consistent view of the notebook, taken inside the page in a single task. */
function snapshotInPage(needle) {
  const hash = (s) => {
    let h = 5381;
    for (let i = 0; i < s.length; i++) h = ((h * 33) ^ s.charCodeAt(i)) >>> 0;
    return h.toString(16);
  };
  const cells = [...document.querySelectorAll('.jp-Notebook .jp-Cell.jp-CodeCell')].map((c, index) => {
    const area = c.querySelector('.jp-OutputArea');
    const source = c.querySelector('.jp-InputArea-editor')?.textContent ?? '';
    return {
      index,
      node: c,
      source,
      prompt: (c.querySelector('.jp-InputArea-prompt')?.textContent ?? '').trim(),
      outputs: area ? area.querySelectorAll(':scope > .jp-OutputArea-child').length : 0,
      errors: c.querySelectorAll('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]').length,
      text: area ? area.innerText.slice(0, 3000) : '',
    };
  });
  const train = cells.find((c) => c.source.includes(needle));
  let dash = null;
  if (train) {
    const roots = train.node.querySelectorAll('.trainbook-dashboard');
    const d = roots[0];
    if (d) {
      const progress = d.querySelector('.trainbook-progress');
      const svg = d.querySelector('.trainbook-plot svg');
      const shapes = svg ? [...svg.querySelectorAll('polyline, polygon, path')] : [];
      const geometry = shapes.map((e) => e.getAttribute('points') ?? e.getAttribute('d') ?? '').join('|');
      // The result view's final metrics: a flex row of label/value pairs (no class of its own).
      const metricsRow = [...d.children].find((e) => e.tagName === 'DIV' && !e.className && e.style.display === 'flex');
      const metrics = metricsRow ? [...metricsRow.children].map((m) => [m.children[0]?.textContent.trim(), m.children[1]?.textContent.trim()]) : [];
      const codes = [...d.querySelectorAll('div > code')].map((e) => ({ label: e.parentElement.textContent.split(':')[0].trim(), text: e.textContent }));
      dash = {
        count: roots.length,
        status: (progress?.querySelector('span')?.textContent ?? '').replace(/^\S+\s+/, ''),
        progress: (progress?.innerText ?? '').replace(/\s+/g, ' ').trim(),
        plot: svg ? hash(geometry) : null,
        plotShapes: shapes.length,
        // Points of the longest line: grows as training-loss points arrive.
        plotPoints: Math.max(0, ...shapes.filter((e) => e.tagName === 'polyline').map((e) => (e.getAttribute('points') || '').trim().split(/\s+/).length)),
        metrics,
        tableRows: d.querySelectorAll('table.trainbook-metrics tbody tr').length,
        checkpoint: codes.find((c) => c.label === 'checkpoint')?.text ?? null,
        runDir: codes.find((c) => c.label === 'run directory')?.text ?? null,
        foldedLogs: d.querySelector('details .trainbook-logs') !== null,
        text: d.innerText,
      };
    }
  }
  return {
    cells: cells.map(({ node, ...rest }) => ({ ...rest, source: rest.source.slice(0, 80) })),
    train: train ? { index: train.index, prompt: train.prompt, outputs: train.outputs, errors: train.errors } : null,
    dash,
    kernelStatus: document.querySelector('.jp-Notebook-ExecutionIndicator')?.getAttribute('data-status') ?? null,
  };
}

const snapshot = () => page.evaluate(snapshotInPage, TRAIN_NEEDLE);
const stepOf = (progress) => Number(/step (\d+)/.exec(progress || '')?.[1] ?? NaN);

async function shot(name) {
  const file = path.join(ARTIFACTS, name);
  await page.screenshot({ path: file, timeout: 15000 });
  log(`screenshot ${file}`);
}

async function notebookSession(name = NB_NAME) {
  const sessions = await api('/api/sessions');
  return sessions.find((s) => s.path === name || s.path?.endsWith(`/${name}`));
}

/** Ctrl+S in the page, then the notebook as the server has it (also written to ARTIFACTS/`artifact`). */
async function saveNotebook(name, artifact) {
  const before = (await api(`/api/contents/${name}?content=0`)).last_modified;
  await page.locator('.jp-NotebookPanel .jp-Notebook').first().click({ position: { x: 5, y: 5 } }).catch(() => {});
  await page.keyboard.press('Control+s');
  // Poll metadata only until the save is done (the file's time changed and then held still for
  // a second), then read the content once: jupyter_server reading a notebook in the middle of its
  // own atomic save fails and "restores" the backup over it, which lost the file in one run.
  let seen = null;
  await waitFor('JupyterLab to save the notebook', 30, async () => {
    const t = (await api(`/api/contents/${name}?content=0`)).last_modified;
    const done = t !== before && t === seen;
    seen = t;
    return done;
  }, 1000);
  const saved = (await api(`/api/contents/${name}?content=1`)).content;
  fs.writeFileSync(path.join(ARTIFACTS, artifact), JSON.stringify(saved, null, 1));
  return saved;
}

/** Opens notebook `name` at `url`, waits for its trainbook kernel to be idle, and clicks
 *  Run › Run All Cells. */
async function openAndRunAll(name, url) {
  await page.goto(url, { timeout: 60000 });
  await page.locator('.jp-NotebookPanel .jp-Notebook .jp-Cell').first().waitFor({ timeout: 90000 });

  // The notebook's metadata names the kernel, so JupyterLab starts it without asking.
  const session = await waitFor(`the trainbook kernel of ${name} to be idle`, 180, async () => {
    const s = await notebookSession(name);
    return s?.kernel && s.kernel.execution_state === 'idle' && s;
  });
  check(session.kernel.name === KERNEL, `${name} runs kernel "${session.kernel.name}", expected "${KERNEL}"`);
  await waitFor('the kernel to show as idle in the page', 60, async () => (await snapshot()).kernelStatus === 'idle');
  log(`${name}: kernel ${session.kernel.name} ${session.kernel.id} idle`);

  // Run All from the menu, as a user would.
  await page.locator('#jp-MainMenu .lm-MenuBar-item', { hasText: /^Run$/ }).click();
  await page.locator('.lm-Menu .lm-Menu-item', { hasText: /^Run All Cells/ }).click();
  log(`${name}: Run > Run All Cells`);
}

async function run() {
  fs.mkdirSync(ARTIFACTS, { recursive: true });
  // Stale artifacts from an earlier run would mislead.
  for (const f of ['training.png', 'final.png', 'failure.png', 'samples.json', 'bert.executed.ipynb', 'jupyterlab.log',
    'sweep-running.png', 'sweep-final.png', 'sweep-samples.json', 'sweep.executed.ipynb']) {
    fs.rmSync(path.join(ARTIFACTS, f), { force: true });
  }
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'trainbook-browser-'));
  const nbdir = path.join(tmp, 'notebooks');
  const runsRoot = path.join(tmp, 'runs');
  fs.mkdirSync(nbdir);
  // The server starts while the notebook is prepared: both take seconds.
  await spawnServer(path.join(tmp, 'jupyter'), nbdir);
  prepareNotebook(nbdir, runsRoot);
  log(`notebook ${path.join(nbdir, NB_NAME)} with ${PARAMS.map(([name, value]) => `${name}=${value}`).join(' ')}`);
  await waitForServer(path.join(tmp, 'jupyter'));

  browser = await chromium.launch({
    executablePath: CHROMIUM,
    timeout: 60000,
    // /dev/shm is small in containers; no GPU here.
    args: ['--disable-dev-shm-usage', '--disable-gpu'],
  });
  page = await browser.newPage({ viewport: { width: 1280, height: 1000 } });
  page.setDefaultTimeout(30000);
  page.on('pageerror', (e) => log(`page error: ${e.message}`));

  await openAndRunAll(NB_NAME, `${base}/lab/tree/${NB_NAME}?token=${token}`);

  const samples = [];
  let training = null; // samples while the dashboard says "running"
  let shotTaken = false;
  let firstDashAt = null;
  let processesSeen = [];
  const end = Date.now() + 600 * 1000;
  let s;
  for (;;) {
    s = await snapshot();
    s.t = Number(since());
    const d = s.dash;
    samples.push({ t: s.t, prompt: s.train?.prompt, outputs: s.train?.outputs, dashboards: d?.count ?? 0, status: d?.status, progress: d?.progress, plot: d?.plot, plotPoints: d?.plotPoints });
    const errored = s.cells.filter((c) => c.errors > 0);
    check(errored.length === 0, `error output in cell ${errored[0]?.index}: ${errored[0]?.text}`, s);
    if (d) {
      if (firstDashAt === null) {
        firstDashAt = s.t;
        log(`dashboard appeared: ${d.progress}`);
        await page.locator('.trainbook-dashboard').first().scrollIntoViewIfNeeded().catch(() => {});
      }
      // In place: from its first appearance the training cell holds exactly one output, the dashboard.
      check(s.train.outputs === 1 && d.count === 1, `training cell has ${s.train.outputs} outputs and ${d.count} dashboards at ${s.t}s, expected 1 and 1`, s);
      check(d.status !== 'failed' && d.status !== 'stopped', `the job ${d.status}: ${d.text}`, s);
      if (d.status === 'running') {
        training ??= [];
        training.push(s);
        if (processesSeen.length === 0) processesSeen = markedProcesses();
        const distinct = new Set(training.map((x) => x.dash.plot)).size;
        if (!shotTaken && distinct >= 3) {
          shotTaken = true;
          await shot('training.png');
        }
      }
    } else if (firstDashAt !== null) {
      check(false, `the dashboard disappeared from the training cell at ${s.t}s`, s);
    }
    const allRan = s.cells.length > 0 && s.cells.every((c) => /^\[\d+\]:$/.test(c.prompt));
    if (allRan && d?.status === 'succeeded' && s.kernelStatus === 'idle') {
      const sess = await notebookSession();
      if (sess?.kernel?.execution_state === 'idle') break;
    }
    if (allRan && !d) check(false, 'every cell ran but the training cell shows no dashboard', s);
    if (Date.now() > end) check(false, 'timed out after 600 s waiting for the notebook to finish', s);
    await sleep(SAMPLE_MS);
  }
  writeJson(path.join(ARTIFACTS, 'samples.json'), samples);
  log(`all ${s.cells.length} code cells ran; ${samples.length} samples, ${training?.length ?? 0} while running`);

  // ---- the dashboard updated in place while training ----
  check(training && training.length >= 4, `too few samples while the job was running (${training?.length ?? 0}); the run is too short to observe`, samples);
  const plots = training.filter((x) => x.dash.plot !== null);
  const distinctPlots = new Set(plots.map((x) => x.dash.plot));
  check(distinctPlots.size >= 3, `the plot changed only ${distinctPlots.size - 1} times while running (want >= 2)`, samples);
  // Compare from the first sample that has a step (before it: "waiting for workers").
  const first = plots.find((x) => Number.isFinite(stepOf(x.dash.progress)));
  const later = plots.find((x) => x.t - first.t >= 2 && x.dash.plot !== first.dash.plot && stepOf(x.dash.progress) > stepOf(first.dash.progress));
  check(later, `no two running samples >= 2 s apart with different plot and step (first at ${first?.t}s: ${first?.dash.progress})`, samples);
  log(`in place: ${first.t}s "${first.dash.progress}" (${first.dash.plotPoints} points) -> ${later.t}s "${later.dash.progress}" (${later.dash.plotPoints} points); ${distinctPlots.size} plot states, always 1 output`);
  check(shotTaken, 'no screenshot taken during training');

  // ---- the final view ----
  const d = s.dash;
  check(d.status === 'succeeded', `final status ${d.status}`, s);
  check(d.progress.includes('100%'), `final progress is not 100%: ${d.progress}`, s);
  check(d.checkpoint?.startsWith(runsRoot), `final view names no checkpoint under ${runsRoot}: ${d.checkpoint}`, s);
  check(d.runDir?.startsWith(runsRoot), `final view names no run directory under ${runsRoot}: ${d.runDir}`, s);
  check(d.tableRows === EPOCHS, `metrics table has ${d.tableRows} rows, expected ${EPOCHS} (one per epoch)`, s);
  check(d.plot && d.plot !== first.dash.plot, 'the final view has no plot, or the first running one', s);
  check(d.foldedLogs, 'a succeeded run should fold its worker logs into <details>', s);
  const acc = d.metrics.find(([k]) => /accuracy/.test(k));
  check(acc && Number(acc[1]) >= 0 && Number(acc[1]) <= 1, `final metrics show no accuracy in [0, 1]: ${JSON.stringify(d.metrics)}`, s);
  check(s.train.outputs === 1, `training cell ends with ${s.train.outputs} outputs`, s);
  log(`final view: ${d.progress}; ${d.metrics.map(([k, v]) => `${k} ${v}`).join(', ')}; ${d.tableRows} epoch rows; checkpoint ${d.checkpoint}`);
  await page.locator('.trainbook-dashboard').first().scrollIntoViewIfNeeded().catch(() => {});
  await shot('final.png');

  // ---- the notebook model as saved by JupyterLab: no error outputs, one display in the training cell ----
  const saved = await saveNotebook(NB_NAME, 'bert.executed.ipynb');
  const code = saved.cells.filter((c) => c.cell_type === 'code');
  const bad = code.flatMap((c) => c.outputs.filter((o) => o.output_type === 'error' || (o.output_type === 'stream' && o.name === 'stderr')));
  check(bad.length === 0, `saved notebook has error outputs: ${JSON.stringify(bad).slice(0, 2000)}`);
  check(code.every((c) => Number.isInteger(c.execution_count)), 'saved notebook has code cells that did not run');
  const trainCell = code.find((c) => [].concat(c.source).join('').includes(TRAIN_NEEDLE));
  check(trainCell.outputs.length === 1 && trainCell.outputs[0].output_type === 'display_data', `saved training cell outputs: ${trainCell.outputs.map((o) => o.output_type).join(', ')}`);
  const html = [].concat(trainCell.outputs[0].data['text/html']).join('');
  check(html.includes('trainbook-dashboard') && html.includes('succeeded'), 'saved training output is not the finished dashboard');
  log(`saved notebook: ${code.length} code cells, no error outputs, training cell = 1 display_data (final dashboard)`);
  log(`processes under the server during training: ${processesSeen.map((p) => p.comm).join(', ')}`);

  await runSweep(nbdir, runsRoot);
}

/** The sweep view, read from the DOM in one task: the sweep cell's outputs (the first one marked
 *  on first sight, so that a replaced element shows), the view's summary, best line, footer, plot
 *  and every trial row's status; and the dashboard of the cell that shows one trial. */
function sweepSnapshotInPage(needle) {
  const hash = (s) => {
    let h = 5381;
    for (let i = 0; i < s.length; i++) h = ((h * 33) ^ s.charCodeAt(i)) >>> 0;
    return h.toString(16);
  };
  const panels = document.querySelectorAll('.jp-NotebookPanel');
  const cells = [...document.querySelectorAll('.jp-Notebook .jp-Cell.jp-CodeCell')].map((c, index) => {
    const area = c.querySelector('.jp-OutputArea');
    return {
      index,
      node: c,
      area,
      source: c.querySelector('.jp-InputArea-editor')?.textContent ?? '',
      prompt: (c.querySelector('.jp-InputArea-prompt')?.textContent ?? '').trim(),
      outputs: area ? area.querySelectorAll(':scope > .jp-OutputArea-child').length : 0,
      errors: c.querySelectorAll('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]').length,
      text: area ? area.innerText.slice(0, 3000) : '',
    };
  });
  const launch = cells.find((c) => c.source.includes(needle));
  let mark = null;
  let view = null;
  if (launch?.area) {
    const first = launch.area.querySelector(':scope > .jp-OutputArea-child');
    if (first) {
      first.dataset.trainbookTestMark ??= Math.random().toString(36).slice(2);
      mark = first.dataset.trainbookTestMark;
    }
    const roots = launch.node.querySelectorAll('.trainbook-sweep');
    const v = roots[0];
    if (v) {
      const table = v.querySelector('table.trainbook-sweep-table');
      const heads = table ? [...table.querySelectorAll('thead th')].map((th) => th.textContent.trim()) : [];
      const col = heads.indexOf('status');
      const rows = table ? [...table.querySelectorAll('tbody tr')].map((tr) => {
        const first = tr.children[0]?.textContent ?? '';
        return {
          id: Number(/(\d+)\s*$/.exec(first)?.[1] ?? NaN),
          starred: first.includes('★'),
          lr: tr.children[1]?.textContent.trim() ?? '',
          // "✓ succeeded": the status without its symbol.
          status: (tr.children[col]?.textContent ?? '').trim().replace(/^\S+\s+/, ''),
        };
      }) : [];
      const lines = [...v.children].filter((e) => e.tagName === 'DIV').map((e) => e.textContent.trim());
      const svg = v.querySelector('.trainbook-plot svg');
      view = {
        count: roots.length,
        title: lines[0] ?? '',
        summary: v.querySelector('.trainbook-sweep-summary')?.textContent.trim() ?? '',
        best: lines.find((l) => l.startsWith('★ best: '))?.replace(/^★\s*/, '') ?? null,
        footer: lines.find((l) => / · results in /.test(l)) ?? null,
        statusColumn: col,
        rows,
        plot: svg ? hash(svg.innerHTML) : null,
        foldedLogs: v.querySelector('details .trainbook-logs') !== null,
        text: v.innerText,
      };
    }
  }
  const shown = cells.find((c) => c.source.includes('sweep.trial('));
  const dashboards = shown ? shown.node.querySelectorAll('.trainbook-dashboard') : [];
  return {
    panels: panels.length,
    cells: cells.map(({ node, area, ...rest }) => ({ ...rest, source: rest.source.slice(0, 80) })),
    launch: launch ? { index: launch.index, prompt: launch.prompt, outputs: launch.outputs } : null,
    mark,
    view,
    trial: dashboards.length
      ? { count: dashboards.length, status: dashboards[0].querySelector('.trainbook-progress span')?.textContent ?? '', text: dashboards[0].innerText.slice(0, 2000) }
      : null,
    kernelStatus: document.querySelector('.jp-Notebook-ExecutionIndicator')?.getAttribute('data-status') ?? null,
  };
}

/** notebooks/sweep.ipynb in a page of its own: one view in the sweep cell whose trial table
 *  changes in place until every trial has succeeded or was pruned. */
async function runSweep(nbdir, runsRoot) {
  // The BERT notebook's kernel is done: shut it down so that the sweep's trials have the cores.
  const old = await notebookSession(NB_NAME);
  if (old) await api(`/api/sessions/${old.id}`, { method: 'DELETE', timeoutMs: 30000 });
  prepareNotebook(nbdir, runsRoot, { notebook: SWEEP_NOTEBOOK, name: SWEEP_NB, params: SWEEP_PARAMS, needle: SWEEP_NEEDLE });
  log(`notebook ${path.join(nbdir, SWEEP_NB)} with ${SWEEP_PARAMS.map(([name, value]) => `${name}=${value}`).join(' ')}`);
  // A new page in a workspace of its own, so that only this notebook is open (the default
  // workspace would reopen bert.ipynb and start its kernel again).
  await page.close();
  page = await browser.newPage({ viewport: { width: 1280, height: 1000 } });
  page.setDefaultTimeout(30000);
  page.on('pageerror', (e) => log(`page error: ${e.message}`));
  await openAndRunAll(SWEEP_NB, `${base}/lab/workspaces/sweep/tree/${SWEEP_NB}?token=${token}`);

  const snap = () => page.evaluate(sweepSnapshotInPage, SWEEP_NEEDLE);
  const samples = [];
  const running = []; // samples while the sweep had not finished
  const history = new Map(); // trial -> the statuses it was seen in, in order
  let first = null;
  let shotTaken = false;
  const end = Date.now() + 600 * 1000;
  let s;
  for (;;) {
    s = await snap();
    s.t = Number(since());
    const v = s.view;
    samples.push({ t: s.t, prompt: s.launch?.prompt, outputs: s.launch?.outputs, views: v?.count ?? 0, mark: s.mark, summary: v?.summary, statuses: v?.rows.map((r) => `${r.id}:${r.status}`).join(' '), plot: v?.plot });
    check(s.panels === 1, `${s.panels} notebooks open, expected only ${SWEEP_NB}`, s);
    const errored = s.cells.filter((c) => c.errors > 0);
    check(errored.length === 0, `error output in cell ${errored[0]?.index}: ${errored[0]?.text}`, s);
    if (v) {
      if (first === null) {
        first = s;
        log(`sweep view appeared: ${v.summary}`);
        await page.locator('.trainbook-sweep').first().scrollIntoViewIfNeeded().catch(() => {});
      }
      // In place: one output from the view's first appearance on, the same element throughout.
      check(s.launch.outputs === 1 && v.count === 1, `the sweep cell has ${s.launch.outputs} outputs and ${v.count} sweep views at ${s.t}s, expected 1 and 1`, s);
      check(s.mark === first.mark, `the sweep cell's output element was replaced at ${s.t}s (an update should redraw it in place)`, s);
      check(v.statusColumn > 0 && v.rows.length === SWEEP_TRIALS, `the sweep table has ${v.rows.length} rows (status column ${v.statusColumn}), expected ${SWEEP_TRIALS}`, s);
      const bad = v.rows.find((r) => r.status === 'failed' || r.status === 'stopped');
      check(!bad, `trial ${bad?.id} ${bad?.status}: ${v.text}`, s);
      for (const r of v.rows) {
        const h = history.get(r.id) ?? [];
        if (h.at(-1) !== r.status) h.push(r.status);
        history.set(r.id, h);
      }
      if (!v.summary.includes('finished after')) {
        running.push(s);
        const finished = v.rows.filter((r) => r.status === 'succeeded' || r.status === 'pruned').length;
        if (!shotTaken && finished > 0 && v.rows.some((r) => r.status === 'running')) {
          shotTaken = true;
          await shot('sweep-running.png');
        }
      }
    } else if (first !== null) {
      check(false, `the sweep view disappeared from its cell at ${s.t}s`, s);
    }
    const allRan = s.cells.length > 0 && s.cells.every((c) => /^\[\d+\]:$/.test(c.prompt));
    if (allRan && v?.footer?.startsWith('succeeded') && s.trial && s.kernelStatus === 'idle') {
      const sess = await notebookSession(SWEEP_NB);
      if (sess?.kernel?.execution_state === 'idle') break;
    }
    if (allRan && !v) check(false, 'every cell ran but the sweep cell shows no sweep view', s);
    if (Date.now() > end) check(false, 'timed out after 600 s waiting for the sweep notebook to finish', s);
    await sleep(SAMPLE_MS);
  }
  writeJson(path.join(ARTIFACTS, 'sweep-samples.json'), samples);
  log(`sweep notebook: all ${s.cells.length} code cells ran; ${samples.length} samples, ${running.length} while the sweep ran`);

  // ---- the table changed in place while the sweep ran ----
  const summaries = new Set(running.map((x) => x.view.summary.replace(/ · elapsed .*/, '')));
  check(running.length >= 4 && summaries.size >= 3, `the sweep was seen running in ${running.length} samples with ${summaries.size} distinct summaries (want >= 4 and >= 3)`, samples);
  const moved = [...history].filter(([, h]) => h.some((x) => x === 'pending' || x === 'running') && ['succeeded', 'pruned'].includes(h.at(-1)));
  check(moved.length >= 2, `fewer than 2 trials were seen going from pending/running to succeeded/pruned: ${JSON.stringify([...history])}`, samples);
  const story = moved.map(([id, h]) => `trial ${id}: ${h.join(' → ')}`);
  log(`in place, one output throughout: ${story.slice(0, 3).join('; ')}${story.length > 3 ? `; ... (${story.length} trials)` : ''}`);
  log(`summaries while running: ${[...summaries].join(' | ')}`);
  check(shotTaken, 'no screenshot of the sweep with a finished and a running trial');

  // ---- the final view ----
  const v = s.view;
  check(/^\d+ succeeded · \d+ pruned · finished after /.test(v.summary), `final summary: ${v.summary}`, s);
  check(v.rows.every((r) => r.status === 'succeeded' || r.status === 'pruned'), `final statuses: ${v.rows.map((r) => r.status).join(', ')}`, s);
  for (const r of v.rows.filter((r) => r.lr === '1')) check(r.status === 'pruned', `trial ${r.id} (lr=1, diverging) is ${r.status}, expected pruned`, s);
  const best = /^best: trial (\d+) \(lr=\S+, warmup_ratio=\S+\) eval_loss \d\.\d{4}$/.exec(v.best ?? '');
  check(best, `the final view names no best trial: ${v.best}`, s);
  const starred = v.rows.filter((r) => r.starred);
  check(starred.length === 1 && starred[0].id === Number(best[1]) && starred[0].status === 'succeeded', `starred rows ${JSON.stringify(starred)}, best line ${v.best}`, s);
  check(v.footer?.startsWith(`succeeded · results in ${runsRoot}`), `final footer: ${v.footer}`, s);
  check(v.plot && v.plot !== first.view.plot, 'the final view has no plot, or the first one', s);
  check(v.foldedLogs, 'a sweep without failed trials should fold its worker logs into <details>', s);
  check(s.trial?.count === 1 && s.trial.status.includes('succeeded'), `the trial's own dashboard: ${JSON.stringify(s.trial)}`, s);
  log(`final sweep view: ${v.summary}; ${v.best}; ${v.footer}`);
  await page.locator('.trainbook-sweep').first().scrollIntoViewIfNeeded().catch(() => {});
  await shot('sweep-final.png');

  // ---- as saved: no error outputs, one display in the sweep cell, the finished view ----
  const saved = await saveNotebook(SWEEP_NB, 'sweep.executed.ipynb');
  const code = saved.cells.filter((c) => c.cell_type === 'code');
  const bad = code.flatMap((c) => c.outputs.filter((o) => o.output_type === 'error' || (o.output_type === 'stream' && o.name === 'stderr')));
  check(bad.length === 0, `saved sweep notebook has error outputs: ${JSON.stringify(bad).slice(0, 2000)}`);
  check(code.every((c) => Number.isInteger(c.execution_count)), 'saved sweep notebook has code cells that did not run');
  const cell = code.find((c) => [].concat(c.source).join('').includes(SWEEP_NEEDLE));
  check(cell.outputs.length === 1 && cell.outputs[0].output_type === 'display_data', `saved sweep cell outputs: ${cell.outputs.map((o) => o.output_type).join(', ')}`);
  const html = [].concat(cell.outputs[0].data['text/html']).join('');
  check(html.includes('trainbook-sweep') && html.includes('succeeded · results in'), 'saved sweep output is not the finished view');
  log(`saved sweep notebook: ${code.length} code cells, no error outputs, sweep cell = 1 display_data (final view)`);
}

// ---- cleanup: kernels through the API, then the server, then anything left with our marker ----
let cleaned = false;
async function cleanup() {
  if (cleaned) return [];
  cleaned = true;
  const problems = [];
  if (browser) await browser.close().catch(() => {});
  if (server && !serverExit && base) {
    try {
      for (const s of await api('/api/sessions')) await api(`/api/sessions/${s.id}`, { method: 'DELETE', timeoutMs: 30000 });
      for (const k of await api('/api/kernels')) await api(`/api/kernels/${k.id}`, { method: 'DELETE', timeoutMs: 30000 });
      await api('/api/shutdown', { method: 'POST', timeoutMs: 30000 }).catch(() => {});
    } catch (e) {
      problems.push(`shutting down through the API failed: ${e.message}`);
    }
  }
  if (server) {
    const exited = async (s) => { const end = Date.now() + s * 1000; while (!serverExit && Date.now() < end) await sleep(200); return !!serverExit; };
    for (const [sig, wait] of [[null, 20], ['SIGTERM', 10], ['SIGKILL', 5]]) {
      if (sig) {
        problems.push(`JupyterLab did not exit; sent ${sig}`);
        try { process.kill(-server.pid, sig); } catch {}
      }
      if (await exited(wait)) break;
    }
  }
  // Kernel, compilers and workers must be gone too.
  let left = markedProcesses();
  for (let i = 0; i < 50 && left.length; i++) {
    await sleep(200);
    left = markedProcesses();
  }
  if (left.length) {
    problems.push(`orphaned processes after shutdown: ${left.map((p) => `${p.pid} ${p.comm}`).join(', ')}; killed`);
    for (const p of left) try { process.kill(p.pid, 'SIGKILL'); } catch {}
  }
  serverLogFile?.end();
  if (tmp && process.env.TRAINBOOK_BROWSER_KEEP !== '1') fs.rmSync(tmp, { recursive: true, force: true });
  else if (tmp) log(`kept ${tmp}`);
  return problems;
}

async function main() {
  let failure = null;
  const watchdog = setTimeout(() => {
    failure ??= new TestFailure(`the whole test exceeded ${TOTAL_S} s`);
    finish(failure);
  }, TOTAL_S * 1000);
  for (const sig of ['SIGINT', 'SIGTERM']) process.once(sig, () => finish(new TestFailure(`interrupted (${sig})`)));
  try {
    await run();
  } catch (e) {
    failure = e;
  }
  clearTimeout(watchdog);
  await finish(failure);
}

let finishing = false;
async function finish(failure) {
  if (finishing) return;
  finishing = true;
  if (failure) {
    console.error(`\nFAIL: ${failure.message}`);
    if (!(failure instanceof TestFailure)) console.error(failure.stack);
    if (page) {
      await page.screenshot({ path: path.join(ARTIFACTS, 'failure.png'), timeout: 10000 }).catch(() => {});
      const s = await snapshot().catch(() => failure.detail);
      if (s?.cells) {
        console.error('\n--- cell outputs ---');
        for (const c of s.cells) {
          // 40 lines a cell is enough to see an error; the plot's axis labels would flood it.
          const lines = c.text ? c.text.split('\n') : ['(no output)'];
          const shown = lines.slice(0, 40).concat(lines.length > 40 ? [`... ${lines.length - 40} more lines`] : []);
          console.error(`cell ${c.index} ${c.prompt} ${c.source}\n${shown.map((l) => `    ${l}`).join('\n')}`);
        }
      }
    }
    console.error(`\n--- JupyterLab log (last 60 lines; all in ${path.join(ARTIFACTS, 'jupyterlab.log')}) ---`);
    console.error(serverLog.slice(-60).join('\n'));
  }
  const problems = await cleanup();
  for (const p of problems) console.error(`cleanup: ${p}`);
  const ok = !failure && problems.length === 0;
  console.log(`${ok ? 'PASS' : 'FAIL'} browser dashboard test in ${since()} s; artifacts in ${ARTIFACTS}`);
  process.exit(ok ? 0 : 1);
}

main();
