// Drives real VS Code (code-server, in Debian's Chromium via playwright-core) with the packaged specls
// extension against the fake server over TCP (specls.teamServer) with a scripted next edit:
//   install the .vsix, open a Python file from the Explorer, type a line at the top, wait for the next
//   edit's decorations, Tab (jump), Tab (apply), save, read the file.
// Environment (all required): CODE_SERVER, CHROMIUM, VSIX, E2E_WORKSPACE (a folder holding E2E_FILE),
// E2E_FILE, E2E_TEAM_SERVER (host:port of the fake server), E2E_RUN_DIR (fresh dir for HOME, XDG and user
// data), E2E_ARTIFACTS (screenshots), E2E_RESULT (JSON written here), E2E_TIMEOUT_MS.
// Result: { ok, error?, removed (the struck-through text), added (the decoration's text), before, after, log }.
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
const tag = 'vscode-next-edit';
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

/** The decorations in the editor: the struck-through text and every injected/after text. */
function decorations(page) {
    return page.evaluate(() => {
        const removed = [];
        const injected = [];
        for (const span of document.querySelectorAll('.editor-instance .view-lines span span')) {
            const style = getComputedStyle(span);
            if (style.textDecorationLine.includes('line-through')) removed.push(span.textContent);
            const after = getComputedStyle(span, '::after').content;
            if (after && after !== 'none' && after !== 'normal') injected.push(after.replace(/^"|"$/g, ''));
            if (/ced-/.test(span.className)) injected.push(span.textContent);
        }
        return { removed: removed.join(''), injected: injected.join('|') };
    });
}

async function main() {
    const runDir = env('E2E_RUN_DIR');
    const artifacts = env('E2E_ARTIFACTS');
    const workspace = env('E2E_WORKSPACE');
    const file = path.join(workspace, env('E2E_FILE'));
    const timeout = Number(process.env.E2E_TIMEOUT_MS || 60000);
    fs.mkdirSync(artifacts, { recursive: true });
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
        PATH: `${path.dirname(process.execPath)}${path.delimiter}${process.env.PATH}`,
    };
    const cs = env('CODE_SERVER');
    const common = ['--user-data-dir', dirs['user-data'], '--extensions-dir', dirs.extensions];
    execFileSync(cs, [...common, '--install-extension', env('VSIX')], {
        env: childEnv,
        stdio: ['ignore', 'pipe', 'pipe'],
        timeout: 120000,
    });
    log('installed the vsix');
    fs.mkdirSync(path.join(dirs['user-data'], 'User'), { recursive: true });
    const settings = {
        'specls.teamServer': env('E2E_TEAM_SERVER'),
        // no inline completions here: Tab goes to the next edit when no inline suggestion shows
        'editor.inlineSuggest.enabled': false,
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
    fs.writeFileSync(path.join(dirs['user-data'], 'User', 'settings.json'), JSON.stringify(settings, null, 2));
    const configFile = path.join(runDir, 'code-server.yaml');
    fs.writeFileSync(configFile, 'auth: none\ncert: false\n');

    const port = await freePort();
    const server = spawn(
        cs,
        [
            '--auth', 'none', '--bind-addr', `127.0.0.1:${port}`, '--disable-telemetry', '--disable-update-check',
            '--disable-workspace-trust', '--disable-getting-started-override', '--config', configFile,
            ...common, workspace,
        ],
        { env: childEnv, stdio: ['ignore', 'pipe', 'pipe'], detached: true },
    );
    const serverLog = fs.createWriteStream(path.join(artifacts, `${tag}-code-server.log`));
    server.stdout.pipe(serverLog);
    server.stderr.pipe(serverLog);
    let browser;
    let page;
    try {
        let up = false;
        for (let i = 0; i < 600 && !up; i++) {
            try {
                up = (await fetch(`http://127.0.0.1:${port}/healthz`)).ok;
            } catch {
                await sleep(100);
            }
        }
        if (!up) throw new Error('code-server did not answer within 60 s');
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
        const row = page.locator('.explorer-folders-view .monaco-list-row', { hasText: env('E2E_FILE') }).first();
        await row.waitFor({ timeout: 30000 });
        await row.click();
        const editor = page.locator('.editor-instance .monaco-editor').first();
        await editor.waitFor({ timeout: 30000 });
        await editor.locator('.view-lines').click();
        const status = page.locator('.statusbar-item', { hasText: 'specls' }).first();
        await status.locator('.codicon-sparkle').waitFor({ timeout });
        log('editor open, extension ready');

        // a change at the top: the next edit is asked for after it
        await page.keyboard.press('Control+Home');
        await page.keyboard.type('import math', { delay: 30 });
        await page.keyboard.press('Enter');
        const deadline = Date.now() + timeout;
        let seen = { removed: '', injected: '' };
        while (Date.now() < deadline && !(seen.removed && seen.injected.includes('math.pi'))) {
            await sleep(200);
            seen = await decorations(page);
        }
        result.removed = seen.removed;
        result.added = seen.injected;
        log(`decorations: ${JSON.stringify(seen)}`);
        await page.screenshot({ path: path.join(artifacts, `${tag}-shown.png`) });
        if (!seen.removed) throw new Error(`no next edit shown within ${timeout} ms`);

        const before = fs.readFileSync(file, 'utf8');
        result.before = before;
        await page.keyboard.press('Tab'); // jumps to the edit (the cursor is on another line)
        await sleep(300);
        await page.keyboard.press('Tab'); // applies it
        await sleep(300);
        await page.keyboard.press('Control+S');
        let after = before;
        for (let i = 0; i < 100 && after === before; i++) {
            await sleep(100);
            after = fs.readFileSync(file, 'utf8');
        }
        result.after = after;
        log(`saved: ${JSON.stringify(after)}`);
        await page.screenshot({ path: path.join(artifacts, `${tag}-applied.png`) });
        result.ok = true;
    } catch (e) {
        if (page) await page.screenshot({ path: path.join(artifacts, `${tag}-failure.png`) }).catch(() => {});
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
    }
}

main()
    .catch((e) => {
        result.error = String(e && e.stack ? e.stack : e);
        log(`FAIL: ${result.error}`);
    })
    .finally(() => {
        fs.writeFileSync(env('E2E_RESULT'), JSON.stringify(result));
        process.exit(0);
    });
