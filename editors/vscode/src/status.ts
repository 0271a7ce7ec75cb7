// The status bar item: loading (with model-load progress), ready, disabled, error; the tooltip shows the
// running acceptance rate and p50 latency from `specls/stats`.
import * as vscode from 'vscode';

type Kind = 'loading' | 'ready' | 'disabled' | 'error';

/** The first finite number among `keys` (searched in `stats` and one level of nested objects). */
export function pickNumber(stats: Record<string, unknown>, keys: readonly string[]): number | undefined {
    const scopes: Record<string, unknown>[] = [stats];
    for (const v of Object.values(stats)) {
        if (v && typeof v === 'object' && !Array.isArray(v)) {
            scopes.push(v as Record<string, unknown>);
        }
    }
    for (const key of keys) {
        for (const scope of scopes) {
            const v = scope[key];
            if (typeof v === 'number' && Number.isFinite(v)) {
                return v;
            }
        }
    }
    return undefined;
}

export class StatusBar implements vscode.Disposable {
    private readonly item: vscode.StatusBarItem;
    private kind: Kind = 'loading';
    private detail = '';
    private disabledLanguage: string | undefined;
    private stats: Record<string, unknown> | undefined;

    constructor() {
        this.item = vscode.window.createStatusBarItem('specls.status', vscode.StatusBarAlignment.Right, 100);
        this.item.name = 'specls';
        this.item.command = 'specls.showOutput';
        this.render();
        this.item.show();
    }

    setLoading(message: string, percentage?: number): void {
        this.kind = 'loading';
        this.detail = percentage !== undefined ? `${message} ${Math.round(percentage)}%` : message;
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

    setStats(stats: Record<string, unknown>): void {
        this.stats = stats;
        // A server that reports it is still loading keeps the status at loading.
        if (stats.ready === false && this.kind === 'ready') {
            this.kind = 'loading';
            this.detail = 'loading model';
        } else if (stats.ready === true && this.kind === 'loading') {
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
        this.item.text = kind === 'loading' && this.detail ? `${icon} specls: ${this.detail}` : `${icon} specls`;
        this.item.backgroundColor =
            kind === 'error' ? new vscode.ThemeColor('statusBarItem.errorBackground') : undefined;
        const lines = [`specls: ${kind}${this.detail && kind !== 'loading' ? ` (${this.detail})` : ''}`];
        if (kind === 'disabled') {
            lines.push(`not enabled for ${this.disabledLanguage} (setting specls.enabledLanguages)`);
        }
        if (this.stats) {
            const rate = pickNumber(this.stats, ['acceptance_rate', 'acceptanceRate', 'accept_rate']);
            const p50 = pickNumber(this.stats, ['p50_ms', 'latency_p50_ms', 'p50LatencyMs', 'latencyP50Ms']);
            const requests = pickNumber(this.stats, ['requests', 'completions']);
            lines.push(`acceptance rate: ${rate === undefined ? 'n/a' : `${(rate * 100).toFixed(1)}%`}`);
            lines.push(`p50 latency: ${p50 === undefined ? 'n/a' : `${p50.toFixed(0)} ms`}`);
            if (requests !== undefined) {
                lines.push(`completions: ${requests}`);
            }
        }
        this.item.tooltip = lines.join('\n');
    }

    dispose(): void {
        this.item.dispose();
    }
}
