// The status bar item: loading (with model-load progress), ready, disabled, error; the tooltip shows the
// running acceptance rate and p50 latency from `specls/stats`.
import * as vscode from 'vscode';

type Kind = 'loading' | 'ready' | 'disabled' | 'error';

/** The server's messages while a model given by name is prepared (specls.models.progress.status_text). */
export const PREPARING = /^(resolving|downloading|converting)\b/;

type Json = Record<string, unknown>;

function obj(v: unknown): Json | undefined {
    return v && typeof v === 'object' && !Array.isArray(v) ? (v as Json) : undefined;
}

function num(v: unknown): number | undefined {
    return typeof v === 'number' && Number.isFinite(v) ? v : undefined;
}

export interface StatsSummary {
    state?: string; // new | loading | ready | failed
    error?: string;
    acceptance?: number; // drafted tokens the target accepted, 0..1
    p50Ms?: number; // completion request latency
    accepted?: number; // suggestions the user accepted
    answered?: number; // suggestions the server returned
}

/** The few numbers the status bar shows, from `specls/stats` ({engine: {...}, server: {...}}). */
export function summarize(stats: Json): StatsSummary {
    const server = obj(stats.server) ?? {};
    const engine = obj(stats.engine) ?? {};
    return {
        state: typeof server.state === 'string' ? server.state : undefined,
        error: typeof server.error === 'string' && server.error ? server.error : undefined,
        acceptance: num(engine.acceptance) ?? num(engine.acceptance_rate),
        p50Ms: num(obj(server.latency_ms)?.p50) ?? num(engine.latency_ms_p50),
        accepted: num(server.accepted),
        answered: num(server.answered),
    };
}

export class StatusBar implements vscode.Disposable {
    private readonly item: vscode.StatusBarItem;
    private kind: Kind = 'loading';
    private detail = '';
    private disabledLanguage: string | undefined;
    private stats: StatsSummary | undefined;

    constructor() {
        this.item = vscode.window.createStatusBarItem('specls.status', vscode.StatusBarAlignment.Right, 100);
        this.item.name = 'specls';
        this.item.command = 'specls.showOutput';
        this.render();
        this.item.show();
    }

    setLoading(message: string, percentage?: number): void {
        this.kind = 'loading';
        // a model being prepared says its own step ("downloading 43%", "converting: quantizing")
        this.detail =
            PREPARING.test(message) || percentage === undefined ? message : `${message} ${Math.round(percentage)}%`;
        this.render();
    }

    setReady(): void {
        this.kind = 'ready';
        this.detail = '';
        this.render();
    }

    setError(message: string): void {
        this.kind = 'error';
        this.detail = message;
        this.render();
    }

    /** Disabled for the active editor's language (the server itself keeps running). */
    setDisabled(disabled: boolean, languageId: string | undefined): void {
        this.disabledLanguage = disabled ? languageId : undefined;
        this.render();
    }

    setStats(stats: Json): void {
        const summary = summarize(stats);
        this.stats = summary;
        // The server's own state wins: a load that is still running, or one that failed.
        if (summary.state === 'failed') {
            this.kind = 'error';
            this.detail = summary.error ?? 'model load failed';
        } else if (summary.state === 'loading' || summary.state === 'new') {
            if (this.kind === 'loading') {
                return this.render(); // keep the progress text
            }
            this.kind = 'loading';
            this.detail = 'loading model';
        } else if (summary.state === 'ready' && this.kind === 'loading') {
            this.kind = 'ready';
            this.detail = '';
        }
        this.render();
    }

    private render(): void {
        const kind: Kind = this.kind === 'ready' && this.disabledLanguage ? 'disabled' : this.kind;
        const icon = { loading: '$(loading~spin)', ready: '$(sparkle)', disabled: '$(circle-slash)', error: '$(error)' }[
            kind
        ];
        this.item.text =
            kind === 'loading' && this.detail
                ? `${icon} specls: ${this.detail}`
                : kind === 'error'
                  ? `${icon} specls: error`
                  : `${icon} specls`;
        this.item.backgroundColor =
            kind === 'error' ? new vscode.ThemeColor('statusBarItem.errorBackground') : undefined;
        const lines = [`specls: ${kind}${this.detail && kind !== 'loading' ? ` (${this.detail})` : ''}`];
        if (kind === 'disabled') {
            lines.push(`not enabled for ${this.disabledLanguage} (setting specls.enabledLanguages)`);
        }
        const st = this.stats;
        if (st) {
            lines.push(`draft acceptance rate: ${st.acceptance === undefined ? 'n/a' : `${(st.acceptance * 100).toFixed(1)}%`}`);
            lines.push(`p50 latency: ${st.p50Ms === undefined ? 'n/a' : `${st.p50Ms.toFixed(0)} ms`}`);
            if (st.answered !== undefined) {
                lines.push(`suggestions accepted: ${st.accepted ?? 0} of ${st.answered}`);
            }
        }
        this.item.tooltip = lines.join('\n');
    }

    dispose(): void {
        this.item.dispose();
    }
}
