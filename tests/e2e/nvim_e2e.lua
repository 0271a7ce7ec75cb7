-- Drives real Neovim with the specls plugin against a real `specls serve`:
--   nvim --headless --clean -S tests/e2e/nvim_e2e.lua
-- Environment: SPECLS_E2E_PLUGIN (editors/nvim), SPECLS_E2E_CMD (JSON list) or SPECLS_E2E_TCP (host:port),
-- SPECLS_E2E_FILE (a Python file; the cursor goes to the end of its last line), SPECLS_E2E_RESULT (JSON
-- written here), SPECLS_E2E_TIMEOUT_MS (for the ghost text to appear).
-- Result: { ok, error?, version, native, ghost, before, after, row, col, attach_ms, ghost_ms, log,
-- progress (the load progress messages the plugin showed) }.
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

local co -- the test coroutine: it yields to the main loop while it waits, so typed keys get processed

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

--- Wait (in the main loop) until cond() is true or timeout_ms passed; returns cond()'s last value.
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

local function run()
  local v = vim.version()
  result.version = string.format('%d.%d.%d', v.major, v.minor, v.patch)
  vim.opt.runtimepath:prepend(assert(os.getenv('SPECLS_E2E_PLUGIN')))
  local timeout = tonumber(os.getenv('SPECLS_E2E_TIMEOUT_MS') or '') or 120000

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
  result.progress = {}
  vim.api.nvim_create_autocmd('LspProgress', {
    callback = function()
      local m = specls.progress()
      if m and m ~= result.progress[#result.progress] then
        table.insert(result.progress, m)
      end
    end,
  })
  result.native = vim.lsp.inline_completion ~= nil

  vim.cmd.edit(vim.fn.fnameescape(assert(os.getenv('SPECLS_E2E_FILE'))))
  local buf = vim.api.nvim_get_current_buf()
  log('opened, filetype=' .. vim.bo[buf].filetype)

  local client
  local attached = wait_until(60000, function()
    client = vim.lsp.get_clients({ bufnr = buf, name = 'specls' })[1]
    return client ~= nil and client.initialized == true
  end)
  if not attached then
    return fail('the specls client did not attach within 60 s')
  end
  result.attach_ms = ms()
  log('attached, server capabilities inlineCompletionProvider=' .. vim.inspect(
    client.server_capabilities.inlineCompletionProvider ~= nil))
  if not client.server_capabilities.inlineCompletionProvider then
    return fail('server does not advertise inlineCompletionProvider')
  end

  -- Insert mode at the end of the last line, and stay there.
  local last = vim.api.nvim_buf_line_count(buf)
  vim.api.nvim_win_set_cursor(0, { last, 0 })
  feed('A', 'n')
  wait_until(5000, function()
    return vim.fn.mode() == 'i'
  end)
  log('mode=' .. vim.fn.mode())

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
    local deadline = ms() + timeout
    local retrigger_at = ms() + 5000
    while ms() < deadline do
      wait_until(200, function()
        text, row, col, pos = ghost()
        return text ~= nil
      end, 20)
      if text then
        return text, row, col, pos
      end
      if ms() > retrigger_at then
        -- e.g. the first request came while the model was still loading: leave and re-enter Insert mode
        log('no ghost text yet; re-entering Insert mode')
        feed('<Esc>A', 'n')
        retrigger_at = ms() + 5000
      end
    end
  end

  local text, row, col, pos = await_ghost()
  if not text then
    return fail(string.format('no ghost text within %d ms', timeout))
  end
  if not result.native then
    -- 0.11 fallback: the dismiss key hides it (and it stays hidden without an edit); an edit asks again
    feed('<C-]>', 'mt')
    wait_until(2000, function()
      return ghost() == nil
    end, 20)
    sleep(500)
    result.dismissed = ghost() == nil
    log('after dismiss: ' .. (ghost() or '(no ghost text)'))
    local line = vim.api.nvim_get_current_line()
    feed('<BS>' .. line:sub(-1), 'n')
    text, row, col, pos = await_ghost()
    if not text then
      return fail('no ghost text after an edit following the dismiss')
    end
  end
  result.ghost_ms = ms()
  result.ghost = text
  result.virt_text_pos = pos
  local cursor = vim.api.nvim_win_get_cursor(0)
  result.row, result.col = cursor[1] - 1, cursor[2]
  result.ghost_row, result.ghost_col = row, col
  result.before = table.concat(vim.api.nvim_buf_get_lines(buf, 0, -1, false), '\n')
  log(string.format('ghost at %d:%d %q', row, col, text))

  local tick = vim.api.nvim_buf_get_changedtick(buf)
  -- The accept key through its mapping, as a user presses it.
  feed('<Tab>', 'mt')
  wait_until(5000, function()
    return vim.api.nvim_buf_get_changedtick(buf) ~= tick
  end, 20)
  sleep(200) -- let the accept finish (cursor move, 0.12's scheduled apply)
  result.after = table.concat(vim.api.nvim_buf_get_lines(buf, 0, -1, false), '\n')
  result.after_mode = vim.fn.mode()
  -- the server's counters after the accept (the plugin sent specls/accepted before this request)
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
-- a hard stop so nothing hangs
vim.defer_fn(function()
  fail('global timeout')
end, (tonumber(os.getenv('SPECLS_E2E_TIMEOUT_MS') or '') or 120000) + 90000)
