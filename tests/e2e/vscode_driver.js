// The shared part of the VS Code e2e drivers (vscode_e2e.js, vscode_next_edit_e2e.js): the result and its
// log, a fresh HOME / XDG / user data with the .vsix installed, code-server started and stopped, the
// workbench in headless Chromium, a file opened from the Explorer, and the run that writes the result.
// Environment: CODE_SERVER, CHROMIUM, VSIX, E2E_RUN_DIR, E2E_ARTIFACTS, E2E_RESULT (see the drivers).
'use strict';
const { chromium } = require('playwright-core');
const { spawn, execFileSync } = require('child_process');
const fs = require('fs');
const net = require('net');
const path = require('path');

const env = (k) => {
    const v = process.env[k];
    if (!v) throw new Error(`missing environment variable ${k}`);
    return v;
};
const t0 = Date.now();
const result = { ok: false, log: [] };
const log = (m) => {
    const line = `${String(Date.now() - t0).padStart(6)} ms ${m}`;
    result.log.push(line);
    process.stderr.write(line + '\n');
};
const sleep = (n) => new Promise((r) => setTimeout(r, n));

// The editor settings every run shares: the other completion UIs out of the way of Tab, nothing that
// phones home or opens a page of its own.
const QUIET_SETTINGS = {
    'editor.quickSuggestions': { other: 'off', comments: 'off', strings: 'off' },
    'editor.suggestOnTriggerCharacters': false,
    'editor.wordBasedSuggestions': 'off',
    'editor.tabCompletion': 'off',
    'editor.autoIndent': 'none',
    'files.autoSave': 'off',
    'workbench.startupEditor': 'none',
    'workbench.tips.enabled': false,
    'workbench.enableExperiments': false,
    'security.workspace.trust.enabled': false,
    'extensions.autoUpdate': false,
    'extensions.autoCheckUpdates': false,
    'extensions.ignoreRecommendations': true,
    'telemetry.telemetryLevel': 'off',
    'update.mode': 'none',
    'chat.disableAIFeatures': true,
    'workbench.secondarySideBar.defaultVisibility': 'hidden',
};

function freePort() {
    return new Promise((resolve, reject) => {
        const s = net.createServer();
        s.listen(0, '127.0.0.1', () => {
            const port = s.address().port;
            s.close(() => resolve(port));
        });
        s.on('error', reject);
    });
}

function findFiles(dir, pattern) {
    const out = [];
    let entries = [];
    try {
        entries = fs.readdirSync(dir, { withFileTypes: true });
    } catch {
        return out;
    }
    for (const e of entries) {
        const p = path.join(dir, e.name);
        if (e.isDirectory()) out.push(...findFiles(p, pattern));
        else if (pattern.test(e.name)) out.push(p);
    }
    return out;
}

/** Fresh HOME / XDG / user data under E2E_RUN_DIR (nothing restored from an earlier run), the .vsix
 * installed and `settings` as the user's settings: what `startCodeServer` runs with. Makes E2E_ARTIFACTS. */
function prepareCodeServer(settings) {
    const runDir = env('E2E_RUN_DIR');
    fs.mkdirSync(env('E2E_ARTIFACTS'), { recursive: true });
    const dirs = {};
    for (const d of ['home', 'config', 'data', 'cache', 'state', 'user-data', 'extensions']) {
        dirs[d] = path.join(runDir, d);
        fs.mkdirSync(dirs[d], { recursive: true });
    }
    const childEnv = {
        ...process.env,
        HOME: dirs.home,
        XDG_CONFIG_HOME: dirs.config,
        XDG_DATA_HOME: dirs.data,
        XDG_CACHE_HOME: dirs.cache,
        XDG_STATE_HOME: dirs.state,
        // code-server's launcher is `#!/usr/bin/env node`: it needs this Node (24) first on PATH
        PATH: `${path.dirname(process.execPath)}${path.delimiter}${process.env.PATH}`,
    };
    const common = ['--user-data-dir', dirs['user-data'], '--extensions-dir', dirs.extensions];
    const t = Date.now();
    let out;
    try {
        out = execFileSync(env('CODE_SERVER'), [...common, '--install-extension', env('VSIX')], {
            env: childEnv,
            encoding: 'utf8',
            stdio: ['ignore', 'pipe', 'pipe'],
            timeout: 120000,
        });
    } catch (e) {
        throw new Error(`code-server --install-extension failed: ${String(e.stderr || e).slice(-2000)}`);
    }
    log(`installed the vsix in ${Date.now() - t} ms: ${out.trim().split('\n').pop()}`);
    result.install_ms = Date.now() - t;
    fs.mkdirSync(path.join(dirs['user-data'], 'User'), { recursive: true });
    fs.writeFileSync(path.join(dirs['user-data'], 'User', 'settings.json'), JSON.stringify(settings, null, 2));
    const configFile = path.join(runDir, 'code-server.yaml');
    fs.writeFileSync(configFile, 'auth: none\ncert: false\n');
    return { dirs, childEnv, common, configFile };
}

