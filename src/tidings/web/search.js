// Tidings web page, part two: the search box, attachments and network times.
//
// Loaded before app.js; app.js calls window.tidingsExtras while it draws a message, and
// this file calls back through window.tidingsPage (the API with the user's token, the DOM
// helper, opening a channel). As in app.js, user content only ever becomes text nodes:
// a search snippet arrives HTML-escaped with <mark> around the matches, and is split on
// those tags and un-escaped into text nodes, never parsed as markup.
"use strict";

(() => {
  const page = () => window.tidingsPage;
  const ENTITIES = { "&amp;": "&", "&lt;": "<", "&gt;": ">", "&quot;": '"', "&#x27;": "'" };
  const IMAGE_TYPES = new Set(["image/png", "image/jpeg", "image/gif", "image/webp"]);
  const blobUrls = new Map(); // attachment url -> object URL (fetched once per page)

  function unescape(text) {
    return text.replace(/&(amp|lt|gt|quot|#x27);/g, (m) => ENTITIES[m]);
  }

  // The snippet as nodes: text, with <mark> elements around the matches.
  function snippetNodes(snippet) {
    const { el } = page();
    const out = [];
    const parts = (snippet || "").split(/(<mark>|<\/mark>)/);
    let marked = false;
    for (const part of parts) {
      if (part === "<mark>") marked = true;
      else if (part === "</mark>") marked = false;
      else if (part) out.push(marked ? el("mark", null, unescape(part)) : document.createTextNode(unescape(part)));
    }
    return out;
  }

  // -- network time ------------------------------------------------------------------------
  function shownTime(m) {
    return m.occurred_at_ms || m.at_unix_ms;
  }

  function timeTitle(m) {
    const hub = new Date(m.at_unix_ms).toLocaleString();
    if (!m.occurred_at_ms) return hub;
    return `sent on the network ${new Date(m.occurred_at_ms).toLocaleString()}; reached the hub ${hub}`;
  }

  // -- attachments -------------------------------------------------------------------------
  function fmtSize(n) {
    if (n === null || n === undefined) return "";
    if (n < 1024) return `${n} B`;
    if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KB`;
    return `${(n / 1024 / 1024).toFixed(1)} MB`;
  }

  async function fetchBlob(url) {
    if (blobUrls.has(url)) return blobUrls.get(url);
    const res = await fetch(url, { headers: { Authorization: `Bearer ${page().token()}` }, cache: "no-store" });
    if (!res.ok) throw new Error(`HTTP ${res.status}`);
    const objectUrl = URL.createObjectURL(await res.blob());
    blobUrls.set(url, objectUrl);
    return objectUrl;
  }

  async function download(att) {
    const a = page().el("a", { href: await fetchBlob(att.url), download: att.name || "attachment" });
    document.body.append(a);
    a.click();
    a.remove();
  }

  function attachmentNode(att) {
    const { el } = page();
    const facts = [att.content_type, fmtSize(att.size_bytes),
      att.width && att.height ? `${att.width}×${att.height}` : ""].filter(Boolean).join(" · ");
    const figure = el("figure", { class: "attachment", dataset: { name: att.name, available: att.available } },
      el("figcaption", null,
        el("span", { class: "att-name" }, att.name || "attachment"),
        el("span", { class: "att-facts" }, facts),
        att.caption ? el("span", { class: "att-caption" }, att.caption) : null,
        att.available
          ? el("button", { type: "button", class: "link-button att-download", onclick: () => download(att).catch(() => {}) },
            "Download")
          : el("span", { class: "att-missing", title: "the bridge has not uploaded the bytes yet" }, "not uploaded")));
    if (att.available && IMAGE_TYPES.has(att.content_type)) {
      const img = el("img", { class: "att-image", alt: att.name || "image" });
      if (att.width && att.height) img.style.aspectRatio = `${att.width} / ${att.height}`;
      figure.prepend(img);
      fetchBlob(att.url).then((src) => { img.src = src; }).catch(() => img.remove());
    }
    return figure;
  }

  function attachmentsNode(m) {
    if (!m.attachments || !m.attachments.length) return null;
    return page().el("div", { class: "attachments" }, m.attachments.map(attachmentNode));
  }

  // -- the search box ----------------------------------------------------------------------
  let searchGen = 0;

  function hitNode(hit) {
    const { el, fmtTime, channelName } = page();
    const m = hit.message;
    const channel = hit.kind === "channel_message";
    const where = channel ? `#${channelName(m.channel_id) || m.channel_id}`
      : `${m.conversation_title || "conversation"} (bridge)`;
    const at = channel ? shownTime(m) : m.occurred_at_ms;
    const open = channel ? () => { closeResults(); page().selectChannel(m.channel_id); } : null;
    return el("li", { class: `search-hit ${channel ? "hit-channel" : "hit-bridge"}`, dataset: { id: m.id } },
      el("div", { class: "hit-meta" },
        open ? el("button", { type: "button", class: "link-button hit-where", onclick: open }, where)
          : el("span", { class: "hit-where" }, where),
        el("time", { class: "hit-at", datetime: new Date(at).toISOString() }, fmtTime(at))),
      el("div", { class: "hit-snippet" }, snippetNodes(hit.snippet)),
      m.attachments && m.attachments.length
        ? el("div", { class: "hit-attachments" }, `attached: ${m.attachments.map((a) => a.name || "a file").join(", ")}`)
        : null);
  }

  function closeResults() {
    const box = document.getElementById("search-results");
    if (box) box.hidden = true;
  }

  async function runSearch(event) {
    event.preventDefault();
    const { api, el, clear } = page();
    const q = document.getElementById("search-input").value.trim();
    const box = document.getElementById("search-results");
    const list = document.getElementById("search-list");
    const note = document.getElementById("search-note");
    if (!q) {
      closeResults();
      return;
    }
    const gen = ++searchGen;
    box.hidden = false;
    clear(list);
    note.textContent = "searching…";
    try {
      const data = await api(`/api/v1/search?q=${encodeURIComponent(q)}&limit=50`);
      if (gen !== searchGen) return;
      for (const hit of data.results) list.append(hitNode(hit));
      note.textContent = data.results.length
        ? `${data.results.length} result${data.results.length === 1 ? "" : "s"} for “${q}”, best first`
        : `nothing found for “${q}”`;
    } catch (err) {
      if (gen !== searchGen) return;
      note.textContent = err.message || "search failed";
      list.append(el("li", { class: "search-error" }));
    }
  }

  function boot() {
    const form = document.getElementById("search-form");
    if (form) form.addEventListener("submit", runSearch);
    const close = document.getElementById("search-close");
    if (close) close.addEventListener("click", closeResults);
    document.addEventListener("keydown", (event) => {
      if (event.key === "Escape") closeResults();
    });
  }

  window.tidingsExtras = { shownTime, timeTitle, attachmentsNode, snippetNodes };
  boot();
})();
