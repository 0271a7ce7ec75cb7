-- Drives real Neovim with the specls plugin against the fake server with a scripted next edit:
--   nvim --headless --clean -S tests/e2e/nvim_next_edit_e2e.lua
-- Environment: SPECLS_E2E_PLUGIN (editors/nvim), SPECLS_E2E_CMD (JSON list: the server), SPECLS_E2E_FILE
-- (a Python file), SPECLS_E2E_RESULT (JSON written here), SPECLS_E2E_TIMEOUT_MS.
-- In Normal mode a line is added at the top (a change, as the user makes it); the next edit appears
-- (removed text highlighted, new lines as virtual lines), Esc dismisses it, another change brings it back,
-- the key jumps to it and then applies it.
-- Result: { ok, error?, version, shown (the edit as the server sent it), delete_hl, virt_lines, dismissed,
-- jumped_to, before, after, stats, log }.
local uv = vim.uv
local t0 = uv.hrtime()
local function ms()
  return math.floor((uv.hrtime() - t0) / 1e6)
end

local result = { ok = false, log = {} }
local function log(msg)
  local line = string.format('%6d ms %s', ms(), msg)
  table.insert(result.log, line)
  io.stderr:write(line .. '\n')
end

local function finish()
  local f = assert(io.open(os.getenv('SPECLS_E2E_RESULT'), 'w'))
  f:write(vim.json.encode(result))
  f:close()
  for _, c in ipairs(vim.lsp.get_clients()) do
    c:stop(true)
  end
  vim.cmd('qall!')
end

local co

local function resume()
  local ok, err = coroutine.resume(co)
  if not ok then
    result.error = 'lua error: ' .. debug.traceback(co, tostring(err))
    finish()
  end
end

local function sleep(n)
  vim.defer_fn(resume, n)
  coroutine.yield()
end

local function wait_until(timeout_ms, cond, step)
  local stop = ms() + timeout_ms
  while true do
    local v = cond()
    if v or ms() >= stop then
      return v
    end
    sleep(step or 50)
  end
end

local function feed(keys, mode)
  vim.api.nvim_feedkeys(vim.api.nvim_replace_termcodes(keys, true, false, true), mode, false)
end

local function fail(msg)
  result.error = msg
  log('FAIL: ' .. msg)
  finish()
end

local function text_of(buf)
  return table.concat(vim.api.nvim_buf_get_lines(buf, 0, -1, false), '\n')
end

local function run()
  local v = vim.version()
  result.version = string.format('%d.%d.%d', v.major, v.minor, v.patch)
  vim.opt.runtimepath:prepend(assert(os.getenv('SPECLS_E2E_PLUGIN')))
  local timeout = tonumber(os.getenv('SPECLS_E2E_TIMEOUT_MS') or '') or 60000
  local next_edit = require('specls.next_edit')
  require('specls').setup({ cmd = vim.json.decode(assert(os.getenv('SPECLS_E2E_CMD'))), next_edit_debounce_ms = 100 })

  vim.cmd.edit(vim.fn.fnameescape(assert(os.getenv('SPECLS_E2E_FILE'))))
  local buf = vim.api.nvim_get_current_buf()
  local client
  local attached = wait_until(60000, function()
    client = vim.lsp.get_clients({ bufnr = buf, name = 'specls' })[1]
    return client ~= nil and client.initialized == true
  end)
  if not attached then
    return fail('the specls client did not attach within 60 s')
  end
  log('attached; experimental capability: ' .. vim.inspect(client.server_capabilities.experimental))
  local ns = vim.api.nvim_get_namespaces()['specls.next_edit']

  local function marks()
    return vim.api.nvim_buf_get_extmarks(buf, ns, 0, -1, { details = true })
  end

  local function await_edit()
    return wait_until(timeout, function()
      return next_edit.get(buf) ~= nil and #marks() > 0
    end, 20)
  end

  -- a change in Normal mode, as the user makes it: the next edit is asked for after it
  vim.api.nvim_win_set_cursor(0, { 1, 0 })
  vim.api.nvim_buf_set_lines(buf, 0, 0, false, { 'import math' })
  if not await_edit() then
    return fail(string.format('no next edit within %d ms', timeout))
  end
  log('shown: ' .. vim.inspect(next_edit.get(buf)))

  -- Esc dismisses it; another change brings it back
  feed('<Esc>', 'mt')
  result.dismissed = wait_until(2000, function()
    return next_edit.get(buf) == nil and #marks() == 0
  end, 20)
  vim.api.nvim_buf_set_lines(buf, 1, 1, false, { '' })
  if not await_edit() then
    return fail('no next edit after a change following the dismiss')
  end
  result.shown = next_edit.get(buf)
  for _, m in ipairs(marks()) do
    local d = m[4]
    if d.hl_group == 'SpeclsNextEditDelete' then
      result.delete_hl = { m[2], m[3], d.end_row, d.end_col }
    end
    if d.virt_lines then
      result.virt_lines = {}
      for _, vl in ipairs(d.virt_lines) do
        local parts = {}
        for _, chunk in ipairs(vl) do
          parts[#parts + 1] = chunk[1]
        end
        table.insert(result.virt_lines, table.concat(parts))
      end
    end
  end
  result.before = text_of(buf)

  -- the key through its mapping, as a user presses it: a jump to the edit, then the edit
  local was = vim.api.nvim_win_get_cursor(0)
  result.cursor_before = { was[1] - 1, was[2] }
  feed('<Tab>', 'mt')
  wait_until(2000, function()
    local now = vim.api.nvim_win_get_cursor(0)
    return now[1] ~= was[1] or now[2] ~= was[2]
  end, 20)
  local c = vim.api.nvim_win_get_cursor(0)
  result.jumped_to = { c[1] - 1, c[2] }
  result.after_jump = text_of(buf)
  local tick = vim.api.nvim_buf_get_changedtick(buf)
  feed('<Tab>', 'mt')
  wait_until(5000, function()
    return vim.api.nvim_buf_get_changedtick(buf) ~= tick
  end, 20)
  sleep(200)
  result.after = text_of(buf)

  local stats
  client:request('specls/stats', {}, function(err, res)
    stats = err and { error = tostring(err.message or err) } or res
  end, buf)
  wait_until(10000, function()
    return stats ~= nil
  end)
  result.stats = stats
  result.ok = true
  finish()
end

co = coroutine.create(run)
vim.schedule(resume)
vim.defer_fn(function()
  fail('global timeout')
end, (tonumber(os.getenv('SPECLS_E2E_TIMEOUT_MS') or '') or 60000) + 60000)
