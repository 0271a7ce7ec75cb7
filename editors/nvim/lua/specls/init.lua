-- specls for Neovim (0.11+): registers the specls language server and shows its inline completions.
--
--   require('specls').setup({
--     cmd = { 'specls', 'serve' },    -- or tcp = '127.0.0.1:7777' for a team server
--     settings = { maxTokens = 64 },  -- sent as initializationOptions and workspace/didChangeConfiguration
--                                     -- (also: draftLength = 12, the most tokens one pass drafts, ...)
--     accept_key = '<Tab>',           -- accepts the suggestion; falls back to the key itself
--   })
--
-- Neovim 0.12+: native vim.lsp.inline_completion. Neovim 0.11: a small ghost-text fallback
-- (request on idle in Insert mode, shown as an inline extmark, cleared on edit).
local M = {}

local defaults = {
  cmd = { 'specls', 'serve' },
  tcp = nil, -- 'host:port' or { host, port }
  settings = {},
  accept_key = '<Tab>',
  dismiss_key = '<C-]>',
  filetypes = { 'python', 'javascript', 'typescript', 'go', 'rust', 'c', 'cpp', 'java', 'sh', 'lua' },
  root_markers = { '.git', 'pyproject.toml', 'package.json' },
  debounce_ms = 75, -- 0.11 fallback only
  native = nil, -- nil: native inline completion when this Neovim has it; false: always the fallback
  next_edit = true, -- next-edit suggestions (lua/specls/next_edit.lua); the accept key applies them too
  next_edit_key = '<Tab>', -- Normal mode: jump to / apply the next edit; falls back to the key itself
  next_edit_debounce_ms = 300,
}

local NAME = 'specls'
local ns = vim.api.nvim_create_namespace('specls.ghost')
local opts = vim.deepcopy(defaults)

---@class specls.Ghost
---@field buf integer
---@field row integer 0-based
---@field col integer byte column of the cursor
---@field end_col integer byte column where the replaced range ends (>= col)
---@field text string what accepting inserts at the cursor
---@field item table the LSP InlineCompletionItem
---@field client_id integer

---@type table<integer, specls.Ghost>
local ghosts = {}
---@type table<integer, uv.uv_timer_t>
local timers = {}
---@type table<integer, integer>
local generation = {} -- per buffer: bumped on every edit so late answers are dropped

local function use_native()
  if opts.native == false then
    return false
  end
  return vim.lsp.inline_completion ~= nil and vim.lsp.inline_completion.enable ~= nil
end

local function parse_tcp(tcp)
  if type(tcp) == 'table' then
    return tcp[1], tonumber(tcp[2])
  end
  local host, port = tostring(tcp):match('^%[?([^%]]+)%]?:(%d+)$')
  return host, tonumber(port)
end

