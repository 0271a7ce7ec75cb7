"""Next-edit suggestions: the model rewrites the region around the cursor given the recent edits.

- ``layouts``: prompt layouts (Sweep's next-edit models, zero-shot ones for code/instruct models),
  named and selectable; each renders a prompt and parses the model's output back into the region.
- ``edits``: the region around the cursor, and the rewritten region as minimal LSP edits.
- ``edit_diff``: one recent edit as the layouts show it.

The region drafter (the region as the speculative draft) is ``specls.decoder.region_drafter``; the
edit history the server keeps is ``specls.lsp.edit_history``. docs/next-edit.md says what is built
and what the engine, server and editors still need.
"""
