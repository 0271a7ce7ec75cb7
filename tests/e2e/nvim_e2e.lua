-- Drives real Neovim with the specls plugin against a real `specls serve`:
--   nvim --headless --clean -S tests/e2e/nvim_e2e.lua
-- Environment: SPECLS_E2E_PLUGIN (editors/nvim), SPECLS_E2E_CMD (JSON list) or SPECLS_E2E_TCP (host:port),
-- SPECLS_E2E_FILE (a Python file; the cursor goes to the end of its last line), SPECLS_E2E_RESULT (JSON
-- written here), SPECLS_E2E_TIMEOUT_MS (for the ghost text to appear).
-- Result: { ok, error?, version, native, ghost, before, after, row, col, attach_ms, ghost_ms, log,
-- progress (the load progress messages the plugin showed) }.
local e2e = dofile(debug.getinfo(1, 'S').source:sub(2):match('^(.*[/\\])') .. 'nvim_driver.lua')

local function run()
  e2e.load_plugin()
  local timeout = e2e.timeout_ms(120000)

  local setup = { settings = { maxTokens = 24 }, debounce_ms = 50 }
  local tcp = os.getenv('SPECLS_E2E_TCP')
  if tcp and tcp ~= '' then
    setup.tcp = tcp
  else
    setup.cmd = vim.json.decode(assert(os.getenv('SPECLS_E2E_CMD')))
  end
  local specls = require('specls')
  specls.setup(setup)
  -- the load progress the plugin shows (a model given by name: "downloading 43%", "converting: ...")
  e2e.result.progress = {}
  vim.api.nvim_create_autocmd('LspProgress', {
    callback = function()
      local m = specls.progress()
      if m and m ~= e2e.result.progress[#e2e.result.progress] then
        table.insert(e2e.result.progress, m)
      end
    end,
  })
  e2e.result.native = vim.lsp.inline_completion ~= nil

  local buf = e2e.open_file()
  e2e.log('opened, filetype=' .. vim.bo[buf].filetype)

  local client = e2e.attach(buf)
  if not client then
    return
  end
  e2e.result.attach_ms = e2e.ms()
  e2e.log('attached, server capabilities inlineCompletionProvider=' .. vim.inspect(
    client.server_capabilities.inlineCompletionProvider ~= nil))
  if not client.server_capabilities.inlineCompletionProvider then
    return e2e.fail('server does not advertise inlineCompletionProvider')
  end

  -- Insert mode at the end of the last line, and stay there.
  local last = vim.api.nvim_buf_line_count(buf)
  vim.api.nvim_win_set_cursor(0, { last, 0 })
  e2e.feed('A', 'n')
  e2e.wait_until(5000, function()
    return vim.fn.mode() == 'i'
  end)
  e2e.log('mode=' .. vim.fn.mode())

  -- The ghost text: every extmark with virtual text in the buffer (the plugin's own namespace on 0.11,
  -- nvim.lsp.inline_completion on 0.12), first line from virt_text, the rest from virt_lines.
  local function ghost()
    for _, m in ipairs(vim.api.nvim_buf_get_extmarks(buf, -1, 0, -1, { details = true })) do
      local d = m[4]
      if d.virt_text or d.virt_lines then
        local first = {}
        for _, chunk in ipairs(d.virt_text or {}) do
          if chunk[2] ~= 'ComplHintMore' then
            first[#first + 1] = chunk[1]
          end
        end
        local lines = { table.concat(first) }
        for _, vl in ipairs(d.virt_lines or {}) do
          local parts = {}
          for _, chunk in ipairs(vl) do
            if chunk[2] ~= 'ComplHintMore' then
              parts[#parts + 1] = chunk[1]
            end
          end
          lines[#lines + 1] = table.concat(parts)
        end
        local text = table.concat(lines, '\n')
        if text ~= '' then
          return text, m[2], m[3], d.virt_text_pos
        end
      end
    end
  end

  local function await_ghost()
    local text, row, col, pos
    local deadline = e2e.ms() + timeout
    local retrigger_at = e2e.ms() + 5000
    while e2e.ms() < deadline do
      e2e.wait_until(200, function()
        text, row, col, pos = ghost()
        return text ~= nil
      end, 20)
      if text then
        return text, row, col, pos
      end
      if e2e.ms() > retrigger_at then
        -- e.g. the first request came while the model was still loading: leave and re-enter Insert mode
        e2e.log('no ghost text yet; re-entering Insert mode')
        e2e.feed('<Esc>A', 'n')
        retrigger_at = e2e.ms() + 5000
      end
    end
  end

  local text, row, col, pos = await_ghost()
  if not text then
    return e2e.fail(string.format('no ghost text within %d ms', timeout))
  end
  if not e2e.result.native then
    -- 0.11 fallback: the dismiss key hides it (and it stays hidden without an edit); an edit asks again
    e2e.feed('<C-]>', 'mt')
    e2e.wait_until(2000, function()
      return ghost() == nil
    end, 20)
    e2e.sleep(500)
    e2e.result.dismissed = ghost() == nil
    e2e.log('after dismiss: ' .. (ghost() or '(no ghost text)'))
    local line = vim.api.nvim_get_current_line()
    e2e.feed('<BS>' .. line:sub(-1), 'n')
    text, row, col, pos = await_ghost()
    if not text then
      return e2e.fail('no ghost text after an edit following the dismiss')
    end
  end
  e2e.result.ghost_ms = e2e.ms()
  e2e.result.ghost = text
  e2e.result.virt_text_pos = pos
  local cursor = vim.api.nvim_win_get_cursor(0)
  e2e.result.row, e2e.result.col = cursor[1] - 1, cursor[2]
  e2e.result.ghost_row, e2e.result.ghost_col = row, col
  e2e.result.before = e2e.text_of(buf)
  e2e.log(string.format('ghost at %d:%d %q', row, col, text))

  local tick = vim.api.nvim_buf_get_changedtick(buf)
  -- The accept key through its mapping, as a user presses it.
  e2e.feed('<Tab>', 'mt')
  e2e.wait_until(5000, function()
    return vim.api.nvim_buf_get_changedtick(buf) ~= tick
  end, 20)
  e2e.sleep(200) -- let the accept finish (cursor move, 0.12's scheduled apply)
  e2e.result.after = e2e.text_of(buf)
  e2e.result.after_mode = vim.fn.mode()
  -- the server's counters after the accept (the plugin sent specls/accepted before this request)
  e2e.finish_with_stats(client, buf)
end

-- a hard stop so nothing hangs
e2e.start(run, 120000, 90000)
