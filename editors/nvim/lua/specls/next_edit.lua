-- specls next-edit suggestions for Neovim (0.11+): after an edit and a short pause the plugin asks the
-- server for the edit the user is likely to make next (`textDocument/copilotInlineEdit`, see
-- docs/next-edit.md) and shows it: the text it removes highlighted (SpeclsNextEditDelete), the lines it
-- makes as virtual lines below (SpeclsNextEditAdd). The accept key (Tab when no inline completion is
-- showing) jumps to it when the cursor is elsewhere, and applies it when the cursor is there; typing or
-- Esc dismisses it. An edit for a buffer version that is gone is never shown.
local M = {}

local METHOD = 'textDocument/copilotInlineEdit'
local ns = vim.api.nvim_create_namespace('specls.next_edit')

local config = { debounce_ms = 300 }

---@class specls.NextEdit
---@field buf integer
---@field client_id integer
---@field edit table the server's item: { text, range, textDocument = { uri, version }, command }
---@field row integer 0-based first line of the range
---@field col integer byte column where the range starts
---@field end_row integer
---@field end_col integer byte column where the range ends

---@type table<integer, specls.NextEdit>
local pending = {}
---@type table<integer, { client: vim.lsp.Client, id: integer }>
local in_flight = {}
---@type table<integer, uv.uv_timer_t>
local timers = {}

local function set_highlights()
  vim.api.nvim_set_hl(0, 'SpeclsNextEditDelete', { link = 'DiffDelete', default = true })
  vim.api.nvim_set_hl(0, 'SpeclsNextEditAdd', { link = 'DiffAdd', default = true })
end

local function cancel(buf)
  local req = in_flight[buf]
  in_flight[buf] = nil
  if req then
    pcall(req.client.cancel_request, req.client, req.id)
  end
end

--- Hide the next edit shown in `buf` (default: the current buffer) and drop its request in flight.
function M.dismiss(buf)
  buf = buf or vim.api.nvim_get_current_buf()
  cancel(buf)
  pending[buf] = nil
  if vim.api.nvim_buf_is_valid(buf) then
    vim.api.nvim_buf_clear_namespace(buf, ns, 0, -1)
  end
end

--- The lines the edit leaves where its range was: the start line's text before the range, the new
--- text, the end line's text after the range.
local function new_lines(p)
  local first = vim.api.nvim_buf_get_lines(p.buf, p.row, p.row + 1, false)[1] or ''
  local last = vim.api.nvim_buf_get_lines(p.buf, p.end_row, p.end_row + 1, false)[1] or ''
  local text = first:sub(1, p.col) .. p.edit.text .. last:sub(p.end_col + 1)
  return vim.split(text, '\n', { plain = true })
end

