// ragen trajectory viewer: plain JavaScript, no framework, no build step.
//
// Everything shown from the run (replies, observations, env names, problem codes) is
// untrusted model or file text. It reaches the page only through textContent, text nodes
// and setAttribute on attribute names written here; nothing is ever parsed as HTML, and
// every link is built from numbers and fixed words. The server's Content-Security-Policy
// (no inline script) is the second wall.
"use strict";

(() => {
  const PAGE_SIZE = 100;
  const POLL_MS = Math.max(200, Number(new URLSearchParams(location.search).get("poll")) || 3000);
  const SVG_NS = "http://www.w3.org/2000/svg";

  // ------------------------------------------------------------------ DOM helpers

  // el("div", {class: "x", title: "..."}, child, "text", ...): strings become text nodes.
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    setAttrs(node, attrs);
    for (const child of children.flat(Infinity)) {
      if (child !== null && child !== undefined && child !== false) node.append(child);
    }
    return node;
  }

  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(SVG_NS, tag);
    setAttrs(node, attrs);
    for (const child of children) if (child) node.append(child);
    return node;
  }

  function setAttrs(node, attrs) {
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.setAttribute("class", value);
      else if (key === "text") node.textContent = String(value);
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, String(value));
    }
  }

  function clear(node) {
    node.replaceChildren();
    return node;
  }

  const $ = (id) => document.getElementById(id);

  function fmt(value, digits = 3) {
    return typeof value === "number" && Number.isFinite(value) ? value.toFixed(digits) : "–";
  }

  function signed(value, digits = 2) {
    if (typeof value !== "number" || !Number.isFinite(value)) return "–";
    return (value > 0 ? "+" : "") + value.toFixed(digits);
  }

  function plural(n, word) {
    return `${n} ${word}${n === 1 ? "" : "s"}`;
  }

  // ------------------------------------------------------------------ routes

  // Routes live in the hash: #/  #/step/3?env=..&ep=5  #/group/2?steps=0,4,8&from=3
  function parseHash() {
    const raw = location.hash.replace(/^#\/?/, "");
    const [path, query] = raw.split("?", 2);
    return { parts: path.split("/").filter(Boolean), params: new URLSearchParams(query || "") };
  }

  // A step key is a number or the word "eval"; anything else is refused before use.
  function stepKey(text) {
    if (text === "eval") return "eval";
    return /^[0-9]{1,9}$/.test(text) ? Number(text) : null;
  }

  function link(parts, params) {
    const query = new URLSearchParams();
    for (const [key, value] of Object.entries(params || {})) {
      if (value !== null && value !== undefined && value !== "") query.set(key, String(value));
    }
    const text = query.toString();
    return "#/" + parts.map((p) => encodeURIComponent(String(p))).join("/") + (text ? "?" + text : "");
  }

  // ------------------------------------------------------------------ data sources

  class ApiSource {
    constructor() {
      this.live = true;
    }
    async get(path) {
      const response = await fetch(path, { cache: "no-store" });
      const body = await response.json().catch(() => ({}));
      if (!response.ok) {
        const detail = typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail);
        throw new Error(detail || response.statusText);
      }
      return body;
    }
    run() {
      return this.get("/api/run");
    }
    async version() {
      return (await this.get("/api/version")).version;
    }
    episodes(step, filters) {
      return this.get(`/api/steps/${step}/episodes?` + new URLSearchParams(filters));
    }
    episode(step, index) {
      return this.get(`/api/steps/${step}/episodes/${Number(index)}`);
    }
    group(group, steps) {
      return this.get(`/api/groups/${Number(group)}?` + new URLSearchParams({ steps }));
    }
  }

  // An exported file carries one step's episodes; it answers the same questions in memory.
  class LocalSource {
    constructor(data) {
      this.live = false;
      this.data = data;
      this.texts = data.records.map((r) =>
        (Array.isArray(r.turns) ? r.turns : [])
          .map((t) => (t && typeof t.reply === "string" ? t.reply : ""))
          .join("\n")
          .toLowerCase(),
      );
    }
    run() {
      const run = this.data.run;
      const steps = run.steps.map((s) => ({ ...s, episodes: s.step === this.data.step }));
      return Promise.resolve({ ...run, steps, eval_episodes: this.data.step === "eval" });
    }
    version() {
      return Promise.resolve(this.data.run.version);
    }
    check(step) {
      if (step !== this.data.step) {
        throw new Error(`this exported file holds step ${this.data.step} only`);
      }
    }
    async episodes(step, f) {
      this.check(step);
      const all = this.data.summaries;
      const text = (f.q || "").toLowerCase();
      const matched = all.filter(
        (s, i) =>
          (!f.env || s.env === f.env) &&
          (f.success === undefined || String(s.success) === f.success) &&
          (!f.end || s.end === f.end) &&
          (f.group === undefined || String(s.group) === f.group) &&
          (!text || this.texts[i].includes(text)),
      );
      const count = (key) => all.reduce((c, s) => ((c[s[key]] = (c[s[key]] || 0) + 1), c), {});
      const offset = Number(f.offset || 0);
      return {
        step,
        total: all.length,
        matched: matched.length,
        offset,
        limit: PAGE_SIZE,
        items: matched.slice(offset, offset + PAGE_SIZE),
        envs: count("env"),
        ends: count("end"),
        groups: new Set(all.map((s) => s.group)).size,
        notices: this.data.notices,
      };
    }
    async episode(step, index) {
      this.check(step);
      const summary = this.data.summaries[index];
      if (!summary) throw new Error(`no episode ${index} in this file`);
      return { step, summary, record: this.data.records[index], count: this.data.records.length };
    }
    async group(group) {
      const step = this.data.step;
      const episodes = this.data.summaries
        .filter((s) => s.group === group)
        .map((s) => ({
          ...s,
          replies: (this.data.records[s.index].turns || []).map((t) => String(t.reply || "")),
          cut: false,
        }));
      const distinct = new Set(episodes.map((e) => JSON.stringify(e.replies))).size;
      const seeds = [...new Set(episodes.map((e) => e.seed))];
      return {
        group,
        available: [step],
        columns: [{ step, seeds, distinct, episodes, omitted: 0 }],
        note: "an exported file holds one step; run `ragen view` for the other steps",
      };
    }
  }

  // ------------------------------------------------------------------ shared state

  const embedded = $("ragen-data");
  const source = embedded ? new LocalSource(JSON.parse(embedded.textContent)) : new ApiSource();
  const state = { run: null, version: null, view: null, notices: [], stepNotices: [] };

  function showNotices() {
    const box = clear($("notices"));
    for (const text of [...state.notices, ...state.stepNotices]) {
      box.append(el("p", { class: "notice", text }));
    }
  }

  function showError(error) {
    const main = clear($("main"));
    main.append(el("p", { class: "error", text: `Could not load: ${error.message}` }));
  }

  function renderHeader(run) {
    $("run-name").textContent = run.name;
    const c = run.config || {};
    const bits = [];
    if (c.env) bits.push(`env ${c.env}`);
    if (c.model) bits.push(`model ${c.model}`);
    if (c.estimator) bits.push(c.estimator);
    if (c.groups && c.group_size) bits.push(`${c.groups} groups × ${c.group_size}`);
    const done = run.steps.length;
    bits.push(c.steps ? `${done} / ${c.steps} steps logged` : `${done} steps logged`);
    $("run-config").textContent = bits.join(" · ");
    const live = $("live");
    live.hidden = !source.live;
    live.textContent = "● live";
    live.title = `following the run: checks for new steps every ${POLL_MS / 1000} s`;
    state.notices = run.notices || [];
    showNotices();
  }

  // ------------------------------------------------------------------ step list

  function chart(title, key, run, range) {
    const points = run.steps.filter((s) => typeof s[key] === "number");
    const W = 320;
    const H = 110;
    const pad = { l: 44, r: 10, t: 10, b: 22 };
    const box = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img" });
    box.append(svg("title", { text: title }));
    const figure = el("figure", { class: "chart-card" }, el("figcaption", { text: title }), box);
    if (!points.length) {
      box.append(svg("text", { x: W / 2, y: H / 2, class: "empty", text: "no data yet" }));
      return figure;
    }
    const steps = points.map((p) => p.step);
    const values = points.map((p) => p[key]);
    const [x0, x1] = [Math.min(...steps), Math.max(...steps)];
    let [y0, y1] = range || [Math.min(...values), Math.max(...values)];
    if (y0 === y1) [y0, y1] = [y0 - 0.5, y1 + 0.5];
    const x = (s) => pad.l + ((s - x0) / (x1 - x0 || 1)) * (W - pad.l - pad.r);
    const y = (v) => H - pad.b - ((v - y0) / (y1 - y0)) * (H - pad.t - pad.b);
    box.append(
      svg("line", { x1: pad.l, x2: W - pad.r, y1: H - pad.b, y2: H - pad.b, class: "axis" }),
      svg("text", { x: pad.l - 4, y: y(y1) + 4, class: "tick end", text: fmt(y1, 2) }),
      svg("text", { x: pad.l - 4, y: y(y0) + 4, class: "tick end", text: fmt(y0, 2) }),
      svg("text", { x: pad.l, y: H - 6, class: "tick", text: `step ${x0}` }),
      svg("text", { x: W - pad.r, y: H - 6, class: "tick end", text: `${x1}` }),
    );
    for (const a of run.alerts) {
      if (a.step < x0 || a.step > x1) continue;
      const line = svg("line", {
        x1: x(a.step),
        x2: x(a.step),
        y1: pad.t,
        y2: H - pad.b,
        class: `alert-mark ${alertClass(a)}`,
      });
      line.append(svg("title", { text: alertText(a) }));
      box.append(line);
    }
    const path = points.map((p) => `${x(p.step).toFixed(1)},${y(p[key]).toFixed(1)}`).join(" ");
    box.append(svg("polyline", { points: path, class: "series" }));
    for (const p of points) {
      const dot = svg("circle", { cx: x(p.step), cy: y(p[key]), r: 2.5, class: "dot" });
      dot.append(svg("title", { text: `step ${p.step}: ${fmt(p[key])}` }));
      if (p.episodes) {
        dot.classList.add("clickable");
        dot.addEventListener("click", () => (location.hash = link(["step", p.step])));
      }
      box.append(dot);
    }
    return figure;
  }

  // The gradient reporter's last analysis (trainer.gradient_analysis_every): each loss term's
  // gradient norm across the reward-variance buckets, lowest variance first, then all; log scale.
  const TERMS = ["task", "entropy", "kl", "value"];

  function bucketChart(g) {
    const title = `grad norm by reward-std bucket, step ${g.step}`;
    const [W, H] = [320, 110];
    const pad = { l: 44, r: 10, t: 10, b: 22 };
    const box = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img" });
    box.append(svg("title", { text: title }));
    const terms = TERMS.filter((t) => g.buckets.some(([, q]) => q[t] > 0));
    const kindOf = (term) => `term-${TERMS.indexOf(term)}`;
    const legend = terms.map((t) => el("span", { class: `term ${kindOf(t)}`, text: t }));
    const figure = el(
      "figure",
      { class: "chart-card", id: "gradient-buckets" },
      el("figcaption", { text: title }),
      box,
      el("p", { class: "legend" }, legend),
    );
    const logs = g.buckets.flatMap(([, q]) => terms.filter((t) => q[t] > 0).map((t) => q[t]));
    if (!logs.length) {
      box.append(svg("text", { x: W / 2, y: H / 2, class: "empty", text: "no gradient measured" }));
      return figure;
    }
    let [y0, y1] = [Math.min(...logs), Math.max(...logs)].map(Math.log10);
    [y0, y1] = [Math.floor(y0), Math.ceil(y1)];
    if (y0 === y1) y1 = y0 + 1;
    const x = (i) => pad.l + ((i + 0.5) / g.buckets.length) * (W - pad.l - pad.r);
    const y = (v) => H - pad.b - ((Math.log10(v) - y0) / (y1 - y0)) * (H - pad.t - pad.b);
    box.append(
      svg("line", { x1: pad.l, x2: W - pad.r, y1: H - pad.b, y2: H - pad.b, class: "axis" }),
      svg("text", { x: pad.l - 4, y: y(10 ** y1) + 4, class: "tick end", text: `1e${y1}` }),
      svg("text", { x: pad.l - 4, y: y(10 ** y0) + 4, class: "tick end", text: `1e${y0}` }),
    );
    g.buckets.forEach(([name], i) => {
      const label = name.replace(/^bucket_/, "");
      box.append(svg("text", { x: x(i), y: H - 6, class: "tick middle", text: label }));
    });
    for (const term of terms) {
      const kind = kindOf(term);
      const points = g.buckets.map(([name, q], i) => ({ name, q, i })).filter((p) => p.q[term] > 0);
      const path = points.map((p) => `${x(p.i).toFixed(1)},${y(p.q[term]).toFixed(1)}`).join(" ");
      box.append(svg("polyline", { points: path, class: `series ${kind}` }));
      for (const { name, q, i } of points) {
        const dot = svg("circle", { cx: x(i), cy: y(q[term]), r: 2.5, class: `dot ${kind}` });
        const rows = `${fmt(q.rows, 0)} episodes`;
        const spread = `reward std ${fmt(q.reward_std_min, 2)} to ${fmt(q.reward_std_max, 2)}`;
        const value = q[term].toExponential(2);
        dot.append(svg("title", { text: `${name} · ${term}: ${value} (${rows}, ${spread})` }));
        box.append(dot);
      }
    }
    return figure;
  }

  // Early warnings in amber, confirmed collapses (and unknown kinds) in red.
  function alertClass(a) {
    return a.kind === "warning" ? "warning" : "alert";
  }

  function alertText(a) {
    const numbers = `${fmt(a.value)} (baseline ${fmt(a.baseline)})`;
    return `step ${a.step}: ${a.kind} on ${a.signal}: ${a.message || numbers}`;
  }

  function stepsTable(run) {
    const alertsAt = {};
    for (const a of run.alerts) (alertsAt[a.step] = alertsAt[a.step] || []).push(a);
    const head = ["step", "success", "reward", "in-group std", "format ok", "reply tokens", "alerts"];
    const body = el("tbody");
    for (const s of [...run.steps].reverse()) {
      const label = s.episodes
        ? el("a", { href: link(["step", s.step]), text: String(s.step) })
        : el("span", { text: String(s.step), title: "no trajectories saved for this step" });
      const alerts = (alertsAt[s.step] || []).map((a) =>
        el("span", { class: `badge ${alertClass(a)}`, title: alertText(a), text: a.kind || "alert" }),
      );
      body.append(
        el(
          "tr",
          { "data-step": s.step },
          el("td", {}, label),
          el("td", { text: fmt(s["rollout/success"], 3) }),
          el("td", { text: signed(s["rollout/reward_mean"], 3) }),
          el("td", { text: fmt(s["rollout/reward_std"], 3) }),
          el("td", { text: fmt(s["rollout/format_ok"], 3) }),
          el("td", { text: fmt(s["rollout/reply_tokens"], 1) }),
          el("td", {}, alerts),
        ),
      );
    }
    return el(
      "table",
      { class: "steps", id: "steps-table" },
      el("thead", {}, el("tr", {}, head.map((h) => el("th", { text: h })))),
      body,
    );
  }

  function evalsTable(run) {
    const head = ["step", "env", "episodes", "success", "pass@k", "reward", "format ok"];
    const rows = run.evals.map((e) =>
      el(
        "tr",
        {},
        [e.step ?? "–", e.env, fmt(e.episodes, 0), fmt(e.success), fmt(e.pass_at_k)].map((v) =>
          el("td", { text: String(v) }),
        ),
        el("td", { text: signed(e.reward_mean, 3) }),
        el("td", { text: fmt(e.format_ok) }),
      ),
    );
    return el(
      "table",
      { class: "steps" },
      el("thead", {}, el("tr", {}, head.map((h) => el("th", { text: h })))),
      el("tbody", {}, rows),
    );
  }

  function renderSteps(run) {
    const main = clear($("main"));
    main.append(
      el(
        "section",
        { class: "charts" },
        chart("success rate", "rollout/success", run, [0, 1]),
        chart("reward (mean per episode)", "rollout/reward_mean", run),
        chart("reward std within groups", "rollout/reward_std", run),
        run.gradients ? bucketChart(run.gradients) : null,
      ),
    );
    if (run.alerts.length) {
      const items = run.alerts.map((a) => el("li", { class: alertClass(a), text: alertText(a) }));
      main.append(el("section", {}, el("h2", { text: "Alerts" }), el("ul", {}, items)));
    }
    if (run.eval_episodes) {
      main.append(
        el("p", {}, el("a", { href: link(["step", "eval"]), text: "evaluation episodes →" })),
      );
    }
    if (run.evals.length) {
      main.append(el("section", {}, el("h2", { text: "Evaluations" }), evalsTable(run)));
    }
    if (!run.steps.length) {
      main.append(
        el("p", { class: "muted", text: "No steps logged yet; this page updates as they come." }),
      );
      return;
    }
    main.append(el("section", {}, el("h2", { text: "Steps" }), stepsTable(run)));
  }

  // ------------------------------------------------------------------ step view

  const FILTERS = ["env", "success", "end", "q", "group", "offset"];

  function filtersOf(params) {
    const f = {};
    for (const key of FILTERS) if (params.get(key)) f[key] = params.get(key);
    return f;
  }

  class StepView {
    constructor(key) {
      this.key = key;
      this.filterKey = null;
      this.page = null;
      this.seq = 0;
      this.build();
    }

    build() {
      const main = clear($("main"));
      this.title = el("h2", { text: this.key === "eval" ? "Evaluation episodes" : `Step ${this.key}` });
      this.env = el("select", { id: "f-env", "aria-label": "environment" });
      this.success = el(
        "select",
        { id: "f-success", "aria-label": "result" },
        el("option", { value: "", text: "success and failure" }),
        el("option", { value: "true", text: "success only" }),
        el("option", { value: "false", text: "failure only" }),
      );
      this.end = el("select", { id: "f-end", "aria-label": "end reason" });
      this.search = el("input", {
        id: "f-q",
        type: "search",
        placeholder: "search replies",
        "aria-label": "search replies",
      });
      this.count = el("span", { id: "matched", class: "muted" });
      this.groupChip = el("span", { id: "group-filter" });
      for (const control of [this.env, this.success, this.end]) {
        control.addEventListener("change", () => this.navigate({}));
      }
      let timer = null;
      this.search.addEventListener("input", () => {
        clearTimeout(timer);
        timer = setTimeout(() => this.navigate({}, true), 250);
      });
      this.list = el("div", { id: "episodes", class: "episodes" });
      this.pager = el("nav", { class: "pager" });
      this.panel = el("aside", { id: "dialogue", class: "dialogue" });
      main.append(
        el("div", { class: "toolbar" }, el("a", { href: "#/", text: "← steps" }), this.title),
        el(
          "div",
          { class: "filters" },
          this.env,
          this.success,
          this.end,
          this.search,
          this.groupChip,
          this.count,
        ),
        el("div", { class: "split" }, el("div", {}, this.list, this.pager), this.panel),
      );
    }

    // Filters from the controls into the hash; replace (not push) while typing a search.
    navigate(extra, replace = false) {
      const params = {
        env: this.env.value,
        success: this.success.value,
        end: this.end.value,
        q: this.search.value,
        group: this.params ? this.params.get("group") : null,
        ep: this.params ? this.params.get("ep") : null, // the open rollout stays open
        ...extra,
      };
      const target = link(["step", this.key], params);
      if (replace) location.replace(target);
      else location.hash = target;
    }

    async show(params) {
      const filters = filtersOf(params);
      const filterKey = JSON.stringify(filters);
      const seq = ++this.seq;
      if (filterKey !== this.filterKey) {
        const page = await source.episodes(this.key, filters);
        if (seq !== this.seq) return;
        this.filterKey = filterKey;
        this.page = page;
        this.params = params;
        this.renderControls(filters, page);
        this.renderList(page, params);
      }
      this.params = params;
      this.markSelected(params.get("ep"));
      await this.renderPanel(params.get("ep"), seq);
    }

    renderControls(f, page) {
      fillSelect(this.env, page.envs, f.env, "all environments");
      fillSelect(this.end, page.ends, f.end, "any end reason");
      this.success.value = f.success || "";
      if (document.activeElement !== this.search) this.search.value = f.q || "";
      const groups = `${page.groups} groups`;
      this.count.textContent = `${page.matched} of ${page.total} episodes match · ${groups}`;
      this.groupChip.replaceChildren();
      if (f.group !== undefined) {
        const href = link(["step", this.key], { ...f, group: null, offset: null });
        this.groupChip.append(
          el("a", { class: "chip", href, title: "show every group", text: `group ${f.group} ✕` }),
        );
      }
      state.stepNotices = page.notices || [];
      showNotices();
    }

    renderList(page, params) {
      clear(this.list);
      if (!page.items.length) {
        this.list.append(el("p", { class: "muted", text: "No episode matches these filters." }));
      }
      let block = null;
      let current = null;
      for (const item of page.items) {
        if (item.group !== current) {
          current = item.group;
          block = el("div", { class: "cards" });
          this.list.append(el("div", { class: "group" }, this.groupHeader(item), block));
        }
        block.append(this.card(item, params));
      }
      this.renderPager(page, params);
    }

    groupHeader(item) {
      const bits = [el("span", { text: `group ${item.group} · seed ${item.seed}` })];
      if (this.key !== "eval") {
        const href = link(["group", item.group], { from: this.key });
        bits.push(el("a", { href, class: "over-time", text: "same group over time →" }));
      }
      return el("div", { class: "group-head" }, bits);
    }

    card(item, params) {
      const href = link(["step", this.key], { ...Object.fromEntries(params), ep: item.index });
      const problems = item.problems.length ? plural(item.problems.length, "format problem") : "";
      return el(
        "a",
        {
          class: `card ${item.success ? "ok" : "fail"}`,
          href,
          "data-index": item.index,
          title: item.problems.join(", "),
        },
        el(
          "div",
          { class: "card-head" },
          el("span", { class: "copy", text: `#${item.copy}` }),
          el("span", {
            class: `badge ${item.success ? "good" : "bad"}`,
            text: item.success ? "success" : "failure",
          }),
          el("span", { class: "badge reward", text: signed(item.reward) }),
        ),
        el("div", { class: "card-meta", text: `${item.end || "?"} · ${plural(item.turns, "turn")}` }),
        problems && el("div", { class: "card-problems", text: problems }),
        el("div", { class: "preview", text: item.preview }),
      );
    }

    renderPager(page, params) {
      clear(this.pager);
      const base = Object.fromEntries(params);
      delete base.ep;
      const last = Math.min(page.offset + page.items.length, page.matched);
      const pagerLink = (offset, text) =>
        el("a", { href: link(["step", this.key], { ...base, offset }), text });
      if (page.offset > 0) {
        this.pager.append(pagerLink(Math.max(0, page.offset - page.limit), "← previous"));
      }
      this.pager.append(
        el("span", { text: ` ${page.matched ? page.offset + 1 : 0}–${last} of ${page.matched} ` }),
      );
      if (last < page.matched) this.pager.append(pagerLink(page.offset + page.limit, "next →"));
    }

    markSelected(ep) {
      for (const card of this.list.querySelectorAll(".card.selected")) {
        card.classList.remove("selected");
      }
      if (ep === null) return;
      const card = this.list.querySelector(`.card[data-index="${Number(ep)}"]`);
      if (card) card.classList.add("selected");
    }

    async renderPanel(ep, seq) {
      if (ep === null || !/^[0-9]+$/.test(ep)) {
        clear(this.panel).append(
          el("p", { class: "muted", text: "Choose a rollout to read it turn by turn." }),
        );
        return;
      }
      const data = await source.episode(this.key, Number(ep));
      if (seq !== this.seq) return;
      clear(this.panel).append(dialogue(data));
    }
  }

  function fillSelect(select, counts, chosen, allLabel) {
    clear(select).append(el("option", { value: "", text: allLabel }));
    for (const [name, n] of Object.entries(counts).sort()) {
      select.append(el("option", { value: name, text: `${name || "(none)"} (${n})` }));
    }
    select.value = chosen || "";
  }

  // ------------------------------------------------------------------ one rollout

  function field(label, ...content) {
    const value = el("div", { class: "value" }, ...content);
    return el("div", { class: "field" }, el("div", { class: "label", text: label }), value);
  }

  function dialogue(data) {
    const r = data.record;
    const s = data.summary;
    const facts = [
      ["env", s.env],
      ["group", s.group],
      ["copy", s.copy],
      ["seed", s.seed],
      ["end", s.end],
      ["turns", s.turns],
      ["actions", s.actions],
      ["reply tokens", r.reply_tokens],
      ["context tokens", r.context_tokens],
    ];
    const contextWindow = typeof r.context_window === "string" ? r.context_window : "";
    if (contextWindow) facts.push(["context window", contextWindow]);
    const head = el(
      "div",
      { class: "episode-head" },
      el("h3", { text: `Episode #${s.index} (of ${data.count})` }),
      el("span", { class: `badge ${s.success ? "good" : "bad"}`, text: s.success ? "success" : "failure" }),
      el("span", { class: "badge reward", text: `reward ${signed(s.reward)}` }),
      el(
        "dl",
        { class: "facts" },
        facts.map(([k, v]) => [el("dt", { text: k }), el("dd", { text: String(v ?? "–") })]),
      ),
    );
    const turns = Array.isArray(r.turns) ? r.turns : [];
    return el("div", { class: "episode" }, head, turns.map((t, i) => turnView(t || {}, i, contextWindow)));
  }

  // What the model was shown at turn `now` (1-based) under a context window other than full:
  // every window opens with the instructions, and the run's worked examples (rollout.demos).
  function seen(contextWindow, first, now) {
    const from = Number.isInteger(first) && first >= 1 && first <= now ? first : now;
    const config = (state.run && state.run.config) || {};
    const opening = Number(config.demos) > 0 ? "the instructions (with worked examples)" : "the instructions";
    if (contextWindow === "single_turn") {
      if (from === now) return `${opening} and this turn's state only`;
      const to = now - 1;
      const past = from === to ? `turn ${from}` : `turns ${from}–${to}`;
      return `${opening}, ${past} summarised, then this turn's state`;
    }
    if (from === now) return `${opening} and this turn only`;
    return `${opening}, then turns ${from}–${now} as a chat`;
  }

  function turnView(t, i, contextWindow) {
    const problems = Array.isArray(t.problems) ? t.problems.map(String) : [];
    const actions = Array.isArray(t.actions) ? t.actions.map(String) : [];
    const rewards = Array.isArray(t.rewards) ? t.rewards : [];
    const formatOk = t.format_ok === true;
    const described = (state.run && state.run.problems) || {};
    return el(
      "section",
      { class: `turn ${formatOk ? "" : "bad-format"}` },
      el(
        "h4",
        {},
        `Turn ${i + 1} `,
        el("span", { class: "badge reward", text: `reward ${signed(t.reward)}` }),
        el("span", {
          class: `badge ${formatOk ? "good" : "bad"}`,
          text: formatOk ? "format ok" : "format problems",
        }),
      ),
      contextWindow
        ? field("model saw", el("span", { class: "muted", text: seen(contextWindow, t.first_shown, i + 1) }))
        : null,
      field("observation", el("pre", { class: "grid", text: String(t.observation ?? "") })),
      field("think", el("div", { class: "think text", text: String(t.think ?? "") })),
      field("answer", el("div", { class: "answer text", text: String(t.answer ?? "") })),
      field(
        "actions",
        actions.length
          ? actions.map((a, j) =>
              el("span", { class: "chip action", text: `${a} (${signed(rewards[j])})` }),
            )
          : el("span", { class: "muted", text: "none executed" }),
        t.unknown_actions ? el("span", { class: "muted", text: ` · ${t.unknown_actions} unknown` }) : null,
      ),
      problems.length
        ? field(
            "format problems",
            problems.map((p) => el("span", { class: "chip problem", title: described[p] || "", text: p })),
          )
        : null,
      el(
        "details",
        { class: "raw" },
        el("summary", { text: "raw reply" }),
        el("pre", { class: "text", text: String(t.reply ?? "") }),
      ),
    );
  }

  // ------------------------------------------------------------------ same group over time

  async function renderGroup(group, params) {
    const data = await source.group(group, params.get("steps") || "");
    const from = stepKey(params.get("from") || "");
    const main = clear($("main"));
    const back = from === null ? link([]) : link(["step", from]);
    const input = el("input", {
      id: "group-steps",
      value: data.columns.map((c) => c.step).join(","),
      "aria-label": "steps, comma-separated",
    });
    const apply = () => {
      location.hash = link(["group", group], { steps: input.value, from: params.get("from") });
    };
    input.addEventListener("keydown", (e) => e.key === "Enter" && apply());
    main.append(
      el(
        "div",
        { class: "toolbar" },
        el("a", { href: back, text: "← back" }),
        el("h2", { text: `Group ${group} over time` }),
        el("label", {}, "steps ", input),
        el("button", { type: "button", onclick: apply, text: "show" }),
      ),
      el("p", {
        class: "muted",
        text:
          data.note ||
          "Training seeds are fresh each step: a column is this group's slot at that step " +
            "(its copies share one seed). Identical replies across copies and steps are the " +
            "Echo Trap: a template taking over.",
      }),
      el("div", { class: "columns", id: "columns" }, data.columns.map((c) => column(c, group))),
    );
  }

  function column(c, group) {
    const head = el(
      "div",
      { class: "column-head" },
      el("a", { href: link(["step", c.step], { group }), text: `step ${c.step}` }),
    );
    if (c.missing) {
      head.append(el("span", { class: "muted", text: " no episodes saved" }));
      return el("div", { class: "column" }, head);
    }
    const n = c.episodes.length;
    head.append(
      el("span", { class: "muted", text: ` seed ${c.seeds.join(", ")} · ` }),
      el("span", {
        class: `badge ${c.distinct === 1 && n > 1 ? "bad" : "neutral"}`,
        title: "distinct reply sequences among the copies",
        text: `${c.distinct}/${n} distinct`,
      }),
    );
    const cards = c.episodes.map((e) =>
      el(
        "div",
        { class: `card ${e.success ? "ok" : "fail"}`, "data-copy": e.copy },
        el(
          "div",
          { class: "card-head" },
          el("a", { href: link(["step", c.step], { group, ep: e.index }), text: `#${e.copy}` }),
          el("span", { class: `badge ${e.success ? "good" : "bad"}`, text: e.success ? "success" : "failure" }),
          el("span", { class: "badge reward", text: signed(e.reward) }),
        ),
        e.replies.map((reply) => el("pre", { class: "reply text", text: reply })),
        e.cut ? el("p", { class: "muted", text: "(long replies cut; open the rollout)" }) : null,
      ),
    );
    const omitted = c.omitted
      ? el("p", {
          class: "muted",
          text: `${c.omitted} more episode${c.omitted > 1 ? "s" : ""} not shown: the answer's size is bounded; open the step`,
        })
      : null;
    return el("div", { class: "column" }, head, cards, omitted);
  }

  // ------------------------------------------------------------------ routing and polling

  async function route() {
    const { parts, params } = parseHash();
    try {
      if (parts[0] === "step" && stepKey(parts[1] || "") !== null) {
        const key = stepKey(parts[1]);
        if (!(state.view instanceof StepView && state.view.key === key)) {
          state.view = new StepView(key);
        }
        await state.view.show(params);
        return;
      }
      state.view = null;
      state.stepNotices = [];
      showNotices();
      if (parts[0] === "group" && /^[0-9]{1,9}$/.test(parts[1] || "")) {
        await renderGroup(Number(parts[1]), params);
      } else {
        state.run = await source.run(); // fresh numbers each time the list is opened
        renderHeader(state.run);
        renderSteps(state.run);
      }
    } catch (error) {
      state.view = null;
      showError(error);
    }
  }

  async function poll() {
    if (document.hidden) return;
    try {
      const version = await source.version();
      $("live").textContent = "● live";
      if (version === state.version) return;
      state.run = await source.run();
      state.version = state.run.version;
      renderHeader(state.run);
      if (parseHash().parts.length === 0) renderSteps(state.run);
    } catch {
      $("live").textContent = "● server not answering";
    }
  }

  async function start() {
    try {
      state.run = await source.run();
    } catch (error) {
      showError(error);
      return;
    }
    state.version = state.run.version;
    renderHeader(state.run);
    window.addEventListener("hashchange", route);
    await route();
    if (source.live) setInterval(poll, POLL_MS);
  }

  start();
})();
