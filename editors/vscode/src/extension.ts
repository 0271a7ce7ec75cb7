// specls for VS Code: inline completions from `specls serve` (stdio) or a team server (TCP).
import * as vscode from 'vscode';
import {
    LanguageClient,
    LanguageClientOptions,
    State,
    WorkDoneProgress,
    WorkDoneProgressCreateRequest,
} from 'vscode-languageclient/node';
import { NextEdits } from './nextEdit';
import { serverOptions, serverSettings, Settings } from './server';
import { StatusBar, summarize } from './status';

const ACCEPTED_COMMAND = 'specls.accepted';

let client: LanguageClient | undefined;
let status: StatusBar | undefined;
let output: vscode.LogOutputChannel | undefined;
let statsTimer: NodeJS.Timeout | undefined;

function readSettings(): Settings {
    const c = vscode.workspace.getConfiguration('specls');
    return {
        serverPath: c.get<string>('serverPath', ''),
        model: c.get<string>('model', ''),
        preset: c.get<string>('preset', ''),
        draft: c.get<string>('draft', ''),
        maxTokens: c.get<number>('maxTokens', 64),
        draftLength: c.get<number>('draftLength', 12),
        workspace: c.get<boolean>('workspace', false),
        datastore: c.get<string>('datastore', ''),
        featureHead: c.get<boolean>('featureHead', true),
        lineFirst: c.get<boolean>('lineFirst', true),
        typeAhead: c.get<boolean>('typeAhead', true),
        multiline: c.get<string>('multiline', 'auto'),
        enabledLanguages: c.get<string[]>('enabledLanguages', ['python']),
        teamServer: c.get<string>('teamServer', ''),
        teamToken: c.get<string>('teamToken', ''),
    };
}

function languageEnabled(settings: Settings, languageId: string | undefined): boolean {
    return (
        languageId !== undefined &&
        (settings.enabledLanguages.includes('*') || settings.enabledLanguages.includes(languageId))
    );
}

function documentSelector(settings: Settings): LanguageClientOptions['documentSelector'] {
    if (settings.enabledLanguages.includes('*')) {
        return [{ scheme: 'file' }, { scheme: 'untitled' }];
    }
    return settings.enabledLanguages.flatMap((language) => [
        { scheme: 'file', language },
        { scheme: 'untitled', language },
    ]);
}

/** Telemetry: the user accepted a suggestion (VS Code runs the item's command on accept). */
function sendAccepted(args: unknown): void {
    if (client?.state === State.Running) {
        client.sendNotification('specls/accepted', args ?? {}).catch((e: unknown) => output?.warn(`${e}`));
    }
}

async function pollStats(): Promise<void> {
    if (!client || client.state !== State.Running || !status || !vscode.window.state.focused) {
        return;
    }
    try {
        const stats = await client.sendRequest<Record<string, unknown>>('specls/stats', {});
        status.setStats(stats);
    } catch (e) {
        output?.debug(`specls/stats failed: ${e}`);
    }
}

/** Right after (re)start: ready only once the server says its model is loaded. A server without that
 * state in its stats (or without stats) counts as ready. */
async function settleAfterStart(): Promise<void> {
    if (!client || !status) {
        return;
    }
    try {
        const stats = await client.sendRequest<Record<string, unknown>>('specls/stats', {});
        status.setStats(stats);
        const state = summarize(stats).state;
        if (state === undefined || state === 'ready') {
            status.setReady();
        }
    } catch (e) {
        output?.debug(`specls/stats failed: ${e}`);
        status.setReady();
    }
}

/** The model finished loading: ask again for the editor the user is typing in (a request during the
 * load got nothing). */
function retriggerInlineSuggest(): void {
    const editor = vscode.window.activeTextEditor;
    if (editor && languageEnabled(readSettings(), editor.document.languageId)) {
        void vscode.commands.executeCommand('editor.action.inlineSuggest.trigger');
    }
}

function updateEnabledState(): void {
    if (!status) {
        return;
    }
    const languageId = vscode.window.activeTextEditor?.document.languageId;
    status.setDisabled(languageId !== undefined && !languageEnabled(readSettings(), languageId), languageId);
}