local function render(p)
  vim.api.nvim_buf_clear_namespace(p.buf, ns, 0, -1)
  if p.end_row > p.row or p.end_col > p.col then
    vim.api.nvim_buf_set_extmark(p.buf, ns, p.row, p.col, {
      end_row = p.end_row,
      end_col = p.end_col,
      hl_group = 'SpeclsNextEditDelete',
      strict = false,
    })
  end
  local virt = {}
  for _, line in ipairs(new_lines(p)) do
    virt[#virt + 1] = { { line, 'SpeclsNextEditAdd' } }
  end
  vim.api.nvim_buf_set_extmark(p.buf, ns, p.end_row, 0, { virt_lines = virt, strict = false })
end

local function byte_col(buf, row, character, encoding)
  local line = vim.api.nvim_buf_get_lines(buf, row, row + 1, false)[1]
  if not line then
    return nil
  end
  local ok, col = pcall(vim.str_byteindex, line, encoding, character, false)
  return ok and col or nil
end

local function show(buf, client, edit)
  local r = edit.range
  local col = byte_col(buf, r.start.line, r.start.character, client.offset_encoding)
  local end_col = byte_col(buf, r['end'].line, r['end'].character, client.offset_encoding)
  if not col or not end_col then
    return
  end
  local p = {
    buf = buf,
    client_id = client.id,
    edit = edit,
    row = r.start.line,
    col = col,
    end_row = r['end'].line,
    end_col = end_col,
  }
  pending[buf] = p
  render(p)
  if edit.command then
    client:notify('textDocument/didShowInlineEdit', { item = { command = edit.command } })
  end
end

--- Ask for the next edit at the cursor of the current window (its buffer must be `buf`).
function M.request(buf)
  if vim.api.nvim_get_current_buf() ~= buf then
    return
  end
  local client = vim.lsp.get_clients({ bufnr = buf, name = 'specls' })[1]
  if not client then
    return
  end
  cancel(buf)
  local win = vim.api.nvim_get_current_win()
  local params = vim.lsp.util.make_position_params(win, client.offset_encoding)
  local version = vim.lsp.util.buf_versions[buf]
  params.textDocument.version = version
  local ok, id = client:request(METHOD, params, function(err, result)
    in_flight[buf] = nil
    local edit = not err and result and result.edits and result.edits[1]
    if not edit or not vim.api.nvim_buf_is_valid(buf) then
      return
    end
    -- never an edit for a version the buffer has left, nor for another buffer
    local doc = edit.textDocument
    if doc.version ~= vim.lsp.util.buf_versions[buf] or doc.uri ~= params.textDocument.uri then
      return
    end
    show(buf, client, edit)
  end, buf)
  if ok and id then
    in_flight[buf] = { client = client, id = id }
  end
end

local function schedule(buf)
  local timer = timers[buf]
  if not timer then
    timer = assert(vim.uv.new_timer())
    timers[buf] = timer
  end
  timer:stop()
  timer:start(config.debounce_ms, 0, vim.schedule_wrap(function()
    if vim.api.nvim_buf_is_valid(buf) then
      M.request(buf)
    end
  end))
end

--- Whether a next edit is shown in `buf` (default: the current buffer).
function M.have(buf)
  return pending[buf or vim.api.nvim_get_current_buf()] ~= nil
end

--- The next edit shown in `buf` (the server's item), for statuslines and tests; nil when none.
function M.get(buf)
  local p = pending[buf or vim.api.nvim_get_current_buf()]
  return p and p.edit or nil
end

--- The accept key: jump to the next edit when the cursor is not on its lines, else apply it (and tell
--- the server through the item's command). Returns false when there is none.
function M.accept()
  local buf = vim.api.nvim_get_current_buf()
  local p = pending[buf]
  if not p then
    return false
  end
  local cursor = vim.api.nvim_win_get_cursor(0)
  if cursor[1] - 1 < p.row or cursor[1] - 1 > p.end_row then
    vim.cmd("normal! m'") -- the jump list gets the place the user was
    vim.api.nvim_win_set_cursor(0, { p.row + 1, p.col })
    return true
  end
  local client = vim.lsp.get_client_by_id(p.client_id)
  M.dismiss(buf)
  if not client then
    return false
  end
  local lines = vim.split(p.edit.text, '\n', { plain = true })
  vim.api.nvim_buf_set_text(buf, p.row, p.col, p.end_row, p.end_col, lines)
  local last_row = p.row + #lines - 1
  local last_col = (#lines == 1 and p.col or 0) + #lines[#lines]
  pcall(vim.api.nvim_win_set_cursor, 0, { last_row + 1, last_col })
  local cmd = p.edit.command
  if cmd then
    client:request('workspace/executeCommand', { command = cmd.command, arguments = cmd.arguments }, nil, buf)
  end
  schedule(buf) -- the edit after this one
  return true
end

--- Ask after edits in `buf`; typing dismisses what is shown.
function M.attach(client, buf, opts)
  config.debounce_ms = opts.next_edit_debounce_ms or config.debounce_ms
  set_highlights()
  local group = vim.api.nvim_create_augroup('specls.next_edit.' .. buf, { clear = true })
  vim.api.nvim_create_autocmd({ 'TextChanged', 'TextChangedI' }, {
    group = group,
    buffer = buf,
    callback = function()
      M.dismiss(buf)
      schedule(buf)
    end,
  })
  vim.api.nvim_create_autocmd({ 'BufLeave' }, {
    group = group,
    buffer = buf,
    callback = function()
      M.dismiss(buf)
    end,
  })
  vim.api.nvim_create_autocmd('LspDetach', {
    group = group,
    buffer = buf,
    callback = function(ev)
      if ev.data.client_id == client.id then
        M.dismiss(buf)
        pcall(vim.api.nvim_del_augroup_by_id, group)
      end
    end,
  })
  vim.api.nvim_create_autocmd('ColorScheme', { group = group, callback = set_highlights })
  if not M._esc then
    -- Esc dismisses (in any mode; it does nothing else to the edit)
    local esc = vim.keycode('<Esc>')
    M._esc = vim.on_key(function(_, typed)
      if typed == esc and next(pending) ~= nil then
        vim.schedule(function()
          M.dismiss()
        end)
      end
    end)
  end
end

return M
