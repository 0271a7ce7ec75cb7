// Drives real VS Code (code-server, in Debian's Chromium via playwright-core) with the packaged specls
// extension against a real `specls serve`:
//   install the .vsix, open a Python file from the Explorer, type, wait for ghost text, Tab, save, read it.
// Environment (all required): CODE_SERVER, CHROMIUM, VSIX, SPECLS_BIN (the specls executable),
// E2E_WORKSPACE (a folder holding E2E_FILE), E2E_FILE (file name), E2E_TYPE (text to type at the end of the
// file), E2E_RUN_DIR (fresh dir for HOME, XDG and user data), E2E_ARTIFACTS (screenshots), E2E_RESULT (JSON
// written here), E2E_TIMEOUT_MS (for the ghost text); optional E2E_TEAM_SERVER (host:port), E2E_TAG,
// E2E_EXPECT_ERROR (the server cannot start: expect the error status and notification instead),
// E2E_OTHER_FILE (a file in a language that is not enabled: expect the disabled status there), E2E_MODEL
// (specls.model; the status bar texts seen until ready are in result.status_seen).
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
const tag = process.env.E2E_TAG || 'vscode';
const sleep = (n) => new Promise((r) => setTimeout(r, n));

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

async function main() {
    const runDir = env('E2E_RUN_DIR');
    const artifacts = env('E2E_ARTIFACTS');
    const workspace = env('E2E_WORKSPACE');
    const file = path.join(workspace, env('E2E_FILE'));
    const typed = env('E2E_TYPE');
    const timeout = Number(process.env.E2E_TIMEOUT_MS || 120000);
    fs.mkdirSync(artifacts, { recursive: true });

    // Fresh HOME / XDG / user data for this run: nothing restored from an earlier one.
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
    const cs = env('CODE_SERVER');
    const common = ['--user-data-dir', dirs['user-data'], '--extensions-dir', dirs.extensions];

    let t = Date.now();
    let out;
    try {
        out = execFileSync(cs, [...common, '--install-extension', env('VSIX')], {
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
    const settings = {
        'specls.serverPath': env('SPECLS_BIN'),
        // a team server over TCP instead of a local one over stdio
        'specls.teamServer': process.env.E2E_TEAM_SERVER || '',
        // a model given by name (E2E_MODEL, from a local hub): prepared on first use
        ...(process.env.E2E_MODEL ? { 'specls.model': process.env.E2E_MODEL } : {}),
        'specls.maxTokens': 24,
        // sent as they are: the test checks that the server knows each of them
        'specls.lineFirst': true,
        'specls.typeAhead': true,
        'specls.multiline': 'auto',
        'specls.trace.server': process.env.E2E_LOG_TRACE ? 'verbose' : 'off',
        'editor.inlineSuggest.enabled': true,
        // keep the other completion UIs out of the way of Tab
        'editor.quickSuggestions': { other: 'off', comments: 'off', strings: 'off' },
        'editor.suggestOnTriggerCharacters': false,
        'editor.wordBasedSuggestions': 'off',
        'editor.tabCompletion': 'off',
        'editor.autoClosingBrackets': 'never',
        'editor.autoClosingQuotes': 'never',
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
    fs.writeFileSync(path.join(dirs['user-data'], 'User', 'settings.json'), JSON.stringify(settings, null, 2));
    const configFile = path.join(runDir, 'code-server.yaml');
    fs.writeFileSync(configFile, 'auth: none\ncert: false\n');

    const port = await freePort();
    t = Date.now();
    const server = spawn(
        cs,
        [
            '--auth', 'none',
            '--bind-addr', `127.0.0.1:${port}`,
            '--disable-telemetry',
            ...(process.env.E2E_LOG_TRACE ? ['--log', 'trace'] : []),
            '--disable-update-check',
            '--disable-workspace-trust',
            '--disable-getting-started-override',
            '--config', configFile,
            ...common,
            workspace,
        ],
        { env: childEnv, stdio: ['ignore', 'pipe', 'pipe'], detached: true },
    );
    const serverLog = fs.createWriteStream(path.join(artifacts, `${tag}-code-server.log`));
    server.stdout.pipe(serverLog);
    server.stderr.pipe(serverLog);
    let browser;
    let page;
    try {
        // code-server is up when it answers HTTP.
        let up = false;
        for (let i = 0; i < 600 && !up; i++) {
            try {
                const r = await fetch(`http://127.0.0.1:${port}/healthz`);
                up = r.ok;
            } catch {
                await sleep(100);
            }
        }
        if (!up) throw new Error('code-server did not answer within 60 s');
        log(`code-server up on ${port} in ${Date.now() - t} ms`);

        browser = await chromium.launch({
            executablePath: env('CHROMIUM'),
            headless: true,
            args: [
                '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
                '--disable-background-networking', '--disable-component-update', '--disable-sync',
            ],
        });
        page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
        page.on('pageerror', (e) => log(`page error: ${e.message}`));
        await page.goto(`http://127.0.0.1:${port}/?folder=${encodeURIComponent(workspace)}`);
        await page.locator('.monaco-workbench').waitFor({ timeout: 60000 });
        log('workbench visible');

        // Open the file from the Explorer tree (Ctrl+P races the file index).
        const row = page.locator('.explorer-folders-view .monaco-list-row', { hasText: env('E2E_FILE') }).first();
        await row.waitFor({ timeout: 30000 });
        await row.click();
        const editor = page.locator('.editor-instance .monaco-editor').first();
        await editor.waitFor({ timeout: 30000 });
        await page.locator(`.tab.active[data-resource-name="${env('E2E_FILE')}"]`).waitFor({ timeout: 30000 }).catch(() => {});
        await editor.locator('.view-lines').click();
        log('editor open');

        // Wait for the extension: its status bar item leaves the loading state (or at least exists).
        // Wait for the extension: its status bar item shows plain "specls" (the ready icon) once the
        // server answered initialize and loaded the model; "specls: ..." while starting or loading.
        const status = page.locator('.statusbar-item', { hasText: 'specls' }).first();
        await status.waitFor({ timeout: 60000 });
        result.status_initial = (await status.innerText()).trim();
        log(`status bar: ${result.status_initial}`);
        if (process.env.E2E_EXPECT_ERROR) {
            // a broken setup: the status bar turns to error and a notification says what to fix
            await status.locator('.codicon-error').waitFor({ timeout: 60000 });
            result.status_error = (await status.innerText()).trim();
            const toast = page.locator('.notification-toast', { hasText: 'specls' }).first();
            await toast.waitFor({ timeout: 30000 });
            result.notification = (await toast.innerText()).trim();
            log(`error state: ${JSON.stringify(result.status_error)}, notification ${JSON.stringify(result.notification)}`);
            await page.screenshot({ path: path.join(artifacts, `${tag}.png`) });
            result.ok = true;
            return;
        }
        const ready = status.locator('.codicon-sparkle');
        // every text the status bar item shows until ready (a model being prepared: its steps)
        result.status_seen = [];
        const watch = setInterval(() => {
            status
                .innerText({ timeout: 1000 })
                .then((text) => {
                    const seen = result.status_seen;
                    if (text.trim() !== seen[seen.length - 1]) seen.push(text.trim());
                })
                .catch(() => {});
        }, 100);
        try {
            await ready.waitFor({ timeout });
        } catch {
            throw new Error(`the extension did not become ready: status "${(await status.innerText()).trim()}"`);
        } finally {
            clearInterval(watch);
        }
        result.ready_ms = Date.now() - t0;
        log('status bar: ready');

        await page.keyboard.press('Control+End');
        await page.keyboard.type(typed, { delay: 40 });
        log(`typed ${JSON.stringify(typed)}`);

        const ghost = page.locator('.ghost-text-decoration, .ghost-text');
        const deadline = Date.now() + timeout;
        let shown = false;
        while (!shown && Date.now() < deadline) {
            try {
                await ghost.first().waitFor({ state: 'visible', timeout: 5000 });
                shown = true;
            } catch {
                // retype the last character (an edit triggers inline suggestions), then the explicit trigger
                log('no ghost text yet; retyping the last character, then Alt+\\');
                await page.keyboard.press('Backspace');
                await page.keyboard.type(typed.slice(-1));
                await sleep(1000);
                await page.keyboard.press('Alt+Backslash');
            }
        }
        if (!shown) throw new Error(`no ghost text within ${timeout} ms`);
        result.ghost_ms = Date.now() - t0;
        await sleep(300); // let the decoration settle (multi-line ghost text renders a view zone)
        const inline = await page.locator('.ghost-text-decoration').allInnerTexts();
        const below = await page.locator('.ghost-text').allInnerTexts();
        const clean = (s) => s.replace(/\u00a0/g, ' ');
        result.ghost_inline = inline.map(clean);
        result.ghost_below = below.map(clean);
        log(`ghost text: ${JSON.stringify(result.ghost_inline)} + ${JSON.stringify(result.ghost_below)}`);
        result.status_ready = (await status.innerText()).trim();
        const shot = path.join(artifacts, `${tag}-ghost-text.png`);
        await page.screenshot({ path: shot });
        result.screenshot = shot;

        const before = fs.readFileSync(file, 'utf8');
        await page.keyboard.press('Tab');
        await sleep(300);
        await page.keyboard.press('Control+S');
        let after = before;
        for (let i = 0; i < 100 && after === before; i++) {
            await sleep(100);
            after = fs.readFileSync(file, 'utf8');
        }
        result.before = before;
        result.after = after;
        const shotAfter = path.join(artifacts, `${tag}-accepted.png`);
        await page.screenshot({ path: shotAfter });
        result.screenshot_accepted = shotAfter;
        log(`saved: ${JSON.stringify(after)}`);

        // The status bar tooltip: stats from specls/stats (polled every 5 s), the accept counted by the
        // server (the extension's specls/accepted notification).
        const tooltipBy = Date.now() + 30000;
        result.tooltip = '';
        while (!/suggestions accepted: [1-9]/.test(result.tooltip) && Date.now() < tooltipBy) {
            await page.mouse.move(0, 0);
            await sleep(500);
            await status.hover();
            const hover = page.locator('.monaco-hover, .workbench-hover').filter({ hasText: 'latency' }).first();
            result.tooltip = await hover.innerText({ timeout: 3000 }).catch(() => '');
        }
        log(`status tooltip: ${JSON.stringify(result.tooltip)}`);
        await page.screenshot({ path: path.join(artifacts, `${tag}-status-tooltip.png`) });

        // A file in a language that is not enabled (plain text): the status shows disabled; back in the
        // Python file it is ready again.
        const other = process.env.E2E_OTHER_FILE;
        if (other) {
            await page.locator('.explorer-folders-view .monaco-list-row', { hasText: other }).first().click();
            await page.locator(`.tab.active[data-resource-name="${other}"]`).waitFor({ timeout: 10000 });
            result.disabled_shown = await status
                .locator('.codicon-circle-slash')
                .waitFor({ timeout: 10000 })
                .then(() => true)
                .catch(() => false);
            log(`in ${other}: status ${JSON.stringify((await status.innerText()).trim())}, disabled icon ${result.disabled_shown}`);
            await page.screenshot({ path: path.join(artifacts, `${tag}-disabled.png`) });
            await page.locator('.explorer-folders-view .monaco-list-row', { hasText: env('E2E_FILE') }).first().click();
            result.ready_again = await status
                .locator('.codicon-sparkle')
                .waitFor({ timeout: 10000 })
                .then(() => true)
                .catch(() => false);
        }
        result.ok = true;
    } catch (e) {
        if (page) {
            result.status_at_failure = await page
                .locator('.statusbar-item', { hasText: 'specls' })
                .first()
                .innerText({ timeout: 2000 })
                .catch(() => '');
            await page.screenshot({ path: path.join(artifacts, `${tag}-failure.png`) }).catch(() => {});
        }
        throw e;
    } finally {
        if (browser) await browser.close().catch(() => {});
        try {
            process.kill(-server.pid, 'SIGTERM');
        } catch {}
        await sleep(500);
        try {
            process.kill(-server.pid, 'SIGKILL');
        } catch {}
        // the extension's log (output channel) and the extension host's (written out by now)
        for (const f of findFiles(path.join(dirs['user-data'], 'logs'), /(specls|exthost)\.log$/)) {
            fs.copyFileSync(f, path.join(artifacts, `${tag}-${path.basename(f)}`));
        }
    }
}

main()
    .catch((e) => {
        result.error = String(e && e.stack ? e.stack : e);
        log(`FAIL: ${result.error}`);
    })
    .finally(() => {
        fs.writeFileSync(env('E2E_RESULT'), JSON.stringify(result, null, 2));
        process.exit(0);
    });
