// How to reach specls: a local `specls serve` over stdio, or a team server over TCP.
import * as fs from 'fs';
import * as net from 'net';
import * as os from 'os';
import * as path from 'path';
import { Executable, ServerOptions, StreamInfo } from 'vscode-languageclient/node';

export interface Settings {
    serverPath: string;
    model: string;
    preset: string;
    draft: string;
    maxTokens: number;
    draftLength: number;
    workspace: boolean;
    datastore: string;
    featureHead: boolean;
    lineFirst: boolean;
    typeAhead: boolean;
    multiline: string;
    enabledLanguages: string[];
    teamServer: string;
    teamToken: string;
}

export class ServerNotFoundError extends Error {}

function isExecutable(file: string): boolean {
    try {
        fs.accessSync(file, fs.constants.X_OK);
        return fs.statSync(file).isFile();
    } catch {
        return false;
    }
}

function expandHome(p: string): string {
    return p === '~' || p.startsWith('~/') ? path.join(os.homedir(), p.slice(1)) : p;
}

/** `specls` on PATH, or undefined. */
function onPath(name: string): string | undefined {
    for (const dir of (process.env.PATH ?? '').split(path.delimiter)) {
        if (dir && isExecutable(path.join(dir, name))) {
            return path.join(dir, name);
        }
    }
    return undefined;
}

/** The command that starts `specls serve` over stdio, from the serverPath setting or by looking around.
 * Without workspace trust nothing inside the workspace is run (no relative serverPath, no workspace .venv). */
export function resolveExecutable(
    serverPath: string,
    workspaceFolders: readonly string[],
    trusted: boolean = true,
): Executable {
    if (!trusted) {
        workspaceFolders = [];
    }
    const candidates: string[] = [];
    if (serverPath.trim()) {
        let p = expandHome(serverPath.trim());
        if (!path.isAbsolute(p) && workspaceFolders.length > 0) {
            const inWorkspace = path.join(workspaceFolders[0], p);
            p = fs.existsSync(inWorkspace) ? inWorkspace : (onPath(p) ?? inWorkspace);
        }
        if (!isExecutable(p)) {
            const where = p === serverPath.trim() ? '' : ` (${p})`;
            throw new ServerNotFoundError(
                `specls: "specls.serverPath" is set to "${serverPath}"${where}, which is not an executable file.`,
            );
        }
        candidates.push(p);
    } else {
        const found = onPath('specls');
        if (found) {
            candidates.push(found);
        }
        for (const folder of workspaceFolders) {
            for (const venv of ['.venv', 'venv']) {
                const p = path.join(folder, venv, 'bin', 'specls');
                if (isExecutable(p)) {
                    candidates.push(p);
                }
            }
        }
    }
    const command = candidates[0];
    if (command === undefined) {
        throw new ServerNotFoundError(
            'specls: the `specls` command was not found on PATH nor in a workspace .venv ' +
                '(a workspace .venv is used only in trusted workspaces). ' +
                'Install it (pip install specls) or set "specls.serverPath" to the specls executable ' +
                'or to a Python interpreter that has specls installed.',
        );
    }
    // A Python interpreter runs the module; anything else is the specls entry point.
    const args = /^python[0-9.]*(\.exe)?$/.test(path.basename(command))
        ? ['-m', 'specls', 'serve']
        : ['serve'];
    return { command, args, options: { env: { ...process.env } } };
}

/** "host:port" -> [host, port], or an Error with a message for the user. */
export function parseHostPort(value: string): [string, number] {
    const m = /^\s*\[?([^\]\s]+?)\]?:(\d{1,5})\s*$/.exec(value);
    const port = m ? Number(m[2]) : NaN;
    if (!m || !(port > 0 && port < 65536)) {
        throw new ServerNotFoundError(`specls: "specls.teamServer" must be host:port, got "${value}".`);
    }
    return [m[1], port];
}

export function serverOptions(
    settings: Settings,
    workspaceFolders: readonly string[],
    trusted: boolean = true,
): ServerOptions {
    if (settings.teamServer.trim()) {
        const [host, port] = parseHostPort(settings.teamServer);
        return () =>
            new Promise<StreamInfo>((resolve, reject) => {
                const socket = net.connect({ host, port });
                socket.once('connect', () => resolve({ reader: socket, writer: socket }));
                socket.once('error', (err) =>
                    reject(new Error(`specls: cannot connect to team server ${host}:${port}: ${err.message}`)),
                );
            });
    }
    return resolveExecutable(settings.serverPath, workspaceFolders, trusted);
}

/** What the server receives as initializationOptions and in workspace/didChangeConfiguration. */
export function serverSettings(settings: Settings): Record<string, unknown> {
    const out: Record<string, unknown> = {
        maxTokens: settings.maxTokens,
        draftLength: settings.draftLength,
        workspace: settings.workspace,
        featureHead: settings.featureHead,
        lineFirst: settings.lineFirst,
        typeAhead: settings.typeAhead,
        multiline: settings.multiline,
        // [] = every language (the server's default); "*" is only the client's spelling of that
        languages: settings.enabledLanguages.includes('*') ? [] : settings.enabledLanguages,
    };
    if (settings.model) {
        out.model = settings.model;
    }
    if (settings.datastore) {
        out.datastore = settings.datastore;
    }
    if (settings.preset) {
        out.preset = settings.preset;
    }
    if (settings.draft) {
        out.draft = settings.draft;
    }
    if (settings.teamToken) {
        out.teamToken = settings.teamToken;
    }
    return out;
}
