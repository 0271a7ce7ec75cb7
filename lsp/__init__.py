"""specls.lsp: the pygls language server (documents, inline completion, cancellation, settings)."""
