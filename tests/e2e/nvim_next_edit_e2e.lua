-- Drives real Neovim with the specls plugin against the fake server with a scripted next edit:
--   nvim --headless --clean -S tests/e2e/nvim_next_edit_e2e.lua
-- Environment: SPECLS_E2E_PLUGIN (editors/nvim), SPECLS_E2E_CMD (JSON list: the server), SPECLS_E2E_FILE
-- (a Python file), SPECLS_E2E_RESULT (JSON written here), SPECLS_E2E_TIMEOUT_MS.
-- In Normal mode a line is added at the top (a change, as the user makes it); the next edit appears
-- (removed text highlighted, new lines as virtual lines), Esc dismisses it, another change brings it back,
-- the key jumps to it and then applies it.
-- Result: { ok, error?, version, shown (the edit as the server sent it), delete_hl, virt_lines, dismissed,
-- jumped_to, before, after, stats, log }.
local e2e = dofile(debug.getinfo(1, 'S').source:sub(2):match('^(.*[/\\])') .. 'nvim_driver.lua')

local function run()
  e2e.load_plugin()
  local timeout = e2e.timeout_ms(60000)
  local next_edit = require('specls.next_edit')
  require('specls').setup({ cmd = vim.json.decode(assert(os.getenv('SPECLS_E2E_CMD'))), next_edit_debounce_ms = 100 })

  local buf = e2e.open_file()
  local client = e2e.attach(buf)
  if not client then
    return
  end
  e2e.log('attached; experimental capability: ' .. vim.inspect(client.server_capabilities.experimental))
  local ns = vim.api.nvim_get_namespaces()['specls.next_edit']

  local function marks()
    return vim.api.nvim_buf_get_extmarks(buf, ns, 0, -1, { details = true })
  end

  local function await_edit()
    return e2e.wait_until(timeout, function()
      return next_edit.get(buf) ~= nil and #marks() > 0
    end, 20)
  end

  -- a change in Normal mode, as the user makes it: the next edit is asked for after it
  vim.api.nvim_win_set_cursor(0, { 1, 0 })
  vim.api.nvim_buf_set_lines(buf, 0, 0, false, { 'import math' })
  if not await_edit() then
    return e2e.fail(string.format('no next edit within %d ms', timeout))
  end
  e2e.log('shown: ' .. vim.inspect(next_edit.get(buf)))

  -- Esc dismisses it; another change brings it back
  e2e.feed('<Esc>', 'mt')
  e2e.result.dismissed = e2e.wait_until(2000, function()
    return next_edit.get(buf) == nil and #marks() == 0
  end, 20)
  vim.api.nvim_buf_set_lines(buf, 1, 1, false, { '' })
  if not await_edit() then
    return e2e.fail('no next edit after a change following the dismiss')
  end
  e2e.result.shown = next_edit.get(buf)
  for _, m in ipairs(marks()) do
    local d = m[4]
    if d.hl_group == 'SpeclsNextEditDelete' then
      e2e.result.delete_hl = { m[2], m[3], d.end_row, d.end_col }
    end
    if d.virt_lines then
      e2e.result.virt_lines = {}
      for _, vl in ipairs(d.virt_lines) do
        local parts = {}
        for _, chunk in ipairs(vl) do
          parts[#parts + 1] = chunk[1]
        end
        table.insert(e2e.result.virt_lines, table.concat(parts))
      end
    end
  end
  e2e.result.before = e2e.text_of(buf)

  -- the key through its mapping, as a user presses it: a jump to the edit, then the edit
  local was = vim.api.nvim_win_get_cursor(0)
  e2e.result.cursor_before = { was[1] - 1, was[2] }
  e2e.feed('<Tab>', 'mt')
  e2e.wait_until(2000, function()
    local now = vim.api.nvim_win_get_cursor(0)
    return now[1] ~= was[1] or now[2] ~= was[2]
  end, 20)
  local c = vim.api.nvim_win_get_cursor(0)
  e2e.result.jumped_to = { c[1] - 1, c[2] }
  e2e.result.after_jump = e2e.text_of(buf)
  local tick = vim.api.nvim_buf_get_changedtick(buf)
  e2e.feed('<Tab>', 'mt')
  e2e.wait_until(5000, function()
    return vim.api.nvim_buf_get_changedtick(buf) ~= tick
  end, 20)
  e2e.sleep(200)
  e2e.result.after = e2e.text_of(buf)

  e2e.finish_with_stats(client, buf)
end

e2e.start(run, 60000, 60000)
