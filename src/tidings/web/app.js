// Tidings web page: plain JavaScript, no build step.
//
// Everything shown is read from the HTTP API with the user's token in the Authorization
// header. Live updates come from GET /api/v1/events, read with fetch() and a stream reader
// (EventSource cannot send headers, and a token never goes into a URL). The stream is only
// a hint: on every (re)connect ("hello"), on "resync" (the bus overran the stream) and on a
// gap in a channel's seq, the page re-reads the durable API; "tick" events re-read the
// panels and any message a lost publish left out.
//
// User content is only ever put into the page as text nodes, never parsed as markup.
"use strict";

(() => {
  const TOKEN_KEY = "tidings.token";
  const CHANNEL_KEY = "tidings.channel";
  const PAGE = 200; // messages shown when a channel opens, and per catch-up read
  const MENTION_RE = /@([a-z0-9][a-z0-9._-]*)/gi;
  const GROUP_MS = 5 * 60 * 1000;

  const INGEST_KEYS = ["appended", "deduped", "decoded_events", "projected", "quarantined", "deferred",
    "stale_replays", "reactions_applied", "reactions_removed", "reactions_orphaned", "mutations"];
  const DELIVERY_KEYS = ["live_sessions", "delivered", "steered", "owed_recorded", "owed_cleared", "woken",
    "held", "held_now", "settled", "scan_recovered", "acks"];
  // Human labels for the status counters; the raw counter name is the label's tooltip.
  const COUNTER_LABELS = {
    backlog: "frames waiting", deferred_now: "frames backing off now", appended: "frames received",
    deduped: "duplicate frames", decoded_events: "events decoded", projected: "frames applied",
    quarantined: "frames quarantined", deferred: "frames deferred (retry later)",
    stale_replays: "stale replays ignored", reactions_applied: "reactions added",
    reactions_removed: "reactions removed", reactions_orphaned: "reactions to unknown messages",
    mutations: "edits and deletes", live_sessions: "agents connected", delivered: "messages delivered",
    steered: "mentions steered", owed_recorded: "mentions owed", owed_cleared: "owed mentions acked",
    woken: "agents woken", held: "agent posts held mid-turn", held_now: "agent posts held now",
    settled: "held posts sent after the turn", scan_recovered: "messages routed by the recovery scan",
    acks: "acks", head_seq: "events published", overruns: "subscriber overruns",
  };
  // The mention grammar's reserved pings that reach every agent member.
  const EVERY_AGENT = new Set(["everyone", "agents"]);

  const state = {
    token: null,
    me: null,
    isAdmin: false,
    channels: new Map(), // id -> channel (head_seq kept current by events)
    seen: new Map(), // channel id -> highest seq the user has had on screen
    selected: null,
    messages: new Map(), // message id -> message, for the selected channel
    lastSeq: 0, // highest seq loaded for the selected channel
    names: new Map(), // account id -> {handle, kind}
    agentHandles: new Set(), // handles of the open channel's agent members (real mentions)
    membersOf: null, // the channel whose members were last loaded (else the tick retries)
    isMember: false,
    askDrafts: new Map(), // ask id -> {question id: value}: a half-filled answer outlives a re-render
    askSending: new Set(), // ask ids whose answer is on its way (its button stays disabled)
    quarantineSeen: new Map(), // bridge id -> quarantined_total when its list was read
    stream: null,
    epoch: 0, // bumped on sign-out: late answers of the old session are dropped
    streamGen: 0, // bumped per connect: a replaced stream stops quietly
    backoff: 1000,
    tickMs: 2000,
    watchdog: null,
    reconnectTimer: null,
  };

  // -- small DOM helpers ------------------------------------------------------------------
  const $ = (id) => document.getElementById(id);

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    if (attrs) {
      for (const [key, value] of Object.entries(attrs)) {
        if (value === null || value === undefined || value === false) continue;
        if (key === "class") node.className = value;
        else if (key === "dataset") Object.assign(node.dataset, value);
        else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
        else node.setAttribute(key, value === true ? "" : String(value));
      }
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
  }

  function fmtTime(ms) {
    const d = new Date(ms);
    const now = new Date();
    const hm = d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
    return d.toDateString() === now.toDateString() ? hm : `${d.toLocaleDateString()} ${hm}`;
  }

  function fmtAgo(ms) {
    const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
    if (s < 60) return `${s}s ago`;
    if (s < 3600) return `${Math.round(s / 60)}m ago`;
    if (s < 86400) return `${Math.round(s / 3600)}h ago`;
    return new Date(ms).toLocaleDateString();
  }

  function hue(text) {
    let h = 0;
    for (const ch of text) h = (h * 31 + ch.codePointAt(0)) % 360;
    return h;
  }

  function newRequestId() {
    if (window.crypto && crypto.randomUUID) return `web-${crypto.randomUUID()}`;
    return `web-${Date.now().toString(36)}-${Math.random().toString(36).slice(2)}`;
  }

  // -- the API ----------------------------------------------------------------------------
  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  async function api(path, { method = "GET", body } = {}) {
    const headers = { Authorization: `Bearer ${state.token}`, Accept: "application/json" };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    let res;
    try {
      res = await fetch(path, {
        method, headers, cache: "no-store",
        body: body === undefined ? undefined : JSON.stringify(body),
      });
    } catch (err) {
      throw new ApiError(0, "network", "the hub cannot be reached");
    }
    let data = null;
    try {
      data = await res.json();
    } catch (err) {
      data = null;
    }
    if (!res.ok) {
      const e = (data && data.error) || {};
      if (res.status === 401) signOut(e.message || "The token was refused.");
      throw new ApiError(res.status, e.code || "error", e.message || `HTTP ${res.status}`);
    }
    return data;
  }

  // -- login and session ----------------------------------------------------------------------
  function tokenFromFragment() {
    const hash = location.hash.replace(/^#/, "");
    if (!hash) return null;
    const params = new URLSearchParams(hash);
    if (!params.has("token")) return null;
    const token = (params.get("token") || "").trim();
    params.delete("token");
    const rest = params.toString();
    // Drop the token from the address bar and from history at once.
    history.replaceState(null, "", location.pathname + location.search + (rest ? `#${rest}` : ""));
    return token || null;
  }

  function showLogin(message) {
    $("app").hidden = true;
    $("login").hidden = false;
    $("login-error").textContent = message || "";
    $("login-button").disabled = false;
    $("token-input").focus();
  }

  function signOut(message) {
    state.epoch += 1;
    state.streamGen += 1;
    if (state.stream) state.stream.abort();
    state.stream = null;
    clearTimeout(state.watchdog);
    clearTimeout(state.reconnectTimer);
    localStorage.removeItem(TOKEN_KEY);
    state.token = null;
    state.me = null;
    state.askDrafts.clear();
    state.askSending.clear();
    state.channels.clear();
    state.seen.clear();
    state.messages.clear();
    state.names.clear();
    state.quarantineSeen.clear();
    state.selected = null;
    state.lastSeq = 0;
    clear($("messages"));
    showLogin(message);
  }

  async function open(token) {
    state.token = token;
    $("login-button").disabled = true;
    let me;
    try {
      me = await api("/api/v1/me");
    } catch (err) {
      if (err.status !== 401) showLogin(`Could not open the hub: ${err.message}`);
      return;
    }
    if (me.scope === "bridge") {
      signOut("A bridge token can only append frames. Use an account or admin token.");
      return;
    }
    localStorage.setItem(TOKEN_KEY, token);
    state.me = me;
    state.isAdmin = me.scope === "admin";
    const account = me.account || {};
    $("whoami").textContent = state.isAdmin ? "admin" : `@${account.handle} · ${account.kind}`;
    document.body.classList.toggle("is-admin", state.isAdmin);
    $("status-panel").hidden = !state.isAdmin;
    $("agents-title").textContent = state.isAdmin ? "Agents" : "Your agents";
    $("bridges-title").textContent = state.isAdmin ? "Bridges" : "Your bridges";
    $("login").hidden = true;
    $("app").hidden = false;
    $("token-input").value = "";
    connect();
    refresh("full");
  }

  // -- refreshing from the durable API --------------------------------------------------------
  let running = null;
  let wanted = null; // "full" | "tick" | null

  function refresh(kind) {
    if (wanted !== "full") wanted = kind;
    if (!running) {
      running = (async () => {
        while (wanted) {
          const now = wanted;
          wanted = null;
          try {
            await (now === "full" ? fullRefresh() : tickRefresh());
          } catch (err) {
            if (err.status !== 401) console.warn("refresh failed:", err.message);
          }
        }
      })().finally(() => {
        running = null;
      });
    }
    return running;
  }

  async function fullRefresh() {
    await loadChannels();
    await Promise.all([loadNames(), openChannel(state.selected, true)]);
    renderChannels();
    await refreshPanels();
  }

  async function tickRefresh() {
    const changed = await loadChannels();
    const ch = state.channels.get(state.selected);
    if (changed) await openChannel(state.selected, true);
    else if (ch && ch.head_seq > state.lastSeq) await catchUp(state.selected);
    if (!changed && state.selected && state.membersOf !== state.selected) await loadMembers(state.selected);
    renderChannels();
    await refreshPanels();
  }

  // -- channels -------------------------------------------------------------------------------------
  // Re-read the channel list; keep (or pick) the selected channel. True when it changed.
  async function loadChannels() {
    const gen = state.epoch;
    const data = await api("/api/v1/channels");
    if (gen !== state.epoch) return false;
    const fresh = new Map();
    for (const ch of data.channels) {
      const known = state.channels.get(ch.id);
      if (known && known.head_seq > ch.head_seq) ch.head_seq = known.head_seq;
      if (!state.seen.has(ch.id)) state.seen.set(ch.id, ch.head_seq);
      fresh.set(ch.id, ch);
    }
    state.channels = fresh;
    renderChannels();
    if (state.selected && fresh.has(state.selected)) {
      renderHeader();
      return false;
    }
    const remembered = localStorage.getItem(CHANNEL_KEY);
    const list = [...fresh.values()];
    const pick = fresh.get(remembered) || list.find((c) => c.name === "general" && c.kind !== "home")
      || list.find((c) => c.kind !== "home") || list[0];
    state.selected = pick ? pick.id : null;
    state.lastSeq = 0;
    state.messages.clear();
    clear($("messages"));
    renderHeader();
    $("composer").hidden = true;
    return true;
  }

  function renderChannels() {
    const regular = $("channel-list");
    const homes = $("home-list");
    clear(regular);
    clear(homes);
    let homeCount = 0;
    for (const ch of state.channels.values()) {
      const isHome = ch.kind === "home";
      const unread = ch.id === state.selected ? 0 : Math.max(0, ch.head_seq - (state.seen.get(ch.id) || 0));
      const item = el("li", null,
        el("button", {
          type: "button",
          class: `channel${ch.id === state.selected ? " active" : ""}${unread ? " unread" : ""}`,
          dataset: { channelId: ch.id, channelName: ch.name },
          onclick: () => selectChannel(ch.id),
        },
        el("span", { class: "channel-sigil", "aria-hidden": "true" }, isHome ? "⌂" : "#"),
        el("span", { class: "channel-name" }, ch.name),
        unread ? el("span", { class: "badge", title: `${unread} new` }, unread > 99 ? "99+" : unread) : null));
      (isHome ? homes : regular).append(item);
      if (isHome) homeCount += 1;
    }
    $("homes-title").hidden = homeCount === 0;
    $("no-channels").hidden = state.channels.size !== 0;
  }

  function renderHeader() {
    const ch = state.channels.get(state.selected);
    $("channel-title").textContent = ch ? `${ch.kind === "home" ? "⌂" : "#"} ${ch.name}` : "No channel";
    const meta = [];
    if (ch) {
      meta.push(`${ch.head_seq} message${ch.head_seq === 1 ? "" : "s"}`);
      if (ch.kind === "home") meta.push("an agent's home channel");
      if (ch.mandatory_subscription) meta.push("mandatory");
    }
    $("channel-meta").textContent = meta.join(" · ");
  }

  async function selectChannel(id) {
    if (id === state.selected) return;
    const leaving = state.channels.get(state.selected);
    if (leaving) state.seen.set(leaving.id, leaving.head_seq);
    localStorage.setItem(CHANNEL_KEY, id);
    state.selected = id;
    renderChannels();
    await openChannel(id, true);
    renderChannels();
  }

  async function openChannel(id, reset) {
    if (!id) return;
    const ch = state.channels.get(id);
    if (!ch) return;
    if (reset) {
      state.selected = id;
      state.messages.clear();
      state.lastSeq = Math.max(0, ch.head_seq - PAGE);
      clear($("messages"));
      state.agentHandles = new Set();
      state.membersOf = null;
      regroup();
      renderHeader();
      $("composer-note").textContent = "";
    }
    await Promise.all([catchUp(id), loadMembers(id), loadPins(id)]);
    scrollToBottom(true);
  }

  async function loadMembers(id) {
    const gen = state.epoch;
    try {
      const data = await api(`/api/v1/channels/${encodeURIComponent(id)}/members`);
      if (gen !== state.epoch || id !== state.selected) return;
      const myId = state.me && state.me.account ? state.me.account.id : null;
      state.isMember = data.members.some((m) => m.account_id === myId);
      for (const m of data.members) state.names.set(m.account_id, { handle: m.handle, kind: m.kind });
      state.agentHandles = new Set(data.members.filter((m) => m.kind === "agent").map((m) => m.handle));
      state.membersOf = id;
      renderNames();
      renderMentions();
    } catch (err) {
      if (err.status === 401) return;
      // A lost answer (network, 5xx) is retried by the next tick; only a refusal means
      // "not a member" for sure.
      if (!(err.status >= 400 && err.status < 500)) console.warn("members not loaded:", err.message);
      state.isMember = false;
    }
    syncAskButtons();
    const composer = $("composer");
    composer.hidden = !state.isMember;
    if (!state.isMember && id === state.selected) {
      $("composer-note").textContent = "Read only: you are not a member of this channel.";
    } else if (state.isMember) {
      loadDestinations(id).catch((err) => console.warn("destinations not read:", err.message));
    }
  }

  // A linked channel's composer says where a post will also go (issue 13).
  async function loadDestinations(id) {
    const data = await api(`/api/v1/channels/${encodeURIComponent(id)}/destinations`);
    if (id !== state.selected || !data.destinations.length) return;
    const where = data.destinations.map((d) => `${d.platform}: ${d.title || d.conversation_id} (${d.bridge_name})`);
    $("composer-note").textContent = `Posts here are also sent to ${where.join(", ")}.`;
  }

  function outboundNode(m) {
    if (!m.outbound || !m.outbound.length) return null;
    return el("div", { class: "outbound" }, ...m.outbound.map((o) => el("span",
      { class: `outbound-state ${o.state}`, title: o.cause || o.remote_id || "" },
      o.state === "failed" ? `${o.kind} failed: ${o.cause}` : o.state === "sent" ? `${o.kind}: sent` : `${o.kind}: pending`)));
  }

  async function loadNames() {
    if (!state.isAdmin) return;
    const data = await api("/api/v1/accounts");
    for (const a of data.accounts) state.names.set(a.id, { handle: a.handle, kind: a.kind });
    renderNames();
  }

  // -- messages ---------------------------------------------------------------------------------
  async function catchUp(id) {
    const gen = state.epoch;
    for (;;) {
      if (id !== state.selected) return;
      const after = state.lastSeq;
      const data = await api(`/api/v1/channels/${encodeURIComponent(id)}/messages?after_seq=${after}&limit=${PAGE}`);
      if (gen !== state.epoch || id !== state.selected) return;
      const stick = nearBottom();
      for (const m of data.messages) upsertMessage(m);
      regroup();
      scrollToBottom(stick);
      const ch = state.channels.get(id);
      if (ch) {
        if (state.lastSeq > ch.head_seq) ch.head_seq = state.lastSeq;
        state.seen.set(id, Math.max(state.seen.get(id) || 0, state.lastSeq));
      }
      if (data.messages.length < PAGE) return;
    }
  }

  function onMessageEvent(ev) {
    const m = ev.message;
    const ch = state.channels.get(ev.channel_id);
    if (!ch) {
      refresh("tick"); // a channel this page has not listed yet
      return;
    }
    if (m.seq > ch.head_seq) ch.head_seq = m.seq;
    if (ev.channel_id !== state.selected) {
      renderChannels();
      return;
    }
    state.seen.set(ch.id, Math.max(state.seen.get(ch.id) || 0, m.seq));
    if (ev.event === "posted" && m.seq > state.lastSeq + 1) {
      catchUp(ev.channel_id).catch((err) => console.warn("catch-up failed:", err.message));
    } else if (ev.event === "posted" || state.messages.has(m.id)) {
      const stick = nearBottom();
      upsertMessage(m);
      regroup();
      scrollToBottom(stick);
    }
    renderHeader();
  }

  function nameOf(accountId) {
    const known = state.names.get(accountId);
    return known ? known.handle : null;
  }

  function authorLabel(accountId) {
    const handle = nameOf(accountId);
    return handle ? handle : `${accountId.slice(0, 12)}…`;
  }

  function renderNames() {
    for (const node of document.querySelectorAll("[data-author]")) {
      const id = node.dataset.author;
      const known = state.names.get(id);
      if (!known) continue;
      if (node.classList.contains("author")) node.textContent = known.handle;
      else if (node.classList.contains("avatar")) {
        node.textContent = known.handle.slice(0, 1).toUpperCase();
        node.style.backgroundColor = `hsl(${hue(known.handle)} 55% 46%)`;
      } else if (node.classList.contains("kind")) {
        node.textContent = kindLabel(known.kind);
        node.hidden = !kindLabel(known.kind);
      }
    }
  }

  function kindLabel(kind) {
    if (kind === "agent") return "agent";
    if (kind === "system") return "bridge";
    return "";
  }

  // A real mention is one the hub routes (delivery/mentions.py): an agent member's handle,
  // or @everyone / @agents in a channel with agents. Anything else (@nobody, a person) is text.
  function isRealMention(handle) {
    const h = handle.toLowerCase();
    return state.agentHandles.has(h) || (EVERY_AGENT.has(h) && state.agentHandles.size > 0);
  }

  function markMention(node) {
    const real = isRealMention(node.dataset.handle);
    node.classList.toggle("mention", real);
    node.title = real ? "mentions an agent of this channel" : "";
  }

  function renderMentions() {
    for (const node of document.querySelectorAll("#messages .handle-ref")) markMention(node);
  }

  function textWithMentions(text) {
    const frag = document.createDocumentFragment();
    let last = 0;
    for (const match of text.matchAll(MENTION_RE)) {
      if (match.index > last) frag.append(document.createTextNode(text.slice(last, match.index)));
      const node = el("span", { class: "handle-ref", dataset: { handle: match[1] } }, match[0]);
      markMention(node);
      frag.append(node);
      last = match.index + match[0].length;
    }
    if (last < text.length) frag.append(document.createTextNode(text.slice(last)));
    return frag;
  }

  function messageNode(m) {
    const handle = nameOf(m.author_account_id);
    const known = state.names.get(m.author_account_id);
    const label = known ? kindLabel(known.kind) : "";
    const avatar = el("div", { class: "avatar", dataset: { author: m.author_account_id }, "aria-hidden": "true" },
      (handle || "?").slice(0, 1).toUpperCase());
    avatar.style.backgroundColor = `hsl(${hue(handle || m.author_account_id)} 55% 46%)`;
    const body = m.deleted
      ? el("div", { class: "text deleted" }, "message deleted")
      : messageBody(m); // pins and asks: see "pins and ask blocks" below
    const extras = window.tidingsExtras; // search.js: network time, attachments
    const shownAt = extras ? extras.shownTime(m) : m.at_unix_ms;
    return el("li", { class: "msg", dataset: { id: m.id, seq: m.seq, author: m.author_account_id, at: m.at_unix_ms } },
      avatar,
      el("div", { class: "msg-main" },
        el("div", { class: "meta" },
          el("span", { class: "author", dataset: { author: m.author_account_id } }, authorLabel(m.author_account_id)),
          el("span", { class: "kind", dataset: { author: m.author_account_id }, hidden: !label }, label),
          el("time", { class: "at", datetime: new Date(shownAt).toISOString(),
            title: extras ? extras.timeTitle(m) : new Date(shownAt).toLocaleString(),
            dataset: m.occurred_at_ms ? { network: m.occurred_at_ms } : null }, fmtTime(shownAt)),
          m.edited_at_ms ? el("span", { class: "edited", title: new Date(m.edited_at_ms).toLocaleString() }, "(edited)") : null,
          pinButton(m)),
        body,
        extras && !m.deleted ? extras.attachmentsNode(m) : null,
        outboundNode(m)));
  }

  function upsertMessage(m) {
    if (m.channel_id !== state.selected) return;
    const list = $("messages");
    const node = messageNode(m);
    const old = list.querySelector(`li[data-id="${CSS.escape(m.id)}"]`);
    state.messages.set(m.id, m);
    if (old) {
      old.replaceWith(node);
    } else if (m.seq > state.lastSeq || !list.lastElementChild) {
      list.append(node);
    } else {
      let before = null;
      for (const li of list.children) {
        if (Number(li.dataset.seq) > m.seq) {
          before = li;
          break;
        }
      }
      list.insertBefore(node, before);
    }
    if (m.seq > state.lastSeq) state.lastSeq = m.seq;
    if (!nameOf(m.author_account_id)) scheduleNames();
  }

  let namesTimer = null;
  function scheduleNames() {
    if (namesTimer) return;
    namesTimer = setTimeout(() => {
      namesTimer = null;
      const id = state.selected;
      if (!id) return;
      loadMembers(id);
      if (state.isAdmin) loadNames().catch(() => {});
    }, 300);
  }

  function regroup() {
    let prev = null;
    for (const li of $("messages").children) {
      const cont = prev && prev.dataset.author === li.dataset.author
        && Number(li.dataset.at) - Number(prev.dataset.at) < GROUP_MS;
      li.classList.toggle("cont", Boolean(cont));
      prev = li;
    }
    const empty = $("messages").children.length === 0;
    $("messages").classList.toggle("is-empty", empty);
  }

  function nearBottom() {
    const list = $("messages");
    return list.scrollHeight - list.scrollTop - list.clientHeight < 80;
  }

  function scrollToBottom(really) {
    if (!really) return;
    const list = $("messages");
    list.scrollTop = list.scrollHeight;
  }

  async function send(event) {
    event.preventDefault();
    const input = $("composer-input");
    const text = input.value.trim();
    const id = state.selected;
    if (!text || !id) return;
    $("composer-send").disabled = true;
    $("composer-note").textContent = "";
    try {
      const data = await api(`/api/v1/channels/${encodeURIComponent(id)}/messages`, {
        method: "POST", body: { text, client_request_id: newRequestId() },
      });
      input.value = "";
      autosize();
      const ch = state.channels.get(id);
      if (ch && data.message.seq > ch.head_seq) ch.head_seq = data.message.seq;
      if (data.message.seq > state.lastSeq + 1) await catchUp(id);
      else {
        upsertMessage(data.message);
        regroup();
      }
      scrollToBottom(true);
      renderHeader();
    } catch (err) {
      $("composer-note").textContent = `Not sent: ${err.message}`;
    } finally {
      $("composer-send").disabled = false;
      input.focus();
    }
  }

  function autosize() {
    const input = $("composer-input");
    input.style.height = "auto";
    input.style.height = `${Math.min(input.scrollHeight, 160)}px`;
  }

  // -- panels ---------------------------------------------------------------------------------------
  async function refreshPanels() {
    const jobs = [refreshAgents(), refreshBridges()];
    if (state.isAdmin) jobs.push(refreshStatus());
    const results = await Promise.allSettled(jobs);
    for (const r of results) {
      if (r.status === "rejected" && r.reason && r.reason.status !== 401) console.warn("panel:", r.reason.message);
    }
  }

  async function refreshAgents() {
    const gen = state.epoch;
    const data = await api("/api/v1/agents");
    if (gen !== state.epoch) return;
    const body = $("agents-body");
    clear(body);
    for (const a of data.agents) {
      state.names.set(a.id, { handle: a.handle, kind: "agent" });
      body.append(el("tr", { class: "agent-row", dataset: { agent: a.handle } },
        el("td", null,
          el("div", { class: "agent-handle" }, `@${a.handle}`),
          a.display_name && a.display_name !== a.handle ? el("div", { class: "sub" }, a.display_name) : null),
        el("td", { class: "sub" }, a.owner_handle ? `@${a.owner_handle}` : "—"),
        el("td", null,
          el("span", { class: `state ${a.live ? "live" : "offline"}`, dataset: { state: a.live ? "live" : "offline" } },
            el("span", { class: "dot", "aria-hidden": "true" }), a.live ? (a.node ? `live on ${a.node}` : "live") : "offline")),
        el("td", { class: `num owed${a.owed ? " has-owed" : ""}`, dataset: { owed: a.owed },
          title: "mentions owed to this agent (not yet acked)" }, a.owed)));
    }
    $("agents-empty").hidden = data.agents.length !== 0;
    $("agents-panel").hidden = !state.isAdmin && data.agents.length === 0;
  }

  async function refreshBridges() {
    const gen = state.epoch;
    const data = await api("/api/v1/bridges");
    if (gen !== state.epoch) return;
    const holder = $("bridges");
    const lists = await Promise.all(data.bridges.map(async (b) => {
      state.names.set(b.account_id, { handle: b.handle, kind: "system" });
      const total = b.quarantined_total || 0;
      if (total === 0) return [];
      const cached = state.quarantineSeen.get(b.id);
      if (cached && cached.total === total) return cached.frames;
      const q = await api(`/api/v1/bridges/${encodeURIComponent(b.id)}/quarantine?limit=20`);
      state.quarantineSeen.set(b.id, { total, frames: q.frames });
      return q.frames;
    }));
    if (gen !== state.epoch) return;
    clear(holder);
    data.bridges.forEach((b, i) => holder.append(bridgeCard(b, lists[i])));
    $("bridges-empty").hidden = data.bridges.length !== 0;
    $("bridges-panel").hidden = !state.isAdmin && data.bridges.length === 0;
  }

  function stat(label, value, title, extra) {
    return el("div", { class: `stat${value ? ` ${extra || ""}` : ""}`, title, dataset: { stat: label } },
      el("span", { class: "stat-value" }, value), el("span", { class: "stat-label" }, label));
  }

  function bridgeCard(b, frames) {
    const counters = b.counters || {};
    const deferred = b.deferred_now !== undefined ? b.deferred_now : (counters.deferred || 0);
    const total = b.quarantined_total || 0;
    return el("div", { class: "bridge", dataset: { bridge: b.id } },
      el("div", { class: "bridge-head" },
        el("span", { class: `platform platform-${b.platform}` }, b.platform),
        el("span", { class: "bridge-name" }, b.name),
        el("span", { class: "sub bridge-handle" }, `@${b.handle}`)),
      el("div", { class: "stats" },
        stat("backlog", b.backlog || 0, "frames committed but not processed yet", "warn"),
        stat("deferred", deferred, "frames deferred after a transient database error", "warn"),
        stat("quarantined", total, "frames set aside with a cause", "bad")),
      frames.length
        ? el("details", { class: "quarantine", open: true },
          el("summary", null, `Quarantine (${total})`),
          el("ul", { class: "quarantine-list" }, frames.map((f) => el("li", { class: "quarantined-frame", dataset: { inbox: f.inbox_id } },
            el("div", { class: "q-head" },
              el("code", { class: "codec" }, f.codec),
              el("span", { class: "sub", title: new Date(f.received_at_ms).toLocaleString() }, fmtAgo(f.received_at_ms))),
            el("div", { class: "cause", title: f.cause || "" }, f.cause || "(no cause recorded)")))),
          total > frames.length ? el("p", { class: "sub" }, `and ${total - frames.length} more`) : null)
        : null);
  }

  async function refreshStatus() {
    const gen = state.epoch;
    const data = await api("/api/status");
    if (gen !== state.epoch) return;
    const ingest = data.ingest || {};
    const totals = {};
    for (const counters of Object.values(ingest.per_bridge || {})) {
      for (const [k, v] of Object.entries(counters)) totals[k] = (totals[k] || 0) + v;
    }
    const delivery = data.delivery || {};
    const bus = data.bus || {};
    const section = (title, items) => el("div", { class: "status-section" },
      el("h3", null, title),
      el("dl", { class: "kv" }, items.map(([k, v]) => el("div", { class: `kv-item${v ? " nonzero" : ""}`, dataset: { stat: k } },
        el("dt", { title: k }, COUNTER_LABELS[k] || k.replace(/_/g, " ")),
        el("dd", { class: "stat-value" }, v === undefined ? 0 : v)))));
    const holder = $("status");
    clear(holder);
    holder.append(
      section("Ingest", [["backlog", ingest.backlog], ["deferred_now", ingest.deferred_now],
        ...INGEST_KEYS.map((k) => [k, totals[k]])]),
      section("Delivery", DELIVERY_KEYS.map((k) => [k, delivery[k]])),
      section("Bus", [["head_seq", bus.head_seq], ["overruns", bus.overruns]]));
  }

  // -- the event stream ------------------------------------------------------------------------
  function setConn(kind, text) {
    const conn = $("conn");
    conn.className = `conn conn-${kind}`;
    conn.textContent = text;
  }

  function armWatchdog(ctrl) {
    clearTimeout(state.watchdog);
    // No event (not even a tick) for three ticks: the connection is dead; start over.
    state.watchdog = setTimeout(() => ctrl.abort(), Math.max(10000, 3 * state.tickMs));
  }

  async function connect() {
    clearTimeout(state.reconnectTimer);
    if (state.stream) state.stream.abort();
    const gen = ++state.streamGen;
    const ctrl = new AbortController();
    state.stream = ctrl;
    setConn("connecting", "connecting…");
    armWatchdog(ctrl);
    try {
      const res = await fetch("/api/v1/events", {
        headers: { Authorization: `Bearer ${state.token}`, Accept: "text/event-stream" },
        signal: ctrl.signal,
        cache: "no-store",
      });
      if (res.status === 401) {
        signOut("The token was refused.");
        return;
      }
      if (!res.ok || !res.body) throw new Error(`HTTP ${res.status}`);
      const reader = res.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          dispatch(block, ctrl, gen);
        }
      }
    } catch (err) {
      if (gen !== state.streamGen) return; // replaced or signed out
    }
    if (gen !== state.streamGen) return;
    clearTimeout(state.watchdog);
    const delay = Math.round(state.backoff * (0.75 + Math.random() * 0.5));
    state.backoff = Math.min(state.backoff * 2, 15000);
    setConn("offline", `offline · retrying in ${Math.ceil(delay / 1000)}s`);
    state.reconnectTimer = setTimeout(connect, delay);
  }

  function dispatch(block, ctrl, gen) {
    if (gen !== state.streamGen) return;
    let type = "message";
    const data = [];
    for (const line of block.split("\n")) {
      if (!line || line.startsWith(":")) continue;
      const i = line.indexOf(":");
      const field = i < 0 ? line : line.slice(0, i);
      let value = i < 0 ? "" : line.slice(i + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "event") type = value;
      else if (field === "data") data.push(value);
    }
    armWatchdog(ctrl);
    if (!data.length) return;
    let payload;
    try {
      payload = JSON.parse(data.join("\n"));
    } catch (err) {
      console.warn("bad event", err);
      return;
    }
    switch (type) {
      case "hello":
        state.backoff = 1000;
        state.tickMs = payload.tick_ms || 2000;
        setConn("live", "live");
        refresh("full"); // the subscription is in place: re-read what we may have missed
        break;
      case "message":
        onMessageEvent(payload);
        break;
      case "pins":
        onPinsEvent(payload);
        break;
      case "resync":
        setConn("live", "live · resynced");
        refresh("full");
        break;
      case "tick":
        setConn("live", "live");
        refresh("tick");
        break;
      default:
        break;
    }
  }

  // -- pins and ask blocks (issue 16) -------------------------------------------------------------
  // The selected channel's pins sit above its messages; its owner and the admin get a Pin /
  // Unpin button on each message. An ask block is a small form (a choice per question with
  // options, else a text field); once answered it shows who answered and what.
  state.pins = []; // message ids pinned in the selected channel, in position order

  function mayChangePins() {
    const ch = state.channels.get(state.selected);
    const myId = state.me && state.me.account ? state.me.account.id : null;
    return Boolean(ch) && (state.isAdmin || (myId !== null && ch.owner_account_id === myId));
  }

  async function loadPins(id) {
    const gen = state.epoch;
    let data;
    try {
      data = await api(`/api/v1/channels/${encodeURIComponent(id)}/pins`);
    } catch (err) {
      return;
    }
    if (gen !== state.epoch || id !== state.selected) return;
    renderPins(data.pins);
  }

  function renderPins(pins) {
    state.pins = pins.map((p) => p.message_id);
    const bar = $("pins");
    clear(bar);
    bar.hidden = pins.length === 0;
    for (const p of pins) {
      const text = p.message.deleted ? "message deleted" : p.message.text;
      bar.append(el("div", { class: "pin", dataset: { messageId: p.message_id } },
        el("span", { class: "pin-mark" }, "pinned"),
        el("span", { class: "pin-text" }, text.length > 140 ? `${text.slice(0, 140)}…` : text)));
    }
    for (const m of state.messages.values()) upsertMessage(m); // refresh the Pin / Unpin buttons
  }

  function onPinsEvent(ev) {
    if (ev.channel_id === state.selected) loadPins(ev.channel_id);
  }

  function pinButton(m) {
    if (m.deleted || !mayChangePins()) return null;
    const pinned = (state.pins || []).includes(m.id);
    return el("button", {
      type: "button", class: "link-button pin-button", dataset: { pin: m.id },
      onclick: async () => {
        try {
          const data = await api(`/api/v1/channels/${encodeURIComponent(m.channel_id)}/pins/${encodeURIComponent(m.id)}`,
            { method: pinned ? "DELETE" : "POST" });
          if (m.channel_id === state.selected) renderPins(data.pins);
        } catch (err) {
          $("composer-note").textContent = `Not ${pinned ? "unpinned" : "pinned"}: ${err.message}`;
        }
      },
    }, pinned ? "Unpin" : "Pin");
  }

  function messageBody(m) {
    const blocks = Array.isArray(m.blocks) ? m.blocks : [];
    if (!blocks.some((b) => b.kind === "ask")) return el("div", { class: "text" }, textWithMentions(m.text || ""));
    const body = el("div", { class: "text" });
    for (const b of blocks) {
      if (b.kind === "ask") body.append(askNode(m, b.ask));
      else body.append(el("div", null, textWithMentions(b.text || "")));
    }
    return body;
  }

  // An ask's form is rebuilt whenever its message is (a pin, a catch-up, an edit): what the
  // person has chosen or typed lives in state.askDrafts, so a rebuild never loses it.
  function askNode(m, ask) {
    const card = el("div", { class: "ask", dataset: { askId: ask.ask_id } });
    if (ask.answered) {
      state.askDrafts.delete(ask.ask_id);
      for (const q of ask.questions) {
        card.append(el("div", { class: "ask-q" }, q.text),
          el("div", { class: "ask-a" }, `→ ${(ask.answers || {})[q.id] || ""}`));
      }
      card.append(el("div", { class: "ask-by" },
        `Answered by ${authorLabel(ask.answered_by)} · ${fmtTime(ask.answered_at_ms)}`));
      return card;
    }
    const myId = state.me && state.me.account ? state.me.account.id : null;
    const draft = state.askDrafts.get(ask.ask_id) || {};
    const form = el("form", { class: "ask-form" });
    for (const q of ask.questions) {
      const name = `ask-${ask.ask_id}-${q.id}`;
      const row = el("fieldset", { class: "ask-field" }, el("legend", { class: "ask-q" }, q.text));
      if (Array.isArray(q.options)) {
        for (const option of q.options) {
          const radio = el("input", { type: "radio", name, value: option, required: true, dataset: { question: q.id } });
          radio.checked = draft[q.id] === option;
          row.append(el("label", { class: "ask-option" }, radio, ` ${option}`));
        }
      } else {
        const input = el("input", { type: "text", name, required: true, dataset: { question: q.id }, class: "ask-input" });
        input.value = draft[q.id] || "";
        row.append(input);
      }
      form.append(row);
    }
    const note = el("span", { class: "ask-note" });
    const asker = m.author_account_id === myId;
    const button = el("button", { type: "submit", class: "ask-submit", dataset: asker ? { asker: "1" } : null }, "Answer");
    button.disabled = askButtonDisabled(ask.ask_id, asker);
    form.append(el("div", { class: "ask-actions" }, button,
      asker ? el("span", { class: "ask-note" }, "waiting for an answer") : note));
    const answersOf = () => {
      const answers = {};
      for (const input of form.querySelectorAll("input[data-question]")) {
        if ((input.type !== "radio" || input.checked) && input.value.trim()) answers[input.dataset.question] = input.value;
      }
      return answers;
    };
    const keep = () => state.askDrafts.set(ask.ask_id, answersOf());
    form.addEventListener("input", keep);
    form.addEventListener("change", keep);
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const answers = answersOf();
      state.askDrafts.set(ask.ask_id, answers);
      state.askSending.add(ask.ask_id);
      button.disabled = true;
      try {
        const data = await api(`/api/v1/messages/${encodeURIComponent(m.id)}/asks/${encodeURIComponent(ask.ask_id)}/answer`,
          { method: "POST", body: { answers } });
        state.askSending.delete(ask.ask_id);
        upsertMessage(data.message);
        regroup();
      } catch (err) {
        state.askSending.delete(ask.ask_id);
        // The form may have been rebuilt while the answer was on its way: speak through the live one.
        const live = document.querySelector(`.ask[data-ask-id="${CSS.escape(ask.ask_id)}"]`);
        const liveNote = live ? live.querySelector(".ask-note") : note;
        if (liveNote) liveNote.textContent = `Not answered: ${err.message}`;
        syncAskButtons();
      }
    });
    card.append(form);
    return card;
  }

  function askButtonDisabled(askId, asker) {
    return asker || !state.isMember || state.askSending.has(askId);
  }

  // Membership is read after the messages may be drawn: the Answer buttons follow it.
  function syncAskButtons() {
    for (const button of document.querySelectorAll("#messages .ask-submit")) {
      const card = button.closest(".ask");
      button.disabled = askButtonDisabled(card ? card.dataset.askId : "", button.dataset.asker === "1");
    }
  }

  // -- wiring -----------------------------------------------------------------------------------
  // What search.js (search box, attachments, network times) uses of this page.
  window.tidingsPage = {
    api, el, clear, fmtTime, selectChannel,
    token: () => state.token,
    channelName: (id) => (state.channels.get(id) || {}).name,
  };

  function boot() {
    $("login-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const token = $("token-input").value.trim();
      if (!token) return;
      $("login-error").textContent = "";
      open(token);
    });
    $("sign-out").addEventListener("click", () => signOut(""));
    $("composer").addEventListener("submit", send);
    const input = $("composer-input");
    input.addEventListener("input", autosize);
    input.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        $("composer").requestSubmit();
      }
    });
    window.addEventListener("hashchange", () => {
      const token = tokenFromFragment();
      if (token) {
        signOut("");
        open(token);
      }
    });
    const token = tokenFromFragment() || localStorage.getItem(TOKEN_KEY);
    if (token) open(token);
    else showLogin("");
  }

  boot();
})();
