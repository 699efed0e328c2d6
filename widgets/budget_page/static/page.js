// The page's only script: it builds the controls from engine.budget's knob table
// (api/knobs), sends the settings to api/budget and shows the answer. Never a stale
// answer: on an error the old numbers are removed and the message offers the
// controls it names; each change is a step in the browser's history (Back undoes it).
// Never a lost keystroke: an answer leaves alone the control that has the focus and
// every control edited after its request left. A knob that does nothing with the
// answered settings is greyed out with the reason the budget's compatibility table
// gives (the answer's `idle`); a value the server put back is said (its `notes`).
'use strict';
const form = document.getElementById('knobs');
const controls = document.getElementById('controls');
const answer = document.getElementById('answer');
const message = document.getElementById('message');
const PANELS = ['fit', 'readout', 'bar', 'parallel', 'breakdown', 'lora'];
const GROUPS = {model: "the model's dimensions", batch: 'the batch', policy: 'training policy',
                step: 'the training loop', parallel: 'data parallel', device: 'the device'};
const FOLDED = new Set(['model', 'step']);  // groups shown folded at first
const CONFIG = '(pasted config.json)', HUB = '(Hub model)';
const KEPT_FOR_OWN_MODEL = ['seq_len'];  // a model of your own keeps the page's length
let meta = null, asked = 0, shownQuery = '', pasted = '';
let edits = 0, committed = '';
let plannedQuery = null, planAsked = 0;  // the query the plan shown answers
const editedAt = {};  // a control's name -> the edit count when it was last edited

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== null) node.setAttribute(k, v);
  node.append(...children);
  return node;
}

function describedBy(k) {  // why it is greyed out (while it is), then its help
  return 'why-' + k.field + ' help-' + k.field;
}

function whyLine(k) {  // filled while the knob is greyed out
  return el('p', {class: 'why', id: 'why-' + k.field, hidden: ''});
}

function helpLine(k) {
  const zero = k.zero_means ? ' (0: ' + k.zero_means + ')' : '';
  const units = k.units ? ' Units allowed: 80GB, 24GiB, 312T.' : '';
  // Where each choice has its own line below, the help keeps only its first clause.
  const text = Object.keys(k.choice_help).length ? k.help.split(':')[0] : k.help;
  return el('p', {class: 'help', id: 'help-' + k.field}, text + zero + '.' + units);
}

function buttonRow(k) {
  const choices = k.kind === 'bool' ? ['on', 'off'] : k.choices;
  const box = el('fieldset', {id: k.field, 'aria-describedby': describedBy(k)});
  const row = el('div', {class: 'row'});
  for (const c of choices) {
    const input = el('input', {type: 'radio', name: k.field, value: c});
    row.append(el('label', {class: 'choice', title: k.choice_help[c] || null},
                  input, el('span', {}, c)));
  }
  box.append(el('legend', {}, k.label), row, whyLine(k), helpLine(k));
  if (Object.keys(k.choice_help).length) {
    box.append(el('ul', {class: 'choice-help'}, ...choices.map(
      c => el('li', {'data-choice': c}, c + ': ' + k.choice_help[c]))));
  }
  return box;
}

function control(k) {
  const wrap = el('div', {class: 'knob', 'data-field': k.field});
  if (k.kind === 'bool' || (k.kind === 'choice' && k.choices.length <= 5)) {
    wrap.append(buttonRow(k));
  } else if (k.kind === 'choice') {
    // An empty choice until the first answer: a change made before it sends no device.
    const select = el('select', {id: k.field, name: k.field, 'aria-describedby': describedBy(k)},
                      el('option', {value: '', hidden: ''}, ''),
                      ...k.choices.map(c => el('option', {value: c}, c)));
    wrap.append(el('label', {for: k.field}, k.label), select, whyLine(k), helpLine(k));
  } else {
    const suggested = (k.suggestions || []).length ? 'list-' + k.field : null;
    const input = el('input', {type: 'text', id: k.field, name: k.field,
                               inputmode: k.kind === 'str' || k.units ? 'text' : 'decimal',
                               'aria-describedby': describedBy(k), spellcheck: 'false',
                               list: suggested});
    input.addEventListener('keydown', e => {
      if (e.key === 'Enter') { e.preventDefault(); commit(); }
    });
    wrap.append(el('label', {for: k.field}, k.label), input, whyLine(k), helpLine(k));
    if (suggested) wrap.append(el('datalist', {id: suggested},
                                  ...k.suggestions.map(v => el('option', {value: v}))));
  }
  return wrap;
}

function build() {
  const select = form.elements.preset;
  select.replaceChildren(...meta.presets.map(p => el('option', {value: p}, p)),
                         el('option', {value: CONFIG, hidden: ''}, CONFIG),
                         el('option', {value: HUB, hidden: ''}, HUB));
  const groups = {};
  for (const k of meta.knobs) (groups[k.group] ||= []).push(control(k));
  for (const [group, items] of Object.entries(groups)) {
    const name = GROUPS[group] || group;
    const box = FOLDED.has(group)
      ? el('details', {class: 'group', id: 'group-' + group}, el('summary', {}, name))
      : el('fieldset', {class: 'group', id: 'group-' + group},
           el('legend', {class: 'group-name'}, name));
    box.append(...items);
    controls.append(box);
  }
}