--- The text an item inserts at (row, col), and the byte column its range ends at; nil when the item
--- does not continue what is left of the cursor.
local function item_text(item, buf, row, col, encoding)
  local text = item.insertText
  if type(text) == 'table' then -- StringValue (snippet): plain text only
    text = text.value
  end
  if type(text) ~= 'string' or text == '' then
    return nil
  end
  local end_col = col
  local range = item.range
  if range then
    local line = vim.api.nvim_buf_get_lines(buf, row, row + 1, false)[1] or ''
    if range.start.line ~= row then
      return nil
    end
    local start_col = vim.str_byteindex(line, encoding, range.start.character, false)
    if range['end'].line == row then
      end_col = math.max(col, vim.str_byteindex(line, encoding, range['end'].character, false))
    end
    local typed = line:sub(start_col + 1, col)
    if text:sub(1, #typed) ~= typed then
      return nil
    end
    text = text:sub(#typed + 1)
  end
  if text == '' then
    return nil
  end
  return text, end_col
end

local function clear(buf)
  ghosts[buf] = nil
  if vim.api.nvim_buf_is_valid(buf) then
    vim.api.nvim_buf_clear_namespace(buf, ns, 0, -1)
  end
end

local function render(g)
  local lines = vim.split(g.text, '\n', { plain = true })
  local extra = {}
  for i = 2, #lines do
    extra[#extra + 1] = { { lines[i], 'Comment' } }
  end
  vim.api.nvim_buf_set_extmark(g.buf, ns, g.row, g.col, {
    virt_text = { { lines[1], 'Comment' } },
    virt_text_pos = 'inline',
    virt_lines = #extra > 0 and extra or nil,
    hl_mode = 'combine',
  })
end

local function notify_accepted(client, buf, item, text)
  local args = { uri = vim.uri_from_bufnr(buf), text = text }
  local cmd = item.command
  if cmd and cmd.arguments and type(cmd.arguments[1]) == 'table' then
    args = vim.tbl_extend('keep', cmd.arguments[1], args)
  end
  client:notify('specls/accepted', args)
end

--- 0.11 fallback: ask the server for a completion at the cursor and show it.
local function request(buf)
  if ghosts[buf] or vim.api.nvim_get_current_buf() ~= buf or not vim.fn.mode():match('^i') then
    return
  end
  local client = vim.lsp.get_clients({ bufnr = buf, name = NAME })[1]
  if not client then
    return
  end
  local win = vim.api.nvim_get_current_win()
  local cursor = vim.api.nvim_win_get_cursor(win)
  local row, col = cursor[1] - 1, cursor[2]
  local gen = generation[buf] or 0
  local params = vim.lsp.util.make_position_params(win, client.offset_encoding)
  params.context = { triggerKind = 2 } -- Automatic
  client:request('textDocument/inlineCompletion', params, function(err, result)
    if err or not result or (generation[buf] or 0) ~= gen or not vim.api.nvim_buf_is_valid(buf) then
      return
    end
    local now = vim.api.nvim_win_is_valid(win) and vim.api.nvim_win_get_cursor(win)
    if not now or now[1] - 1 ~= row or now[2] ~= col or not vim.fn.mode():match('^i') then
      return
    end
    local items = result.items or result
    for _, item in ipairs(items) do
      local text, end_col = item_text(item, buf, row, col, client.offset_encoding)
      if text then
        clear(buf)
        local g = { buf = buf, row = row, col = col, end_col = end_col, text = text, item = item, client_id = client.id }
        ghosts[buf] = g
        render(g)
        return
      end
    end
  end, buf)
end

local function schedule_request(buf)
  generation[buf] = (generation[buf] or 0) + 1
  clear(buf)
  local timer = timers[buf]
  if not timer then
    timer = assert(vim.uv.new_timer())
    timers[buf] = timer
  end
  timer:stop()
  timer:start(opts.debounce_ms, 0, vim.schedule_wrap(function()
    if vim.api.nvim_buf_is_valid(buf) then
      request(buf)
    end
  end))
end

--- Accept the suggestion shown in the current buffer. Returns false when there is none.
function M.accept()
  local buf = vim.api.nvim_get_current_buf()
  if use_native() and vim.lsp.inline_completion.is_enabled({ bufnr = buf }) then
    return vim.lsp.inline_completion.get({
      bufnr = buf,
      on_accept = function(item)
        -- an item with a command reports itself (vim.lsp.commands['specls.accepted'] below)
        local client = not item.command and vim.lsp.get_client_by_id(item.client_id)
        if client and client.name == NAME then
          local text = type(item.insert_text) == 'string' and item.insert_text or item.insert_text.value
          client:notify('specls/accepted', { uri = vim.uri_from_bufnr(buf), text = text })
        end
        return item
      end,
    })
  end
  local g = ghosts[buf]
  if not g then
    return false
  end
  clear(buf)
  generation[buf] = (generation[buf] or 0) + 1
  local lines = vim.split(g.text, '\n', { plain = true })
  vim.api.nvim_buf_set_text(buf, g.row, g.col, g.row, g.end_col, lines)
  local last_row = g.row + #lines - 1
  local last_col = (#lines == 1 and g.col or 0) + #lines[#lines]
  vim.api.nvim_win_set_cursor(0, { last_row + 1, last_col })
  local client = vim.lsp.get_client_by_id(g.client_id)
  if client then
    notify_accepted(client, buf, g.item, g.text)
  end
  -- setting the cursor and text from Lua fires no TextChangedI for this; start over from here
  schedule_request(buf)
  return true
end

--- Hide the suggestion in the current buffer.
function M.dismiss()
  local buf = vim.api.nvim_get_current_buf()
  generation[buf] = (generation[buf] or 0) + 1
  clear(buf)
end

local function press(key)
  vim.api.nvim_feedkeys(vim.api.nvim_replace_termcodes(key, true, false, true), 'n', false)
end

local function map_keys(buf)
  if opts.accept_key then
    vim.keymap.set('i', opts.accept_key, function()
      -- an inline completion first; without one, the next edit
      if not M.accept() and not (opts.next_edit and require('specls.next_edit').accept()) then
        press(opts.accept_key)
      end
    end, { buffer = buf, desc = 'specls: accept the inline completion (or the next edit)' })
  end
  if opts.next_edit and opts.next_edit_key then
    vim.keymap.set('n', opts.next_edit_key, function()
      if not require('specls.next_edit').accept() then
        press(opts.next_edit_key)
      end
    end, { buffer = buf, desc = 'specls: jump to / apply the next edit' })
  end
  if opts.dismiss_key and not use_native() then
    vim.keymap.set('i', opts.dismiss_key, function()
      if ghosts[buf] then
        M.dismiss()
      else
        press(opts.dismiss_key)
      end
    end, { buffer = buf, desc = 'specls: dismiss the inline completion' })
  end
end

local function attach_fallback(buf)
  local group = vim.api.nvim_create_augroup('specls.ghost.' .. buf, { clear = true })
  vim.api.nvim_create_autocmd({ 'InsertEnter', 'TextChangedI', 'TextChangedP', 'CursorMovedI' }, {
    group = group,
    buffer = buf,
    callback = function(ev)
      local g = ghosts[buf]
      if ev.event == 'CursorMovedI' and g then
        local c = vim.api.nvim_win_get_cursor(0)
        if c[1] - 1 == g.row and c[2] == g.col then
          return -- still where the suggestion is
        end
      end
      schedule_request(buf)
    end,
  })
  vim.api.nvim_create_autocmd({ 'InsertLeave', 'BufLeave' }, {
    group = group,
    buffer = buf,
    callback = function()
      generation[buf] = (generation[buf] or 0) + 1
      clear(buf)
    end,
  })
  -- the model finished loading (a request before that got nothing): ask again if still typing here
  vim.api.nvim_create_autocmd('LspProgress', {
    group = group,
    pattern = 'end',
    callback = function(ev)
      local c = vim.lsp.get_client_by_id(ev.data.client_id)
      if c and c.name == NAME and vim.api.nvim_get_current_buf() == buf and vim.fn.mode():match('^i') then
        schedule_request(buf)
      end
    end,
  })
  vim.api.nvim_create_autocmd('LspDetach', {
    group = group,
    buffer = buf,
    callback = function(ev)
      local c = vim.lsp.get_client_by_id(ev.data.client_id)
      if c and c.name == NAME then
        clear(buf)
        pcall(vim.api.nvim_del_augroup_by_id, group)
      end
    end,
  })
end

local function on_attach(client, buf)
  if use_native() then
    vim.lsp.inline_completion.enable(true, { bufnr = buf })
  else
    attach_fallback(buf)
    if vim.fn.mode():match('^i') then
      schedule_request(buf)
    end
  end
  map_keys(buf)
  if opts.next_edit then
    require('specls.next_edit').attach(client, buf, opts)
  end
  -- Telemetry for native accepts: the item's command runs on accept; report it to the server.
  if use_native() and not (vim.lsp.commands['specls.accepted']) then
    vim.lsp.commands['specls.accepted'] = function(command, ctx)
      local c = vim.lsp.get_client_by_id(ctx.client_id)
      if c then
        c:notify('specls/accepted', (command.arguments or {})[1] or {})
      end
    end
  end
end

-- The server's model-load progress ($/progress): while a model given by name is prepared it says
-- "downloading 43%", "converting: quantizing"; echoed (no history) and kept for statuslines.
local progress_message = nil

local function show_progress(ev)
  local c = vim.lsp.get_client_by_id(ev.data.client_id)
  local value = ev.data.params and ev.data.params.value
  if not (c and c.name == NAME and type(value) == 'table') then
    return
  end
  if value.kind == 'end' then
    progress_message = nil
    vim.api.nvim_echo({ { 'specls: ' .. (value.message or 'ready') } }, false, {})
  elseif value.message then
    progress_message = value.message
    vim.api.nvim_echo({ { 'specls: ' .. value.message } }, false, {})
  end
end

function M.setup(user)
  opts = vim.tbl_deep_extend('force', vim.deepcopy(defaults), user or {})
  vim.api.nvim_create_autocmd('LspProgress', {
    group = vim.api.nvim_create_augroup('specls.progress', { clear = true }),
    callback = show_progress,
  })
  local cmd = opts.cmd
  if opts.tcp then
    local host, port = parse_tcp(opts.tcp)
    if not host or not port then
      vim.notify('specls: tcp must be "host:port", got ' .. vim.inspect(opts.tcp), vim.log.levels.ERROR)
      return
    end
    cmd = vim.lsp.rpc.connect(host, port)
  end
  vim.lsp.config(NAME, {
    cmd = cmd,
    filetypes = opts.filetypes,
    root_markers = opts.root_markers,
    init_options = opts.settings,
    settings = { specls = opts.settings },
    on_attach = on_attach,
  })
  vim.lsp.enable(NAME)
end

--- The model-load progress the server reported last ("downloading 43%", "converting: quantizing"), or
--- nil once loaded: for statuslines.
function M.progress()
  return progress_message
end

--- The suggestion currently shown by the 0.11 fallback in `buf` (for statuslines and tests), or nil.
function M.ghost_text(buf)
  local g = ghosts[buf or vim.api.nvim_get_current_buf()]
  return g and g.text or nil
end

return M