/** code-server on a free port serving `workspace` (its output in `${tag}-code-server.log`); `extraArgs`
 * go before the folder. Returns { server, port }; stop it with `stopCodeServer`. */
async function startCodeServer(prepared, workspace, tag, extraArgs = []) {
    const port = await freePort();
    const server = spawn(
        env('CODE_SERVER'),
        [
            '--auth', 'none',
            '--bind-addr', `127.0.0.1:${port}`,
            '--disable-telemetry',
            ...extraArgs,
            '--disable-update-check',
            '--disable-workspace-trust',
            '--disable-getting-started-override',
            '--config', prepared.configFile,
            ...prepared.common,
            workspace,
        ],
        { env: prepared.childEnv, stdio: ['ignore', 'pipe', 'pipe'], detached: true },
    );
    const serverLog = fs.createWriteStream(path.join(env('E2E_ARTIFACTS'), `${tag}-code-server.log`));
    server.stdout.pipe(serverLog);
    server.stderr.pipe(serverLog);
    return { server, port };
}

/** Wait until code-server answers HTTP (60 s at most). */
async function waitCodeServer(port) {
    const t = Date.now();
    let up = false;
    for (let i = 0; i < 600 && !up; i++) {
        try {
            up = (await fetch(`http://127.0.0.1:${port}/healthz`)).ok;
        } catch {
            await sleep(100);
        }
    }
    if (!up) throw new Error('code-server did not answer within 60 s');
    log(`code-server up on ${port} in ${Date.now() - t} ms`);
}

async function stopCodeServer(server) {
    try {
        process.kill(-server.pid, 'SIGTERM');
    } catch {}
    await sleep(500);
    try {
        process.kill(-server.pid, 'SIGKILL');
    } catch {}
}

function launchBrowser() {
    return chromium.launch({
        executablePath: env('CHROMIUM'),
        headless: true,
        args: [
            '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
            '--disable-background-networking', '--disable-component-update', '--disable-sync',
        ],
    });
}

/** A page showing code-server's workbench on `workspace`. */
async function openWorkbench(browser, port, workspace) {
    const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
    page.on('pageerror', (e) => log(`page error: ${e.message}`));
    await page.goto(`http://127.0.0.1:${port}/?folder=${encodeURIComponent(workspace)}`);
    await page.locator('.monaco-workbench').waitFor({ timeout: 60000 });
    log('workbench visible');
    return page;
}

/** Open `name` from the Explorer tree (Ctrl+P races the file index) and click into its text. */
async function openFile(page, name) {
    const row = page.locator('.explorer-folders-view .monaco-list-row', { hasText: name }).first();
    await row.waitFor({ timeout: 30000 });
    await row.click();
    const editor = page.locator('.editor-instance .monaco-editor').first();
    await editor.waitFor({ timeout: 30000 });
    await page.locator(`.tab.active[data-resource-name="${name}"]`).waitFor({ timeout: 30000 }).catch(() => {});
    await editor.locator('.view-lines').click();
    log('editor open');
    return editor;
}

/** Press Ctrl+S and read `file` until it is no longer `before` (10 s at most). */
async function saveAndRead(page, file, before) {
    await page.keyboard.press('Control+S');
    let after = before;
    for (let i = 0; i < 100 && after === before; i++) {
        await sleep(100);
        after = fs.readFileSync(file, 'utf8');
    }
    return after;
}

/** The run around `body(page)`: code-server prepared with `settings` (see `prepareCodeServer`) and
 * started on E2E_WORKSPACE (`serverArgs` added), the workbench open in Chromium with E2E_FILE. On a
 * failure `onFailure(page)`, then a screenshot `${tag}-failure.png`; in the end the browser and
 * code-server are stopped, then `after(prepared)`. */
async function withWorkbench({ settings, tag, serverArgs = [], onFailure = async () => {}, after = () => {} }, body) {
    const workspace = env('E2E_WORKSPACE');
    const prepared = prepareCodeServer(settings);
    const { server, port } = await startCodeServer(prepared, workspace, tag, serverArgs);
    let browser;
    let page;
    try {
        await waitCodeServer(port);
        browser = await launchBrowser();
        page = await openWorkbench(browser, port, workspace);
        await openFile(page, env('E2E_FILE'));
        await body(page);
    } catch (e) {
        if (page) {
            await onFailure(page);
            await page.screenshot({ path: path.join(env('E2E_ARTIFACTS'), `${tag}-failure.png`) }).catch(() => {});
        }
        throw e;
    } finally {
        if (browser) await browser.close().catch(() => {});
        await stopCodeServer(server);
        after(prepared);
    }
}

/** Run `main`, then write the result (a failure as its error) to E2E_RESULT and exit. */
function runDriver(main) {
    main()
        .catch((e) => {
            result.error = String(e && e.stack ? e.stack : e);
            log(`FAIL: ${result.error}`);
        })
        .finally(() => {
            fs.writeFileSync(env('E2E_RESULT'), JSON.stringify(result, null, 2));
            process.exit(0);
        });
}

module.exports = { QUIET_SETTINGS, env, findFiles, log, result, runDriver, saveAndRead, sleep, t0, withWorkbench };