function values() {
  const params = new URLSearchParams();
  const model = form.elements.preset.value;
  if (model === CONFIG) params.set('config', pasted);
  else if (model === HUB) params.set('hf_model', form.elements.hf_model.value.trim());
  else params.set('preset', model);
  for (const k of meta.knobs) {
    const v = form.elements[k.field] && form.elements[k.field].value;
    if (v !== undefined && v !== '') params.set(k.field, v);
  }
  return params;
}

function hardware(params, more = []) {  // the machine's settings, kept when the model changes
  const current = values();
  for (const f of [...meta.hardware, ...more]) if (current.has(f)) params.set(f, current.get(f));
  return params;
}

function setControls(vals, keep = () => false) {
  for (const [field, value] of Object.entries(vals)) {
    const item = form.elements[field];
    if (!item || keep(field)) continue;
    if (item instanceof RadioNodeList || item.type === 'radio') {
      form.querySelectorAll(`input[name="${field}"]`).forEach(r => { r.checked = r.value === value; });
    } else item.value = value;
    const list = document.querySelector(`[data-field="${field}"] .choice-help`);
    if (list) list.querySelectorAll('li').forEach(li => li.classList.toggle('chosen', li.dataset.choice === value));
  }
}

function setModel(params) {
  if (params.has('config')) {
    pasted = params.get('config');
    form.elements.config.value = pasted;
    form.elements.preset.value = CONFIG;
  } else if (params.has('hf_model')) {
    form.elements.hf_model.value = params.get('hf_model');
    form.elements.preset.value = HUB;
  } else if (params.has('preset')) form.elements.preset.value = params.get('preset');
}

function greyOut(idle) {  // knob -> reason, from the budget's compatibility table
  for (const k of meta.knobs) setIdle(k.field, idle[k.field]);
}

function setIdle(field, reason) {  // reason undefined: the knob is enabled
  const wrap = form.querySelector(`[data-field="${field}"]`);
  if (!wrap) return;
  wrap.classList.toggle('idle', reason !== undefined);
  wrap.querySelectorAll('input, select').forEach(i => { i.disabled = reason !== undefined; });
  const why = document.getElementById('why-' + field);
  why.textContent = reason === undefined ? '' : 'Greyed out: ' + reason + '.';
  why.hidden = reason === undefined;
}

function say(notes) {  // the values the server put back, and why
  const box = document.getElementById('notes');
  box.replaceChildren(...notes.map(n => el('p', {}, n)));
  box.hidden = !notes.length;
}

function withdraw() {  // the old numbers go: never shown beside an error
  for (const id of [...PANELS, 'plan']) document.getElementById(id).replaceChildren();
  plannedQuery = null;
  answer.hidden = true;
  document.getElementById('verdict').textContent = '';
}

function reveal(field) {  // open what hides a control, then move to it
  const target = document.getElementById(field) || form.elements[field];
  if (!target) return;
  const fold = target.closest('details');
  if (fold) fold.open = true;
  const focusable = target.matches('fieldset') ? target.querySelector('input:checked, input') : target;
  focusable.scrollIntoView({block: 'center'});
  focusable.focus();
}

function fail(text, query, options) {
  withdraw();
  message.replaceChildren(el('p', {}, text));
  const named = (options.knobs || []).filter(f => document.getElementById(f) || form.elements[f]);
  say([]);
  named.forEach(f => setIdle(f, undefined));  // a message never names a greyed-out control
  if (named.length) {
    const labels = Object.fromEntries(meta.knobs.map(k => [k.field, k.label]));
    message.append(el('p', {}, 'Change: ', ...named.map(f => {
      const b = el('button', {type: 'button', class: 'go', 'data-field': f}, labels[f] || f);
      b.addEventListener('click', () => reveal(f));
      return b;
    })));
  }
  if (options.retry) {
    const again = el('button', {type: 'button', id: 'retry'}, 'Retry');
    again.addEventListener('click', () => show(query, {push: false}));
    message.append(el('p', {}, again));
  }
  message.hidden = false;
  document.getElementById('verdict').textContent = text;
}

function focusedField() {
  const active = document.activeElement;
  return active && form.contains(active) ? active.name || active.id : null;
}

