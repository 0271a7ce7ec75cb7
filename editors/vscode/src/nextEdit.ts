// Next-edit suggestions (docs/next-edit.md): after an edit and a short pause the extension asks the
// server for the edit the user is likely to make next (`textDocument/copilotInlineEdit`) and shows it with
// decorations (stable API only: the proposed inline-edit API cannot be published): the text it removes
// struck through on a red background, the text it puts there after it on a green one. Tab (the
// `specls.nextEditVisible` context key, when no inline suggestion is showing) jumps to it when the cursor
// is elsewhere and applies it when the cursor is on its lines; typing or Escape dismisses it. An edit for a
// document version that is gone is never shown.
import * as vscode from 'vscode';
import { LanguageClient, State } from 'vscode-languageclient/node';

export const METHOD = 'textDocument/copilotInlineEdit';
export const CONTEXT_KEY = 'specls.nextEditVisible';
const DEBOUNCE_MS = 300;

interface LspPosition {
    line: number;
    character: number;
}

interface LspCommand {
    title: string;
    command: string;
    arguments?: unknown[];
}

/** One item of the server's answer. */
interface InlineEdit {
    text: string;
    range: { start: LspPosition; end: LspPosition };
    textDocument: { uri: string; version: number };
    command?: LspCommand;
}

interface Shown {
    editor: vscode.TextEditor;
    version: number;
    range: vscode.Range;
    edit: InlineEdit;
}

/** What the decoration after the range shows: the new text on one line. */
function preview(text: string): string {
    return text.replace(/\r?\n/g, ' ⏎ ');
}

export class NextEdits implements vscode.Disposable {
    private shown: Shown | undefined;
    private timer: NodeJS.Timeout | undefined;
    private request: vscode.CancellationTokenSource | undefined;
    private readonly removed = vscode.window.createTextEditorDecorationType({
        backgroundColor: new vscode.ThemeColor('diffEditor.removedTextBackground'),
        textDecoration: 'line-through',
    });
    private readonly added = vscode.window.createTextEditorDecorationType({});
    private readonly subscriptions: vscode.Disposable[] = [];

    constructor(
        private readonly client: () => LanguageClient | undefined,
        private readonly enabled: (document: vscode.TextDocument) => boolean,
        private readonly output: () => vscode.LogOutputChannel | undefined,
    ) {
        this.subscriptions.push(
            this.removed,
            this.added,
            vscode.workspace.onDidChangeTextDocument((e) => this.changed(e)),
            vscode.window.onDidChangeActiveTextEditor(() => this.dismiss()),
            vscode.commands.registerCommand('specls.acceptNextEdit', () => this.accept()),
            vscode.commands.registerCommand('specls.dismissNextEdit', () => this.dismiss()),
        );
    }

    dispose(): void {
        this.dismiss();
        for (const d of this.subscriptions) {
            d.dispose();
        }
    }

    /** Hide what is shown and drop the request in flight. */
    dismiss(): void {
        clearTimeout(this.timer);
        this.request?.cancel();
        this.request = undefined;
        if (this.shown) {
            this.shown.editor.setDecorations(this.removed, []);
            this.shown.editor.setDecorations(this.added, []);
            this.shown = undefined;
        }
        void vscode.commands.executeCommand('setContext', CONTEXT_KEY, false);
    }

    private changed(e: vscode.TextDocumentChangeEvent): void {
        const editor = vscode.window.activeTextEditor;
        if (!editor || e.document !== editor.document || e.contentChanges.length === 0) {
            return;
        }
        this.dismiss(); // typing dismisses; the edit after it is asked for after a pause
        if (this.enabled(e.document)) {
            this.timer = setTimeout(() => void this.ask(editor), DEBOUNCE_MS);
        }
    }

    private async ask(editor: vscode.TextEditor): Promise<void> {
        const c = this.client();
        if (!c || c.state !== State.Running || vscode.window.activeTextEditor !== editor) {
            return;
        }
        const document = editor.document;
        const version = document.version;
        const uri = c.code2ProtocolConverter.asUri(document.uri);
        const source = new vscode.CancellationTokenSource();
        this.request = source;
        let answer: { edits?: InlineEdit[] } | null;
        try {
            answer = await c.sendRequest<{ edits?: InlineEdit[] } | null>(
                METHOD,
                { textDocument: { uri, version }, position: c.code2ProtocolConverter.asPosition(editor.selection.active) },
                source.token,
            );
        } catch (e) {
            if (!source.token.isCancellationRequested) {
                this.output()?.debug(`${METHOD} failed: ${e}`);
            }
            return;
        }
        const edit = answer?.edits?.[0];
        // never an edit for a version the document has left, nor for another document
        if (
            source.token.isCancellationRequested ||
            !edit ||
            edit.textDocument.uri !== uri ||
            edit.textDocument.version !== document.version ||
            vscode.window.activeTextEditor !== editor
        ) {
            return;
        }
        this.request = undefined;
        this.show(editor, version, edit, c);
    }

    private show(editor: vscode.TextEditor, version: number, edit: InlineEdit, c: LanguageClient): void {
        const range = c.protocol2CodeConverter.asRange(edit.range);
        this.shown = { editor, version, range, edit };
        editor.setDecorations(this.removed, range.isEmpty ? [] : [range]);
        editor.setDecorations(this.added, [
            {
                range: new vscode.Range(range.end, range.end),
                renderOptions: {
                    after: {
                        contentText: preview(edit.text),
                        backgroundColor: new vscode.ThemeColor('diffEditor.insertedTextBackground'),
                        margin: '0 0 0 0.2em',
                    },
                },
            },
        ]);
        void vscode.commands.executeCommand('setContext', CONTEXT_KEY, true);
        if (edit.command) {
            void c.sendNotification('textDocument/didShowInlineEdit', { item: { command: edit.command } });
        }
    }

    /** Tab: jump to the edit when the cursor is not on its lines, else apply it and run its command. */
    async accept(): Promise<void> {
        const shown = this.shown;
        const editor = vscode.window.activeTextEditor;
        if (!shown || editor !== shown.editor || editor.document.version !== shown.version) {
            this.dismiss();
            return;
        }
        const line = editor.selection.active.line;
        if (line < shown.range.start.line || line > shown.range.end.line) {
            editor.selection = new vscode.Selection(shown.range.start, shown.range.start);
            editor.revealRange(shown.range, vscode.TextEditorRevealType.InCenterIfOutsideViewport);
            return;
        }
        this.dismiss();
        const applied = await editor.edit((b) => b.replace(shown.range, shown.edit.text));
        const c = this.client();
        const command = shown.edit.command;
        if (applied && command && c?.state === State.Running) {
            c.sendRequest('workspace/executeCommand', { command: command.command, arguments: command.arguments }).catch(
                (e: unknown) => this.output()?.warn(`${command.command} failed: ${e}`),
            );
        }
    }
}
