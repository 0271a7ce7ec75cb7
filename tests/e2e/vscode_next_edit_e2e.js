// Drives real VS Code (code-server, in Debian's Chromium via playwright-core) with the packaged specls
// extension against the fake server over TCP (specls.teamServer) with a scripted next edit:
//   install the .vsix, open a Python file from the Explorer, type a line at the top, wait for the next
//   edit's decorations, Tab (jump), Tab (apply), save, read the file.
// Environment (all required): CODE_SERVER, CHROMIUM, VSIX, E2E_WORKSPACE (a folder holding E2E_FILE),
// E2E_FILE, E2E_TEAM_SERVER (host:port of the fake server), E2E_RUN_DIR (fresh dir for HOME, XDG and user
// data), E2E_ARTIFACTS (screenshots), E2E_RESULT (JSON written here), E2E_TIMEOUT_MS.
// Result: { ok, error?, removed (the struck-through text), added (the decoration's text), before, after, log }.
'use strict';
const fs = require('fs');
const path = require('path');
const { QUIET_SETTINGS, env, log, result, runDriver, saveAndRead, sleep, withWorkbench } = require('./vscode_driver');

const tag = 'vscode-next-edit';

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
    const artifacts = env('E2E_ARTIFACTS');
    const file = path.join(env('E2E_WORKSPACE'), env('E2E_FILE'));
    const timeout = Number(process.env.E2E_TIMEOUT_MS || 60000);
    const settings = {
        ...QUIET_SETTINGS,
        'specls.teamServer': env('E2E_TEAM_SERVER'),
        // no inline completions here: Tab goes to the next edit when no inline suggestion shows
        'editor.inlineSuggest.enabled': false,
    };
    await withWorkbench({ settings, tag }, async (page) => {
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
        const after = await saveAndRead(page, file, before);
        result.after = after;
        log(`saved: ${JSON.stringify(after)}`);
        await page.screenshot({ path: path.join(artifacts, `${tag}-applied.png`) });
        result.ok = true;
    });
}

runDriver(main);
