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
const fs = require('fs');
const path = require('path');
const { QUIET_SETTINGS, env, findFiles, log, result, runDriver, saveAndRead, sleep, t0, withWorkbench } =
    require('./vscode_driver');

const tag = process.env.E2E_TAG || 'vscode';

async function main() {
    const artifacts = env('E2E_ARTIFACTS');
    const file = path.join(env('E2E_WORKSPACE'), env('E2E_FILE'));
    const typed = env('E2E_TYPE');
    const timeout = Number(process.env.E2E_TIMEOUT_MS || 120000);
    const run = {
        tag,
        settings: {
            ...QUIET_SETTINGS,
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
            'editor.autoClosingBrackets': 'never',
            'editor.autoClosingQuotes': 'never',
        },
        serverArgs: process.env.E2E_LOG_TRACE ? ['--log', 'trace'] : [],
        onFailure: async (page) => {
            result.status_at_failure = await page
                .locator('.statusbar-item', { hasText: 'specls' })
                .first()
                .innerText({ timeout: 2000 })
                .catch(() => '');
        },
        // the extension's log (output channel) and the extension host's (written out by now)
        after: ({ dirs }) => {
            for (const f of findFiles(path.join(dirs['user-data'], 'logs'), /(specls|exthost)\.log$/)) {
                fs.copyFileSync(f, path.join(artifacts, `${tag}-${path.basename(f)}`));
            }
        },
    };
    await withWorkbench(run, async (page) => {
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
        const after = await saveAndRead(page, file, before);
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
    });
}

runDriver(main);
