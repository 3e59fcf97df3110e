// The operator console: every figure is an answer of the admin API, every action one call of it.
// Data only ever reaches the page as text (textContent, attributes): never as HTML.
(() => {
  'use strict';

  const API = '/admin/v1';
  const TOKEN_KEY = 'pin-identity.admin-token';
  const POLL_RUNNING_MS = 2000;
  const POLL_HEALTH_MS = 5000;
  const CONFIRM_MS = 4000;
  const SECTIONS = ['imports', 'quarantine', 'fanout', 'roles', 'access', 'health'];

  const state = {
    token: sessionStorage.getItem(TOKEN_KEY), operator: null, timer: null, armed: new Map(), selectedRun: null,
    closedRun: null, items: [], roles: [],
  };

  // What the signed-in operator may do, as GET /whoami said: a viewer is offered no action at all. The server
  // decides regardless (a viewer's action is 403 IDENTITY_ADMIN_FORBIDDEN).
  const canAct = () => Boolean(state.operator && state.operator.role === 'operator');

  // ------------------------------------------------------------------ small helpers

  const $ = (selector, root = document) => root.querySelector(selector);

  function h(tag, props = {}, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props)) {
      if (value === undefined || value === null || value === false) continue;
      if (key === 'class') node.className = value;
      else if (key === 'text') node.textContent = value;
      else if (key === 'dataset') Object.assign(node.dataset, value);
      else if (key.startsWith('on')) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? '' : String(value));
    }
    for (const child of children.flat(Infinity)) {
      if (child !== null && child !== undefined && child !== false) node.append(child);
    }
    return node;
  }

  const number = (n) => (n === null || n === undefined ? '—' : Number(n).toLocaleString('en-US'));

  function utc(iso) {
    if (!iso) return '—';
    const when = new Date(iso);
    return Number.isNaN(when.getTime()) ? String(iso) : when.toISOString().slice(0, 19).replace('T', ' ');
  }

  const timeCell = (iso) => h('td', { class: 'nowrap', title: iso || '' }, utc(iso));

  function duration(seconds) {
    if (seconds === null || seconds === undefined) return '—';
    const s = Math.max(0, Math.round(seconds));
    if (s < 60) return `${s} s`;
    if (s < 3600) return `${Math.floor(s / 60)} min ${String(s % 60).padStart(2, '0')} s`;
    return `${Math.floor(s / 3600)} h ${String(Math.floor((s % 3600) / 60)).padStart(2, '0')} min`;
  }

  const badge = (status) => h('span', { class: `badge badge-${String(status).toLowerCase()}` }, status);
  const mono = (text) => h('code', { class: 'id' }, text === null || text === undefined ? '—' : String(text));
  const counters = (c) => `${number(c.planned)} / ${number(c.applied)} / ${number(c.skipped)} / ${number(c.failed)}`;

  function button(label, onclick, props = {}) {
    return h('button', { type: 'button', onclick, ...props }, label);
  }

  // A second click within a few seconds confirms (no modal dialog to get in the way). Armed actions are kept
  // by key, so a button redrawn by a poll in between is still armed.
  const CONFIRM_TEXT = 'Click again to confirm';

  function confirming(key, label, action, props = {}) {
    const armed = () => (state.armed.get(key) || 0) > Date.now();
    const node = button(armed() ? CONFIRM_TEXT : label, () => {
      if (armed()) {
        state.armed.delete(key);
        node.textContent = label;
        action();
        return;
      }
      state.armed.set(key, Date.now() + CONFIRM_MS);
      node.textContent = CONFIRM_TEXT;
      setTimeout(() => { if (!armed()) node.textContent = label; }, CONFIRM_MS + 50);
    }, props);
    return node;
  }

  // A poll redraws its section by replacing the section's nodes, buttons included. A click whose press and
  // release fell either side of a redraw would press one button and release another, and the browser fires no
  // click at all: the operator's click is lost. So what a load draws while a pointer is pressed waits for the
  // release (the latest draw of each kind), and is drawn once the click, if any, has been handled.
  const pressing = { down: false, waiting: new Map() };
  document.addEventListener('pointerdown', () => { pressing.down = true; }, true);
  const released = () => {
    pressing.down = false;
    setTimeout(() => {  // after the click this release makes, which the browser dispatches next
      if (pressing.down) return;
      const waiting = [...pressing.waiting.values()];
      pressing.waiting.clear();
      document.documentElement.dataset.drawsWaiting = '0';
      waiting.forEach((draw) => draw());
    }, 0);
  };
  document.addEventListener('pointerup', released, true);
  document.addEventListener('pointercancel', released, true);

  function draw(kind, render) {
    if (!pressing.down) return render();
    pressing.waiting.set(kind, render);
    document.documentElement.dataset.drawsWaiting = String(pressing.waiting.size);
    return undefined;
  }

  // Each section draws only the answer of its latest load: a slower, older one (a poll, the reload after an
  // action) must not overwrite what a newer one, started by the operator meanwhile, drew.
  const generations = new Map();

  function latest(key) {
    const mine = (generations.get(key) || 0) + 1;
    generations.set(key, mine);
    return () => generations.get(key) === mine;
  }

  function setRows(table, rows, emptyNote) {
    $('tbody', table).replaceChildren(...rows);
    const note = table.closest('section').querySelector('p.empty');
    if (note) {
      if (emptyNote) note.textContent = emptyNote;
      note.hidden = rows.length > 0;
    }
  }

  // ------------------------------------------------------------------ the API

  async function api(method, path, body) {
    const headers = { Accept: 'application/json', Authorization: `Bearer ${state.token}` };
    const init = { method, headers, cache: 'no-store', credentials: 'omit' };
    if (body !== undefined) {
      headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(API + path, init);
    } catch (error) {
      return { ok: false, status: 0, problem: { code: 'NO_ANSWER', detail: `serve did not answer (${error.message})` } };
    }
    const text = await response.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch (_) { data = null; }
    if (response.status === 401) tokenRefused(data);
    if (response.status === 403 && path !== '/whoami') signIn();  // the role may have changed: ask again
    if (response.ok) return { ok: true, status: response.status, data };
    return { ok: false, status: response.status, problem: data && typeof data === 'object' ? data : { detail: text } };
  }

  const STATUS_TEXT = { 200: 'OK', 202: 'Accepted' };

  // What the API answered, as it answered it: the status, and the problem's code and detail.
  function showOutcome(box, result, describe) {
    box.hidden = false;
    box.className = `outcome ${result.ok ? 'ok' : 'bad'}`;
    const stamp = h('span', { class: 'stamp' }, new Date().toISOString().slice(11, 19));
    if (result.ok) {
      box.replaceChildren(h('strong', {}, `${result.status} ${STATUS_TEXT[result.status] || ''}`), ' ', ...[describe(result.data)].flat(), ' ', stamp);
    } else {
      const problem = result.problem || {};
      box.replaceChildren(
        h('strong', {}, `${result.status || ''} ${problem.code || problem.title || 'error'}`), ' ',
        problem.detail || '', ' ', stamp,
      );
    }
  }

  function notice(text) {
    const box = $('#notice');
    box.textContent = text || '';
    box.hidden = !text;
  }

  // ------------------------------------------------------------------ token

  function tokenRefused(problem) {
    sessionStorage.removeItem(TOKEN_KEY);
    state.token = null;
    state.operator = null;
    stopTimer();
    const code = problem && problem.code ? problem.code : 'IDENTITY_UNAUTHORIZED';
    notice(`The token was refused (401 ${code}). Enter it again.`);
    showTokenState();
  }

  function showTokenState() {
    const hasToken = Boolean(state.token);
    const known = Boolean(hasToken && state.operator);
    $('#token-form').hidden = hasToken;
    $('#session').hidden = !hasToken;
    $('#welcome').hidden = hasToken;
    $('#main').hidden = !known;
    $('#signed-in').hidden = !known;
    if (known) {
      $('#operator-name').textContent = state.operator.name;
      $('#operator-role').textContent = state.operator.role === 'operator' ? 'operator' : 'viewer: read only';
      document.body.dataset.role = state.operator.role;
    } else {
      delete document.body.dataset.role;
      clearDrawn();
    }
    for (const control of document.querySelectorAll('[data-action]')) control.hidden = !canAct();
    if (!canAct()) $('#role-editor').hidden = true;
  }

  // Signed out, nothing drawn for the last operator stays in the page: not on a shared screen, and not for the
  // next operator, whose role may offer other actions.
  function clearDrawn() {
    for (const body of document.querySelectorAll('#main tbody')) body.replaceChildren();
    for (const box of document.querySelectorAll('#main .outcome, #run-detail')) box.hidden = true;
    $('#h-cards').replaceChildren();
    $('#role-editor').hidden = true;
    Object.assign(state, { items: [], roles: [], selectedRun: null, closedRun: null });
  }

  // Who the token belongs to and with which role; then the current section, drawn for that role.
  async function signIn() {
    if (!state.token) return showTokenState();
    const result = await api('GET', '/whoami');
    if (!result.ok) {
      if (result.status !== 401) {
        const problem = result.problem || {};
        notice(`Signing in: ${result.status || ''} ${problem.code || ''} ${problem.detail || ''}`.trim());
      }
      return showTokenState();
    }
    state.operator = result.data;
    showTokenState();
    show(currentSection());
    return undefined;
  }

  function useToken(event) {
    event.preventDefault();
    const input = $('#token-input');
    const token = input.value.trim();
    if (!token) return;
    state.token = token;
    sessionStorage.setItem(TOKEN_KEY, token);
    input.value = '';
    notice('');
    state.operator = null;
    signIn();
  }

  function forgetToken() {
    sessionStorage.removeItem(TOKEN_KEY);
    state.token = null;
    state.operator = null;
    stopTimer();
    notice('');
    showTokenState();
  }

  // ------------------------------------------------------------------ navigation and polling

  function stopTimer() {
    if (state.timer) clearTimeout(state.timer);
    state.timer = null;
  }

  function poll(load, ms) {
    stopTimer();
    state.timer = setTimeout(load, ms);
  }

  function currentSection() {
    const wanted = location.hash.slice(1);
    return SECTIONS.includes(wanted) ? wanted : 'imports';
  }

  const LOADERS = {};

  function show(name) {
    stopTimer();
    for (const section of SECTIONS) $(`#${section}`).hidden = section !== name;
    for (const tab of document.querySelectorAll('.tabs a')) {
      if (tab.dataset.section === name) tab.setAttribute('aria-current', 'page');
      else tab.removeAttribute('aria-current');
    }
    if (state.token && state.operator) LOADERS[name]();
  }

  // ------------------------------------------------------------------ imports

  async function loadImports() {
    const current = latest('imports');
    const result = await api('GET', '/talent-import/runs?limit=20');
    if (!current()) return undefined;
    if (!result.ok) return showOutcome($('#imports-outcome'), result);
    draw('runs', () => renderRuns(result.data));
    const running = result.data.find((run) => run.status === 'Running');
    const followed = running && running.runId !== state.closedRun ? running.runId : null;
    const selected = state.selectedRun || followed;
    if (selected) await loadRunDetail(selected, current);
    if (running && current() && currentSection() === 'imports') poll(loadImports, POLL_RUNNING_MS);
    return undefined;
  }

  function renderRuns(runs) {
    const rows = runs.map((run) => h('tr', { dataset: { runId: run.runId } },
      h('td', {}, mono(run.runId)),
      h('td', {}, badge(run.status)),
      h('td', {}, h('div', { class: 'row-actions' }, runActions(run, true))),
      h('td', {}, run.mode),
      h('td', {}, run.dryRun ? 'yes' : 'no'),
      h('td', { class: 'num' }, counters(run.companies)),
      h('td', { class: 'num' }, counters(run.users)),
      h('td', { class: 'num' }, number(run.quarantined)),
      timeCell(run.startedAt),
      timeCell(run.finishedAt),
    ));
    setRows($('#runs-table'), rows);
  }

  function runActions(run, withDetails) {
    const actions = [];
    if (withDetails) {
      actions.push(button('Details', () => { state.selectedRun = run.runId; state.closedRun = null; loadRunDetail(run.runId); }));
    }
    if (run.status === 'Running' && canAct()) {
      actions.push(confirming(`cancel:${run.runId}`, 'Cancel', () => cancelRun(run.runId), { class: 'danger' }));
      actions.push(button('Reset leases', () => resetLeases(run.runId)));
    }
    if (run.quarantined === undefined || run.quarantined > 0) {
      actions.push(button('Quarantine', () => { state.quarantineOwner = run.runId; location.hash = '#quarantine'; }));
    }
    return actions;
  }

  async function loadRunDetail(runId, current = () => true) {
    const result = await api('GET', `/talent-import/runs/${encodeURIComponent(runId)}`);
    if (!current()) return undefined;
    const card = $('#run-detail');
    if (!result.ok) {
      card.hidden = true;
      return showOutcome($('#imports-outcome'), result);
    }
    draw('run-detail', () => renderRunDetail(card, result.data));
    return undefined;
  }

  function stageProgress(report, stage) {
    const pages = report.pages[stage] || {};
    const total = Object.values(pages).reduce((sum, n) => sum + n, 0);
    const done = pages.Done || 0;
    const listing = report.planning === stage || (stage === 'Users' && report.planning === 'Tenants');
    return h('div', { class: 'stage', dataset: { stage } },
      h('div', { class: 'stage-head' },
        h('span', {}, `${stage} pages`),
        h('span', { class: 'num' }, `${number(done)} of ${number(total)} done${listing && report.status === 'Running' ? ' (still listing)' : ''}`)),
      h('progress', { max: Math.max(total, 1), value: done, 'aria-label': `${stage} pages done` }),
      h('div', { class: 'stage-pages' }, Object.entries(pages).map(([status, n]) => `${status} ${number(n)}`).join(' · ')),
    );
  }

  function renderRunDetail(card, report) {
    const total = Object.values(report.pages).flatMap(Object.values).reduce((sum, n) => sum + n, 0);
    const done = Object.values(report.pages).reduce((sum, pages) => sum + (pages.Done || 0), 0);
    const percent = total ? Math.floor((100 * done) / total) : 0;
    const running = report.status === 'Running';
    const facts = [
      ['Mode', report.mode], ['Dry run', report.dryRun ? 'yes' : 'no'],
      ['Companies p/a/s/f', counters(report.companies)], ['Users p/a/s/f', counters(report.users)],
      ['Started (UTC)', utc(report.startedAt)], ['Finished (UTC)', utc(report.finishedAt)],
      ['Duration', duration(report.durationMs / 1000)],
      ['ETA', running ? (report.etaSeconds === null ? 'not yet known (listing the source)' : duration(report.etaSeconds)) : '—'],
      ['Lock holder', report.lockHolder || 'nobody holds the run lock'],
    ];
    if (report.errorCode || report.error) facts.push(['Error', `${report.errorCode || ''} ${report.error || ''}`.trim()]);
    card.hidden = false;
    card.dataset.runId = report.runId;
    card.dataset.status = report.status;
    card.replaceChildren(
      h('div', { class: 'detail-head' },
        h('h3', {}, 'Run ', mono(report.runId), ' ', badge(report.status)),
        h('div', { class: 'row-actions' }, runActions(report, false),
          button('Close', () => { state.selectedRun = null; state.closedRun = report.runId; card.hidden = true; }, { class: 'quiet' }))),
      h('div', { class: 'overall' },
        h('progress', { id: 'run-progress', max: Math.max(total, 1), value: done, 'aria-label': 'pages done' }),
        h('span', { class: 'num', id: 'run-percent' }, `${percent}% of ${number(total)} pages planned so far`)),
      h('div', { class: 'stages' }, stageProgress(report, 'Tenants'), stageProgress(report, 'Users')),
      h('dl', { class: 'facts-grid' }, facts.map(([term, value]) => [h('dt', {}, term), h('dd', {}, value)])),
    );
  }

  async function startRun(event) {
    event.preventDefault();
    const form = event.target;
    const body = {
      mode: form.mode.value,
      pageSize: Number(form.pageSize.value),
      dryRun: form.dryRun.checked,
      force: form.force.checked,
    };
    const tenant = form.talentTenantIdFilter.value.trim();
    if (tenant) body.talentTenantIdFilter = tenant;
    const result = await api('POST', '/talent-import/runs', body);
    showOutcome($('#imports-outcome'), result, (data) => ['run ', mono(data.runId), ' created: a worker running the talent-import job works on it']);
    if (result.ok) state.selectedRun = result.data.runId;
    await loadImports();
  }

  async function cancelRun(runId) {
    const result = await api('POST', `/talent-import/runs/${encodeURIComponent(runId)}/cancel`);
    showOutcome($('#imports-outcome'), result, (data) => ['run ', mono(data.runId), ` is ${data.status}`]);
    await loadImports();
  }

  async function resetLeases(runId) {
    const result = await api('POST', `/talent-import/runs/${encodeURIComponent(runId)}/reset-leases`);
    showOutcome($('#imports-outcome'), result, (data) => `${number(data.pages)} InProgress pages claimable again`);
    await loadImports();
  }

  // ------------------------------------------------------------------ quarantine

  async function loadQuarantine() {
    const current = latest('quarantine');
    await fillOwners(current);
    if (!current()) return undefined;
    const owner = $('#q-owner').value;
    const path = owner === 'consumer' ? '/talent-sync/failed-items' : `/talent-import/runs/${encodeURIComponent(owner)}/failed-items`;
    const result = await api('GET', path);
    if (!current()) return undefined;
    if (!result.ok) return showOutcome($('#quarantine-outcome'), result);
    state.items = result.data;
    fillCodes();
    renderItems();
    return undefined;
  }

  async function fillOwners(current) {
    const select = $('#q-owner');
    const result = await api('GET', '/talent-import/runs?limit=50');
    if (!current()) return;
    const wanted = state.quarantineOwner || select.value;
    state.quarantineOwner = null;
    const runs = result.ok ? result.data : [];
    select.replaceChildren(
      h('option', { value: 'consumer' }, 'the talent-sync consumer'),
      ...runs.map((run) => h('option', { value: run.runId },
        `run ${run.runId} (${run.status}, ${utc(run.startedAt)}, ${number(run.quarantined)} items)`)),
    );
    select.value = [...select.options].some((o) => o.value === wanted) ? wanted : 'consumer';
  }

  function fillCodes() {
    const select = $('#q-code');
    const wanted = select.value;
    const counts = new Map();
    for (const item of state.items) counts.set(item.errorCode, (counts.get(item.errorCode) || 0) + 1);
    select.replaceChildren(
      h('option', { value: '' }, `all codes (${number(state.items.length)})`),
      ...[...counts.entries()].sort().map(([code, n]) => h('option', { value: code }, `${code} (${n})`)),
    );
    select.value = counts.has(wanted) ? wanted : '';
  }

  const shownItems = () => state.items.filter((item) => !$('#q-code').value || item.errorCode === $('#q-code').value);

  function renderItems() {
    const rows = shownItems().map((item) => h('tr', { dataset: { itemId: item.itemId, code: item.errorCode } },
      h('td', {}, canAct() && h('input', { type: 'checkbox', class: 'pick', value: item.itemId, 'aria-label': `Select item ${item.itemId}`, onchange: updateSelection })),
      h('td', {}, h('code', { class: 'code' }, item.errorCode)),
      h('td', { class: 'reason' }, item.reason || '—'),
      h('td', {}, canAct() && button('Replay', () => replayItems([item.itemId]))),
      h('td', {}, mono(item.itemId)),
      h('td', {}, item.stage),
      h('td', {}, mono(item.externalId)),
      h('td', { class: 'num' }, number(item.attempts)),
      timeCell(item.createdAt),
      timeCell(item.updatedAt),
    ));
    setRows($('#items-table'), rows);
    $('#q-select-all').checked = false;
    const label = $('#q-code').value ? `Replay the ${rows.length} shown` : 'Replay all';
    $('#q-replay-all').replaceWith(confirming('replay-all', label, replayAll, {
      id: 'q-replay-all', disabled: rows.length === 0, 'data-action': true, hidden: !canAct(),
    }));
    updateSelection();
  }

  function picked() {
    return [...document.querySelectorAll('#items-table input.pick:checked')].map((box) => box.value);
  }

  function updateSelection() {
    const chosen = picked();
    const node = $('#q-replay-selected');
    node.disabled = chosen.length === 0;
    node.textContent = chosen.length ? `Replay selected (${chosen.length})` : 'Replay selected';
  }

  async function replayItems(itemIds) {
    const owner = $('#q-owner').value;
    const path = owner === 'consumer' ? '/talent-sync/failed-items/replay' : `/talent-import/runs/${encodeURIComponent(owner)}/failed-items/replay`;
    const result = await api('POST', path, itemIds ? { itemIds } : {});
    showOutcome($('#quarantine-outcome'), result, (data) =>
      `replayed: applied ${number(data.applied)}, skipped ${number(data.skipped)}, failed again ${number(data.failed)}`);
    await loadQuarantine();
  }

  function replayAll() {
    // With a code chosen, "all" is what is shown: those items by id. Otherwise the whole quarantine.
    return replayItems($('#q-code').value ? shownItems().map((item) => item.itemId) : null);
  }

  // ------------------------------------------------------------------ fan-out

  async function loadFanout() {
    const status = $('#f-status').value;
    const query = status ? `?status=${encodeURIComponent(status)}&limit=200` : '?limit=200';
    const current = latest('fanout');
    const result = await api('GET', `/access-fanout/tasks${query}`);
    if (!current()) return undefined;
    if (!result.ok) return showOutcome($('#fanout-outcome'), result);
    renderTasks(result.data);
    return undefined;
  }

  function renderTasks(tasks) {
    const counts = new Map();
    for (const task of tasks) counts.set(task.status, (counts.get(task.status) || 0) + 1);
    $('#f-counts').replaceChildren(...[...counts.entries()].map(([status, n]) => h('span', { class: 'count' }, badge(status), ` ${number(n)}`)));
    const rows = tasks.map((task) => h('tr', { dataset: { taskId: task.taskId, status: task.status } },
      h('td', {}, mono(task.taskId)),
      h('td', {}, badge(task.status)),
      h('td', {}, task.status === 'Failed' && canAct() ? h('div', { class: 'row-actions' }, taskActions(task)) : ''),
      h('td', { class: 'num' }, number(task.processedCount)),
      h('td', { class: 'num' }, number(task.attemptCount)),
      h('td', { class: 'reason' }, task.lastError || '—'),
      h('td', {}, mono(task.roleId)),
      h('td', { class: 'num' }, number(task.roleVersion)),
      h('td', {}, task.reason),
      timeCell(task.createdAt),
      timeCell(task.completedAt),
    ));
    setRows($('#tasks-table'), rows);
  }

  // A Failed task is replayed, or discarded when its users past the cursor need it no more (prune keeps it).
  function taskActions(task) {
    return [
      button('Replay', () => replayTask(task.taskId)),
      confirming(`discard:${task.taskId}`, 'Discard', () => discardTask(task.taskId), { class: 'danger' }),
    ];
  }

  async function discardTask(taskId) {
    const result = await api('POST', `/access-fanout/tasks/${encodeURIComponent(taskId)}/discard`);
    // Whether the users past its cursor heard of their role since, as the answer says (never told: a warning).
    showOutcome($('#fanout-outcome'), result, (data) => ['task ', mono(data.taskId),
      ` discarded: role version ${number(data.roleVersion)}, ${number(data.processedCount)} users notified before it failed; `,
      h(data.usersPastCursor === 'never-told' ? 'strong' : 'span', {}, data.detail)]);
    await loadFanout();
  }

  async function replayTask(taskId) {
    const result = await api('POST', `/access-fanout/tasks/${encodeURIComponent(taskId)}/replay`);
    showOutcome($('#fanout-outcome'), result, (data) => ['task ', mono(data.taskId), ` is ${data.status} again`]);
    await loadFanout();
  }

  // ------------------------------------------------------------------ roles

  async function loadRoles() {
    const id = $('#r-id').value.trim();
    const code = $('#r-code').value.trim();
    const path = id ? `/roles/${encodeURIComponent(id)}` : `/roles?limit=200${code ? `&code=${encodeURIComponent(code)}` : ''}`;
    const current = latest('roles');
    const result = await api('GET', path);
    if (!current()) return undefined;
    if (!result.ok) return showOutcome($('#roles-outcome'), result);
    state.roles = id ? [result.data] : result.data;
    renderRoles();
    return undefined;
  }

  function renderRoles() {
    const rows = state.roles.map((role) => h('tr', { dataset: { roleId: role.roleId, code: role.code } },
      h('td', {}, h('code', { class: 'code' }, role.code)),
      h('td', {}, role.name),
      h('td', {}, role.companyName || (role.companyId ? mono(role.companyId) : 'system role')),
      h('td', {}, badge(role.status)),
      h('td', { class: 'num' }, number(role.version)),
      h('td', { class: 'num' }, number(role.holders)),
      h('td', { class: 'chips' }, role.permissions.length ? role.permissions.map((p) => h('span', { class: 'chip' }, p)) : '—'),
      h('td', {}, canAct() && button('Edit', () => editRole(role))),
    ));
    setRows($('#roles-table'), rows);
  }

  function editRole(role) {
    const form = $('#role-editor');
    form.hidden = false;
    form.dataset.roleId = role.roleId;
    $('#r-editing').replaceChildren('Role ', h('code', { class: 'code' }, role.code), ' ', badge(role.status));
    $('#r-facts').replaceChildren(
      `${role.name} · ${role.companyName || 'system role'} · version ${number(role.version)} · `,
      `${number(role.holders)} holders · id `, mono(role.roleId));
    $('#r-permissions').value = role.permissions.join('\n');
    $('#r-permissions').focus();
  }

  async function savePermissions(event) {
    event.preventDefault();
    const roleId = $('#role-editor').dataset.roleId;
    const permissions = [...new Set($('#r-permissions').value.split(/[\n,]/).map((p) => p.trim()).filter(Boolean))];
    const result = await api('PUT', `/roles/${encodeURIComponent(roleId)}/permissions`, { permissions });
    showOutcome($('#roles-outcome'), result, describeChange);
    if (!result.ok) return;
    const fresh = await api('GET', `/roles/${encodeURIComponent(roleId)}`);
    if (fresh.ok) editRole(fresh.data);
    await loadRoles();
  }

  function describeChange(change) {
    if (change.path === 'inline') {
      return `version ${number(change.roleVersion)}: inline, ${number(change.usersNotifiedInline)} users notified in the same transaction`;
    }
    return [`version ${number(change.roleVersion)}: queued, fan-out task `, mono(change.taskId), ' ',
      button('See it in Fan-out', () => { location.hash = '#fanout'; })];
  }

  // ------------------------------------------------------------------ access (one user: `access show`)

  const VERDICTS = {
    matching: 'the last event on the topic carries the Active assignments',
    pending: 'an access event of the user waits in the outbox: consumers hear it once the relay sends it',
    drifted: 'the last event carries other assignments than the database: see the runbook, access-drift',
    missing: 'Active assignments, and no event for the user on the topic: see the runbook, access-drift',
  };

  async function loadAccess() {
    const userId = $('#a-user').value.trim();
    if (!userId) return undefined;
    const current = latest('access');
    const result = await api('GET', `/access/users/${encodeURIComponent(userId)}`);
    if (!current()) return undefined;
    if (!result.ok) {
      $('#access-detail').hidden = true;
      $('#access-tables').hidden = true;
      return showOutcome($('#access-outcome'), result);
    }
    $('#access-outcome').hidden = true;
    renderAccess(result.data);
    return undefined;
  }

  function renderAccess(report) {
    const event = report.lastEvent;
    const where = report.partition === null ? 'the topic does not exist'
      : `partition ${report.partition}, ${number(report.recordsRead)} record${report.recordsRead === 1 ? '' : 's'} read from its end`;
    const facts = [['User', mono(report.userId)], ['Company', mono(report.companyId)], ['Searched', where]];
    if (event) {
      facts.push(['Last event', `offset ${number(event.offset)} · version ${number(event.version)} · ${event.changeReason || '—'}`],
        ['Occurred (UTC)', utc(event.occurredAt)], ['Event id', mono(event.eventId)]);
    } else {
      facts.push(['Last event', 'none for this user on pin.identity.access.v1']);
    }
    const card = $('#access-detail');
    card.hidden = false;
    card.dataset.verdict = report.verdict;
    card.replaceChildren(
      h('div', { class: 'detail-head' }, h('h3', {}, 'Verdict ', badge(report.verdict))),
      h('p', { class: 'facts' }, VERDICTS[report.verdict] || ''),
      h('dl', { class: 'facts-grid' }, facts.map(([term, value]) => [h('dt', {}, term), h('dd', {}, value)])),
    );
    $('#access-tables').hidden = false;
    setRows($('#access-table'), assignmentRows(report));
    const queued = [...report.outbox.map((e) => ['outbox', e]), ...report.deadLetters.map((e) => ['dead letter', e])];
    $('#queued-table tbody').replaceChildren(...(queued.length ? queued.map(([place, e]) => h('tr', { dataset: { outboxId: e.outboxId } },
      h('td', { class: 'num' }, String(e.outboxId)), h('td', {}, place), h('td', {}, e.changeReason || '—'),
      h('td', { class: 'num' }, number(e.version)), timeCell(e.queuedAt), h('td', { class: 'reason' }, e.error || '—')))
      : [h('tr', {}, h('td', { colspan: 6, class: 'empty' }, 'None: nothing waits in the outbox for this user.'))]));
  }

  function assignmentRows(report) {
    const diff = report.difference;
    const standing = new Map([
      ...diff.onlyInDatabase.map((id) => [id, 'only in the database']),
      ...diff.onlyOnTopic.map((id) => [id, 'only on the topic']),
      ...diff.changed.map((id) => [id, 'differs']),
    ]);
    const onTopic = report.lastEvent && Array.isArray(report.lastEvent.activeAssignments) ? report.lastEvent.activeAssignments : [];
    const seen = new Set();
    return [...report.activeAssignments, ...onTopic].filter((a) => a && !seen.has(a.assignmentId) && seen.add(a.assignmentId))
      .map((a) => h('tr', { dataset: { assignmentId: a.assignmentId, standing: standing.get(a.assignmentId) || 'same in both' } },
        h('td', {}, mono(a.assignmentId)),
        h('td', {}, standing.get(a.assignmentId) || 'same in both'),
        h('td', {}, h('code', { class: 'code' }, a.roleCode)),
        h('td', {}, a.scopeType, ' ', mono(a.scopeOrganizationId || a.scopeProjectGroupId || a.scopeProjectId || '')),
        timeCell(a.expiresAt)));
  }

  // ------------------------------------------------------------------ health

  // As the relay's log line: a writer open this long is named (outbox-publishing-held).
  const HELD_AFTER_S = 10;

  function heldBy(writer) {
    if (writer === null) return 'no transaction holds an outbox id';
    const who = writer.pid === null ? 'a session this role cannot see' : `pid ${writer.pid} (${writer.applicationName || 'no application name'})`;
    return `by ${who}: nothing after its outbox id is published until it ends (runbook: outbox-publishing-held)`;
  }

  function card(label, value, note, key) {
    return h('div', { class: 'stat', dataset: { stat: key } },
      h('div', { class: 'stat-label' }, label), h('div', { class: 'stat-value' }, value), h('div', { class: 'stat-note' }, note));
  }

  async function loadHealth() {
    const current = latest('health');
    const result = await api('GET', '/health/summary');
    if (!current()) return;
    if (!result.ok) {
      notice(`Health: ${result.status} ${(result.problem && result.problem.code) || ''} ${(result.problem && result.problem.detail) || ''}`);
    } else {
      renderHealth(result.data);
    }
    if (currentSection() === 'health' && state.token) poll(loadHealth, POLL_HEALTH_MS);
  }

  function renderHealth(s) {
    const lag = s.consumerLag;
    $('#h-read-at').textContent = `read at ${utc(s.readAt)} UTC, every ${POLL_HEALTH_MS / 1000} s`;
    $('#h-cards').replaceChildren(
      card('Outbox backlog', number(s.outboxBacklog), 'events not yet acknowledged by the broker', 'outbox-backlog'),
      card('Oldest unpublished event', duration(s.outboxOldestAgeSeconds), 'age of the oldest outbox row', 'outbox-oldest-age'),
      card('Publishing held', duration(s.outboxPublishingHeldSeconds), heldBy(s.outboxHeldBy), 'outbox-held'),
      card('Consumer lag', lag.total === null ? 'unknown' : number(lag.total), lag.error || `records behind, group ${lag.group}`, 'consumer-lag'),
      card('Dead letters', number(s.deadLetters), s.newestDeadLetterAt ? `newest ${utc(s.newestDeadLetterAt)} UTC` : 'outbox events the broker rejected for good', 'dead-letters'),
      card('Fan-out backlog', number(s.fanoutBacklog), 'Pending tasks, expired leases and tasks waiting out a back-off', 'fanout-backlog'),
      card('Fan-out failed', number(s.fanoutFailed), 'poison tasks waiting for a replay or a discard', 'fanout-failed'),
      // The caption says what the value says: never "no" over "a run is Running".
      card('Import running', s.importRunning ? 'yes' : 'no',
        s.importRunning ? 'a talent-import run is Running' : 'no talent-import run is Running', 'import-running'),
    );
    for (const stat of document.querySelectorAll('#h-cards .stat')) {
      const alarming = (stat.dataset.stat === 'fanout-failed' && s.fanoutFailed > 0) || (stat.dataset.stat === 'dead-letters' && s.deadLetters > 0)
        || (stat.dataset.stat === 'outbox-held' && s.outboxPublishingHeldSeconds >= HELD_AFTER_S);
      stat.classList.toggle('alarm', alarming);
    }
    $('#h-group').textContent = `(group ${lag.group})`;
    const rows = lag.partitions.map((p) => h('tr', {},
      h('td', {}, p.topic), h('td', { class: 'num' }, number(p.partition)), h('td', { class: 'num' }, number(p.lag)),
      h('td', { class: 'num' }, p.committedOffset === null ? 'nothing committed' : number(p.committedOffset))));
    setRows($('#lag-table'), rows, lag.error ? `The broker did not say: ${lag.error}` : "Talent's topics do not exist on this broker.");
  }

  // ------------------------------------------------------------------ wiring

  Object.assign(LOADERS, {
    imports: loadImports, quarantine: loadQuarantine, fanout: loadFanout, roles: loadRoles, access: loadAccess, health: loadHealth,
  });

  function wire() {
    $('#token-form').addEventListener('submit', useToken);
    $('#forget-token').addEventListener('click', forgetToken);
    $('#start-form').addEventListener('submit', startRun);
    $('#q-owner').addEventListener('change', () => { $('#q-code').value = ''; loadQuarantine(); });
    $('#q-code').addEventListener('change', renderItems);
    $('#q-select-all').addEventListener('change', (event) => {
      for (const box of document.querySelectorAll('#items-table input.pick')) box.checked = event.target.checked;
      updateSelection();
    });
    $('#q-replay-selected').addEventListener('click', () => replayItems(picked()));
    $('#f-status').addEventListener('change', loadFanout);
    $('#role-find').addEventListener('submit', (event) => { event.preventDefault(); loadRoles(); });
    $('#access-find').addEventListener('submit', (event) => { event.preventDefault(); loadAccess(); });
    $('#role-editor').addEventListener('submit', savePermissions);
    $('#r-close').addEventListener('click', () => { $('#role-editor').hidden = true; });
    for (const refresh of document.querySelectorAll('[data-refresh]')) {
      refresh.addEventListener('click', () => show(currentSection()));
    }
    window.addEventListener('hashchange', () => show(currentSection()));
    document.addEventListener('visibilitychange', () => { if (document.hidden) stopTimer(); else show(currentSection()); });
  }

  wire();
  showTokenState();
  signIn();
})();