async function startClient(context: vscode.ExtensionContext): Promise<void> {
    const settings = readSettings();
    const folders = (vscode.workspace.workspaceFolders ?? []).map((f) => f.uri.fsPath);
    status!.setLoading('starting');
    let server;
    try {
        server = serverOptions(settings, folders, vscode.workspace.isTrusted);
    } catch (e) {
        const message = e instanceof Error ? e.message : String(e);
        status!.setError(message);
        output!.error(message);
        void vscode.window.showErrorMessage(message, 'Open Settings').then((choice) => {
            if (choice) {
                void vscode.commands.executeCommand('workbench.action.openSettings', 'specls.');
            }
        });
        return;
    }
    const clientOptions: LanguageClientOptions = {
        documentSelector: documentSelector(settings),
        outputChannel: output,
        initializationOptions: serverSettings(settings),
        middleware: {
            // Every suggestion carries a command so acceptance is reported; a command the server set is kept.
            provideInlineCompletionItems: async (document, position, ctx, token, next) => {
                const result = await next(document, position, ctx, token);
                const items = Array.isArray(result) ? result : (result?.items ?? []);
                for (const item of items) {
                    if (!item.command) {
                        const text = typeof item.insertText === 'string' ? item.insertText : item.insertText.value;
                        item.command = {
                            title: 'specls: accepted',
                            command: ACCEPTED_COMMAND,
                            arguments: [{ uri: document.uri.toString(), text, languageId: document.languageId }],
                        };
                    }
                }
                return result;
            },
        },
    };
    const c = new LanguageClient('specls', 'specls', server, clientOptions);
    client = c;
    c.onDidChangeState((e) => {
        if (client !== c) {
            return; // an old client being stopped for a restart
        }
        if (e.newState === State.Stopped) {
            status?.setError('server stopped (see the specls log)');
        } else if (e.newState === State.Running) {
            void settleAfterStart(); // also after the client restarted a crashed server
        }
    });
    try {
        await c.start();
    } catch (e) {
        const message = `specls failed to start: ${e instanceof Error ? e.message : String(e)}`;
        output!.error(message);
        status!.setError(message);
        return;
    }
    // Model-load progress: the server creates a work-done token and reports on it; show it in the status bar.
    c.onRequest(WorkDoneProgressCreateRequest.type, ({ token }) => {
        const sub = c.onProgress(WorkDoneProgress.type, token, (value) => {
            if (value.kind === 'end') {
                sub.dispose();
                void settleAfterStart().then(retriggerInlineSuggest);
            } else {
                status?.setLoading(value.message ?? value.kind, value.percentage);
            }
        });
        context.subscriptions.push(sub);
    });
    updateEnabledState();
    await settleAfterStart();
}

async function stopClient(): Promise<void> {
    const c = client;
    client = undefined;
    if (c) {
        try {
            await c.stop(2000);
        } catch (e) {
            output?.warn(`stopping specls: ${e}`);
        }
    }
}

export async function activate(context: vscode.ExtensionContext): Promise<void> {
    output = vscode.window.createOutputChannel('specls', { log: true });
    status = new StatusBar();
    context.subscriptions.push(output, status);
    context.subscriptions.push(
        vscode.commands.registerCommand(ACCEPTED_COMMAND, sendAccepted),
        vscode.commands.registerCommand('specls.showOutput', () => output?.show()),
        vscode.commands.registerCommand('specls.restart', async () => {
            await stopClient();
            await startClient(context);
        }),
        vscode.window.onDidChangeActiveTextEditor(updateEnabledState),
        // trust granted: workspace settings and the workspace .venv now count
        vscode.workspace.onDidGrantWorkspaceTrust(async () => {
            await stopClient();
            await startClient(context);
        }),
        vscode.workspace.onDidChangeConfiguration(async (e) => {
            if (!e.affectsConfiguration('specls')) {
                return;
            }
            // the models, typeAhead, draftLength and the lookup sources are the engine's: the server applies
            // them when its model loads
            const engineKeys = ['model', 'preset', 'draft', 'typeAhead', 'draftLength', 'workspace', 'datastore', 'featureHead'];
            const restartKeys = ['serverPath', 'teamServer', 'enabledLanguages', ...engineKeys];
            const needsRestart = restartKeys.some((k) => e.affectsConfiguration(`specls.${k}`));
            updateEnabledState();
            output?.info(`settings changed${needsRestart ? ': restarting the client' : ''}`);
            if (needsRestart) {
                await stopClient();
                await startClient(context);
            } else if (client?.state === State.Running) {
                await client.sendNotification('workspace/didChangeConfiguration', {
                    settings: { specls: serverSettings(readSettings()) },
                });
            }
            updateEnabledState();
        }),
    );
    // next-edit suggestions: shown with decorations, Tab applies (package.json: specls.nextEditVisible)
    const nextEditsOn = (document: vscode.TextDocument): boolean =>
        vscode.workspace.getConfiguration('specls').get<boolean>('nextEdits', true) &&
        languageEnabled(readSettings(), document.languageId);
    context.subscriptions.push(new NextEdits(() => client, nextEditsOn, () => output));
    statsTimer = setInterval(() => void pollStats(), 5000);
    context.subscriptions.push({ dispose: () => clearInterval(statsTimer) });
    // not awaited: activation does not wait for the server (errors end up in the status bar and log)
    void startClient(context);
}

export async function deactivate(): Promise<void> {
    await stopClient();
}
