-- The shared part of the Neovim e2e scripts (nvim_e2e.lua, nvim_next_edit_e2e.lua), loaded with dofile:
-- the result they write and its log, the test coroutine and its waits, keys, the plugin, the file and the
-- specls client, the server's counters at the end.
-- Environment: SPECLS_E2E_PLUGIN (editors/nvim), SPECLS_E2E_FILE, SPECLS_E2E_RESULT, SPECLS_E2E_TIMEOUT_MS.
local M = {}
local uv = vim.uv
local t0 = uv.hrtime()

function M.ms()
  return math.floor((uv.hrtime() - t0) / 1e6)
end

M.result = { ok = false, log = {} }
local result = M.result

function M.log(msg)
  local line = string.format('%6d ms %s', M.ms(), msg)
  table.insert(result.log, line)
  io.stderr:write(line .. '\n')
end

function M.finish()
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
    M.finish()
  end
end

function M.sleep(n)
  vim.defer_fn(resume, n)
  coroutine.yield()
end

--- Wait (in the main loop) until cond() is true or timeout_ms passed; returns cond()'s last value.
function M.wait_until(timeout_ms, cond, step)
  local stop = M.ms() + timeout_ms
  while true do
    local v = cond()
    if v or M.ms() >= stop then
      return v
    end
    M.sleep(step or 50)
  end
end

function M.feed(keys, mode)
  vim.api.nvim_feedkeys(vim.api.nvim_replace_termcodes(keys, true, false, true), mode, false)
end

function M.fail(msg)
  result.error = msg
  M.log('FAIL: ' .. msg)
  M.finish()
end

function M.text_of(buf)
  return table.concat(vim.api.nvim_buf_get_lines(buf, 0, -1, false), '\n')
end

--- SPECLS_E2E_TIMEOUT_MS, else the script's default.
function M.timeout_ms(default)
  return tonumber(os.getenv('SPECLS_E2E_TIMEOUT_MS') or '') or default
end

--- The Neovim version into the result, and the plugin on the runtimepath.
function M.load_plugin()
  local v = vim.version()
  result.version = string.format('%d.%d.%d', v.major, v.minor, v.patch)
  vim.opt.runtimepath:prepend(assert(os.getenv('SPECLS_E2E_PLUGIN')))
end

--- SPECLS_E2E_FILE opened; its buffer.
function M.open_file()
  vim.cmd.edit(vim.fn.fnameescape(assert(os.getenv('SPECLS_E2E_FILE'))))
  return vim.api.nvim_get_current_buf()
end

--- The specls client once it attached to buf and initialized; nil (the run failed) after 60 s without.
function M.attach(buf)
  local client
  local attached = M.wait_until(60000, function()
    client = vim.lsp.get_clients({ bufnr = buf, name = 'specls' })[1]
    return client ~= nil and client.initialized == true
  end)
  if not attached then
    M.fail('the specls client did not attach within 60 s')
    return nil
  end
  return client
end

--- The run's end: the server's counters (specls/stats) into the result, ok, and the result written.
function M.finish_with_stats(client, buf)
  local stats
  client:request('specls/stats', {}, function(err, res)
    stats = err and { error = tostring(err.message or err) } or res
  end, buf)
  M.wait_until(10000, function()
    return stats ~= nil
  end)
  result.stats = stats
  result.ok = true
  M.finish()
end

--- Run ``run`` as the test coroutine, with a hard stop grace_ms after the timeout so nothing hangs.
function M.start(run, default_timeout_ms, grace_ms)
  co = coroutine.create(run)
  vim.schedule(resume)
  vim.defer_fn(function()
    M.fail('global timeout')
  end, M.timeout_ms(default_timeout_ms) + grace_ms)
end

return M