async function show(query, {push = true, again = false} = {}) {
  const mine = ++asked, sentEdits = edits;
  answer.classList.add('waiting');
  answer.setAttribute('aria-busy', 'true');
  if (push && query !== shownQuery) history.pushState(null, '', '?' + query);
  shownQuery = query;
  let reply, data;
  try {
    reply = await fetch('api/budget?' + query, {headers: {Accept: 'application/json'}});
    data = await reply.json();
  } catch (error) {
    if (mine === asked) {
      fail('The calculator did not answer (' + error.message + '); check that it is still ' +
           'running, then retry.', query, {retry: true});
    }
    return;
  } finally {
    if (mine === asked) { answer.classList.remove('waiting'); answer.removeAttribute('aria-busy'); }
  }
  if (mine !== asked) return;  // a later change is on its way
  if (data.busy && !again) {  // many visitors at once: one more try after the pause asked
    const pause = 1000 * (Number(reply.headers.get('Retry-After')) || 1);
    return setTimeout(() => { if (mine === asked) show(query, {push: false, again: true}); }, pause);
  }
  if (!data.ok) return fail(data.error, query, {knobs: data.knobs, retry: reply.status >= 500});
  message.hidden = true;
  message.replaceChildren();
  for (const id of PANELS) document.getElementById(id).innerHTML = data.panels[id];
  answer.hidden = false;
  // The server's normalisations, but never over the visitor's typing: not the control
  // with the focus, nor one edited since this request left.
  const focused = focusedField();
  setControls(data.values, f => f === focused || (editedAt[f] || 0) > sentEdits);
  greyOut(data.idle || {});
  say(data.notes || []);
  document.getElementById('assumptions').href = 'assumptions?' + data.query;
  document.getElementById('verdict').textContent =
    [data.panels.verdict, ...(data.notes || [])].join(' ');
  shownQuery = data.query;
  history.replaceState(null, '', '?' + data.query);
  if (edits === sentEdits) committed = values().toString();
  showPlan();
}

// The plan (api/plan) is asked for only while its panel is open: it tries every
// setting, which an answer need not wait for.
const planPanel = document.getElementById('plan-panel');
const planBox = document.getElementById('plan');
async function showPlan() {
  if (!planPanel.open || plannedQuery === shownQuery) return;
  const mine = ++planAsked, query = shownQuery;
  planBox.replaceChildren(el('p', {}, 'Trying every setting ...'));
  try {
    const data = await (await fetch('api/plan?' + query, {headers: {Accept: 'application/json'}})).json();
    if (mine !== planAsked) return;
    if (data.ok) planBox.innerHTML = data.plan;
    else planBox.replaceChildren(el('p', {class: 'plan-error'}, data.error));
    plannedQuery = query;
  } catch (error) {
    if (mine === planAsked) planBox.replaceChildren(el('p', {class: 'plan-error'}, 'The calculator did not answer (' + error.message + '); close and open the plan to retry.'));
  }
}
planPanel.addEventListener('toggle', showPlan);

function commit() {
  // Enter and then leaving the box both say "commit": one step in the history.
  const query = values().toString();
  if (query === committed) return;
  committed = query;
  show(query);
}

async function start() {
  try {
    meta = await (await fetch('api/knobs')).json();
  } catch (error) {
    message.replaceChildren(el('p', {}, 'The calculator did not answer (' + error.message +
                                       '); reload the page once it runs.'));
    message.hidden = false;
    return;
  }
  build();
  const params = new URLSearchParams(location.search);
  if (!params.has('preset') && !params.has('config')) params.set('preset', meta.default_preset);
  setModel(params);
  setControls(Object.fromEntries(params));
  show(params.toString(), {push: false});
}

form.addEventListener('input', event => {
  const t = event.target;
  editedAt[t.name || t.id] = ++edits;
});
form.addEventListener('change', event => {
  const t = event.target;
  if (t.id === 'config' || t.id === 'hf_model') return;  // used by their buttons
  if (t.id === 'preset') {
    if (t.value === CONFIG || t.value === HUB) return;
    return show(hardware(new URLSearchParams({preset: t.value})).toString());
  }
  if (t.type === 'radio') setControls({[t.name]: t.value});
  commit();
});
form.addEventListener('submit', event => { event.preventDefault(); commit(); });
document.getElementById('use-config').addEventListener('click', () => {
  let text = form.elements.config.value.trim();
  try { text = JSON.stringify(JSON.parse(text)); } catch (e) { /* the server names the fault */ }
  pasted = text;
  form.elements.preset.value = CONFIG;
  show(hardware(new URLSearchParams({config: text}), KEPT_FOR_OWN_MODEL).toString());
});
function useHubModel() {
  form.elements.preset.value = HUB;
  const id = form.elements.hf_model.value.trim();
  show(hardware(new URLSearchParams({hf_model: id}), KEPT_FOR_OWN_MODEL).toString());
}
document.getElementById('use-hub').addEventListener('click', useHubModel);
form.elements.hf_model.addEventListener('keydown', e => {
  if (e.key === 'Enter') { e.preventDefault(); useHubModel(); }
});
// An answer's offer (turn on gradient checkpointing) sets its knob and asks again.
document.getElementById('fit').addEventListener('click', event => {
  const offer = event.target.closest('button[data-knob]');
  if (!offer) return;
  setControls({[offer.dataset.knob]: offer.dataset.value});
  editedAt[offer.dataset.knob] = ++edits;
  commit();
});
window.addEventListener('popstate', () => {
  const params = new URLSearchParams(location.search);
  setModel(params);
  setControls(Object.fromEntries(params));
  show(params.toString(), {push: false});
});
start();
