// relmon review page. Plain JavaScript, no framework, nothing fetched from elsewhere.
// Model text is only ever inserted as text (textContent), never as HTML, and every text
// from a user or a model is isolated (a <bdi>, or an element with dir="auto"), so that
// bidi controls in it (U+202E...) cannot reorder the page's own words around it.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const store = window.sessionStorage;
  const state = {
    current: null,     // the item shown
    order: [],         // its candidate ranks in display order (random)
    selected: new Set(),
    none: false,
    prefetched: null,  // {item, at}
    prefetching: null, // a promise
    skipped: [],
    last: null,        // {id, until} the last verdict, while it can be undone
    busy: false,
    proxy: false,      // review.auth: proxy: an auth proxy names the reviewer, no token
    leaseMs: 120000,
    undoMs: 10000,
    done: 0,
  };

  function session() {
    let s = store.getItem("relmon-session");
    if (!s) {
      const bytes = new Uint8Array(12);
      crypto.getRandomValues(bytes);
      s = Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
      store.setItem("relmon-session", s);
    }
    return s;
  }
  const token = () => store.getItem("relmon-token") || "";
  const reviewer = () => store.getItem("relmon-reviewer") || "";
  const signedIn = () => Boolean(token()) || state.proxy;
  function say(msg) { $("status").textContent = msg; }
  function bdi(text) {
    const el = document.createElement("bdi");
    el.textContent = text;
    return el;
  }

  function showLogin(on) {
    $("login").hidden = !on || state.proxy;
    $("review").hidden = on;
    $("who").hidden = on;
    $("logout").hidden = state.proxy; // signing out is the proxy's business
    if (on) { if (!state.proxy) { $("login-reviewer").value = reviewer(); $("token").focus(); } }
    else { $("who").replaceChildren("Reviewing as ", bdi(reviewer())); }
  }

  class Unauthorized extends Error {}

  // The token travels in the Authorization header only. With review.auth: proxy there is
  // no token: the auth proxy's session cookie goes along (same origin only) and the proxy
  // names the reviewer.
  function requestInit(method) {
    const headers = {};
    if (token()) headers["Authorization"] = "Bearer " + token();
    return {method, headers, cache: "no-store", credentials: state.proxy ? "same-origin" : "omit"};
  }
  // Paths are relative ("api/..."): they resolve against the page's address, so the page
  // works under whatever prefix a reverse proxy serves relmon at (say /relmon/review).
  async function api(method, path, body) {
    const init = requestInit(method);
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const r = await fetch(path, init);
    if (r.status === 401) {
      if (state.proxy) {
        show(null);
        showLogin(true);
        throw new Unauthorized("Not signed in through the login proxy (" + await errorText(r) + "): reload the page.");
      }
      store.removeItem("relmon-token");
      showLogin(true);
      throw new Unauthorized("The token was not accepted. Check it and sign in again.");
    }
    return r;
  }
  // How relmon authenticates and whom it recognises: {ok, auth, reviewer, error}.
  async function whoami() {
    const init = requestInit("GET");
    init.credentials = "same-origin"; // the mode is not known yet: a proxy's cookie may be needed
    try {
      const r = await fetch("api/whoami", init);
      const body = await r.json();
      return {ok: r.ok, auth: body.auth, reviewer: body.reviewer || "", error: body.error || r.statusText};
    } catch (e) { return {ok: false, auth: "", reviewer: "", error: String(e.message || e)}; }
  }
  async function errorText(r) {
    try { return (await r.json()).error || r.statusText; } catch (e) { return r.statusText; }
  }
  const enc = encodeURIComponent;
  const sessionQuery = () => "?session=" + enc(session());

  function shuffled(n) {
    const a = Array.from({length: n}, (_, i) => i + 1);
    const r = new Uint32Array(Math.max(n, 1));
    crypto.getRandomValues(r);
    for (let i = n - 1; i > 0; i--) {
      const j = r[i] % (i + 1);
      [a[i], a[j]] = [a[j], a[i]];
    }
    return a;
  }

  function render() {
    const d = state.current;
    const box = $("item");
    if (!d) { box.hidden = true; box.removeAttribute("data-item"); return; }
    const single = d.candidates.length === 1;
    $("meta").replaceChildren("Task ", bdi(d.task), " \u00b7 model ", bdi(d.model),
      " \u00b7 API ", bdi(d.api || "openai.chat"), " \u00b7 item ", bdi(d.item_id));
    renderReask(d.reask_changes || {});
    $("query").textContent = d.query;
    $("hint").textContent = single
      ? "Is this answer acceptable? 1 = correct, 0 = incorrect, then Enter."
      : "Press the number of every acceptable answer (several allowed), 0 if none is, then Enter.";
    $("none-label").textContent = single ? "Incorrect" : "None of these";
    const list = $("candidates");
    list.replaceChildren();
    state.order.forEach((rank, i) => {
      const c = d.candidates[rank - 1];
      const li = document.createElement("li");
      li.dataset.rank = String(rank);
      const label = document.createElement("label");
      label.className = "choice" + (state.selected.has(rank) ? " on" : "");
      const boxEl = document.createElement("input");
      boxEl.type = "checkbox";
      boxEl.checked = state.selected.has(rank);
      boxEl.addEventListener("change", () => toggle(i + 1));
      const key = document.createElement("kbd");
      key.textContent = String(i + 1);
      const answer = document.createElement("pre");
      answer.className = "answer";
      answer.dir = "auto";
      answer.textContent = c.answer;
      label.append(boxEl, key);
      if (single) {
        const lead = document.createElement("span");
        lead.textContent = "Correct: ";
        label.append(lead);
      }
      label.append(answer);
      li.append(label);
      list.append(li);
    });
    $("none").checked = state.none;
    $("none").parentElement.className = "choice" + (state.none ? " on" : "");
    $("correct-box").hidden = !state.none;
    box.dataset.item = d.item_id;
    box.hidden = false;
  }

  // How the re-asks differed from the production request: field -> {from, to}; "from"
  // absent: not sent by production; "to" absent: dropped. The server summarises values
  // (numbers and model names as they are, "<text, 12 chars>"...): strings are shown as
  // they are, anything else as JSON.
  const MAX_VALUE_CHARS = 200;
  function reaskValue(change, key, missing) {
    if (!Object.prototype.hasOwnProperty.call(change, key)) return missing;
    const value = change[key];
    const text = typeof value === "string" ? value : JSON.stringify(value);
    const el = bdi(text.length > MAX_VALUE_CHARS ? text.slice(0, MAX_VALUE_CHARS) + "\u2026" : text);
    if (text.length > MAX_VALUE_CHARS) el.title = text;
    return el;
  }
  function renderReask(changes) {
    const list = $("reask");
    list.replaceChildren();
    for (const [field, raw] of Object.entries(changes)) {
      const change = raw && typeof raw === "object" ? raw : {};
      const li = document.createElement("li");
      if (change.unrecorded === true) {  // a span that did not record this field
        li.append("unrecorded: ", bdi(field));
        if (Object.prototype.hasOwnProperty.call(change, "to")) {
          li.append(" (re-asked with ", reaskValue(change, "to", ""), ")");
        }
        li.title = "Not recorded in the trace: production may have sent it, the re-asks did not.";
      } else {
        li.append(bdi(field), ": ", reaskValue(change, "from", "not sent"), " \u2192 ",
                  reaskValue(change, "to", "dropped"));
      }
      list.append(li);
    }
    $("reask-box").hidden = list.children.length === 0;
  }

  function show(item) {
    state.current = item;
    state.order = item ? shuffled(item.candidates.length) : [];
    state.selected = new Set();
    state.none = false;
    $("correct-answer").value = "";
    render();
    if (item) { document.activeElement && document.activeElement.blur && document.activeElement.blur(); }
  }

  function toggle(position) {
    if (!state.current || position > state.order.length) return;
    const rank = state.order[position - 1];
    if (state.selected.has(rank)) state.selected.delete(rank); else state.selected.add(rank);
    state.none = false;
    render();
  }
  function toggleNone() {
    if (!state.current) return;
    state.none = !state.none;
    state.selected = new Set();
    render();
    if (state.none) $("correct-answer").focus();
  }

  function excluded() {
    const ids = state.skipped.slice(-40);
    if (state.current) ids.push(state.current.item_id);
    if (state.prefetched) ids.push(state.prefetched.item.item_id);
    return ids;
  }
  async function fetchNext() {
    let q = sessionQuery();
    for (const id of excluded()) q += "&exclude=" + enc(id);
    const r = await api("GET", "api/reviews/next" + q);
    if (r.status === 204) return null;
    if (!r.ok) throw new Error("Error " + r.status + ": " + await errorText(r));
    return await r.json();
  }
  function prefetch() {
    state.prefetching = (async () => {
      try {
        const item = state.current ? await fetchNext() : null;
        state.prefetched = item ? {item, at: Date.now()} : null;
      } catch (e) { state.prefetched = null; }
    })();
    return state.prefetching;
  }
  let waitTimer = null;
  async function advance() {
    if (state.prefetching) await state.prefetching;
    let next = state.prefetched;
    state.prefetched = null;
    if (next && Date.now() - next.at > state.leaseMs / 2) next = null; // lease may be gone
    show(null);
    try {
      const item = next ? next.item : await fetchNext();
      show(item);
      if (!item) {
        say("No items are waiting for review; checking again every few seconds.");
        clearTimeout(waitTimer);
        waitTimer = setTimeout(() => { if (!state.current) advance(); }, 3000);
        return;
      }
      prefetch();
    } catch (e) { say(e.message); }
  }

  // Renew the leases of the item shown and the one prefetched every lease/3, so that an
  // item stays with this tab however long the reviewer takes over it.
  async function renewLease(id) {
    const r = await api("POST", "api/review-page/lease/" + enc(id) + sessionQuery());
    return r.ok;
  }
  async function renewLeases() {
    const shown = state.current, ahead = state.prefetched;
    if (shown && !(await renewLease(shown.item_id)) && state.current === shown) {
      say("The hold on this item has lapsed: someone else may review it too (the first verdict counts).");
    }
    if (ahead) {
      if (await renewLease(ahead.item.item_id)) ahead.at = Date.now();
      else if (state.prefetched === ahead) state.prefetched = null;
    }
  }
  // A tab left open without a key or click for IDLE_MS stops renewing: its items go
  // back to the queue one lease later, instead of being kept from everyone for good.
  const IDLE_MS = 15 * 60 * 1000;
  let lastActivity = Date.now();
  for (const kind of ["keydown", "pointerdown"]) {
    document.addEventListener(kind, () => { lastActivity = Date.now(); }, {capture: true});
  }
  let renewTimer = null;
  function scheduleRenewal() {
    clearTimeout(renewTimer);
    renewTimer = setTimeout(async () => {
      const active = Date.now() - lastActivity < IDLE_MS;
      try { if (signedIn() && active) await renewLeases(); } catch (e) { if (e instanceof Unauthorized) say(e.message); }
      scheduleRenewal();
    }, state.leaseMs / 3);
  }

  async function submit() {
    const d = state.current;
    if (!d || state.busy) return;
    let verdict;
    if (state.none) {
      verdict = {none_of_these: true};
      const correct = $("correct-answer").value.trim();
      if (correct) verdict.correct_answer = correct;
    } else if (state.selected.size) {
      verdict = {accepted_ranks: Array.from(state.selected).sort((a, b) => a - b)};
    } else {
      say("Choose at least one answer (1\u20139), or 0 for none of these.");
      return;
    }
    verdict.reviewer = reviewer();
    state.busy = true;
    try {
      const r = await api("POST", "api/review-page/verdicts/" + enc(d.item_id) + sessionQuery(), verdict);
      if (r.status === 202) {
        const body = await r.json();
        state.last = {id: d.item_id, until: Date.now() + body.undo_s * 1000};
        state.undoMs = body.undo_s * 1000;
        say("Saved. Press u within " + body.undo_s + " s to undo.");
        $("undo").disabled = false;
        setTimeout(() => { if (state.last && Date.now() >= state.last.until) $("undo").disabled = true; },
                   state.undoMs + 50);
      } else if (r.ok || r.status === 409) {
        say("This item already had a verdict (someone else reviewed it); it keeps the first one.");
        state.last = null;
      } else {
        say("Error " + r.status + ": " + await errorText(r));
        return;
      }
      state.done += 1;
      document.body.dataset.done = String(state.done);
      await advance();
      refreshProgress();
    } catch (e) { say(e.message); } finally { state.busy = false; }
  }

  async function skip() {
    const d = state.current;
    if (!d || state.busy) return;
    state.busy = true;
    try {
      state.skipped.push(d.item_id);
      await api("POST", "api/review-page/release/" + enc(d.item_id) + sessionQuery());
      say("Skipped.");
      await advance();
    } catch (e) { say(e.message); } finally { state.busy = false; }
  }

  async function undo() {
    const last = state.last;
    if (!last || state.busy) return;
    if (Date.now() > last.until) { say("Too late to undo: the verdict has been applied."); return; }
    state.busy = true;
    try {
      const r = await api("DELETE", "api/review-page/verdicts/" + enc(last.id) + sessionQuery());
      if (!r.ok) { say("Could not undo: " + await errorText(r)); state.last = null; return; }
      const body = await r.json();
      state.last = null;
      $("undo").disabled = true;
      state.done -= 1;
      document.body.dataset.done = String(state.done);
      document.body.dataset.undone = last.id;
      if (state.prefetching) await state.prefetching;
      // The item shown goes back to the front of the line, after the undone one.
      if (state.current) state.prefetched = {item: state.current, at: Date.now()};
      show(body.item);
      say("Undone: review this item again.");
      refreshProgress();
    } catch (e) { say(e.message); } finally { state.busy = false; }
  }

  function cell(row, content, header) {
    const el = document.createElement(header ? "th" : "td");
    if (Array.isArray(content)) el.append(...content); else el.textContent = content;
    row.append(el);
  }
  async function refreshProgress() {
    try {
      const r = await api("GET", "api/review-page/progress");
      if (!r.ok) return;
      const p = await r.json();
      if (p.lease_s * 1000 !== state.leaseMs) { state.leaseMs = p.lease_s * 1000; scheduleRenewal(); }
      state.undoMs = p.undo_s * 1000;
      const table = document.createElement("table");
      const head = document.createElement("tr");
      ["Task", "Reviewed today", "Waiting", "Calibration items", "Needed"].forEach((t) => cell(head, t, true));
      table.append(head);
      for (const t of p.tasks) {
        const row = document.createElement("tr");
        row.dataset.task = t.task;
        cell(row, [bdi(t.task), " (", bdi(t.model), ")"]);
        cell(row, String(t.reviewed_today) + (t.held ? " (+" + t.held + " in the undo window)" : ""));
        cell(row, String(t.waiting));
        cell(row, t.calibration_items + " (effective " + t.effective_items.toFixed(1) + ")");
        cell(row, t.minimum_items + (t.threshold_finite ? " \u2014 enough" : " \u2014 more needed"));
        table.append(row);
      }
      $("progress").replaceChildren(table);
    } catch (e) { if (e instanceof Unauthorized) say(e.message); }
  }

  document.addEventListener("keydown", (ev) => {
    if ($("review").hidden || ev.ctrlKey || ev.metaKey || ev.altKey) return;
    const inField = ev.target instanceof HTMLInputElement && ev.target.type === "text";
    if (ev.key === "Enter") {
      if (ev.target instanceof HTMLButtonElement) return; // the button's own action
      ev.preventDefault();
      submit();
      return;
    }
    if (inField) { if (ev.key === "Escape") ev.target.blur(); return; }
    if (/^[1-9]$/.test(ev.key)) { toggle(Number(ev.key)); ev.preventDefault(); }
    else if (ev.key === "0") { toggleNone(); ev.preventDefault(); }
    else if (ev.key === "s") { skip(); }
    else if (ev.key === "u") { undo(); }
    else if (ev.key === "?") { $("help").hidden = !$("help").hidden; }
  });
  $("none").addEventListener("change", toggleNone);
  $("submit").addEventListener("click", submit);
  $("skip").addEventListener("click", skip);
  $("undo").addEventListener("click", undo);
  $("keys").addEventListener("click", () => { $("help").hidden = !$("help").hidden; });
  $("logout").addEventListener("click", () => {
    store.removeItem("relmon-token");
    show(null);
    showLogin(true);
  });
  function begin(name) {
    store.setItem("relmon-reviewer", name);
    showLogin(false);
    refreshProgress().then(advance);
  }
  $("login").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const t = $("token").value.trim();
    const name = $("login-reviewer").value.trim();
    if (!t || !name) return;
    store.setItem("relmon-token", t);
    $("token").value = "";
    say("");
    const me = await whoami();
    if (!me.ok) {
      store.removeItem("relmon-token");
      showLogin(true);
      say("The token was not accepted. Check it and sign in again.");
      return;
    }
    begin(me.reviewer || name); // a per-reviewer token names its reviewer
  });
  setInterval(() => { if (signedIn() && !$("review").hidden) refreshProgress(); }, 15000);
  scheduleRenewal();
  (async () => {
    const me = await whoami();
    if (me.auth === "proxy") {
      state.proxy = true;
      if (me.ok) { begin(me.reviewer); return; }
      showLogin(true);
      say("Not signed in through the login proxy (" + me.error + "): reload the page.");
      return;
    }
    if (me.ok && token() && (me.reviewer || reviewer())) { begin(me.reviewer || reviewer()); return; }
    if (token() && !me.ok) store.removeItem("relmon-token");
    showLogin(true);
  })();
})();
