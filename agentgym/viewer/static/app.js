// The viewer page: episode list (paged and filtered by the server), episode replay with
// token-level loss mask and log-probs, side-by-side comparison, and the live run dashboard.
// Plain JavaScript, no build step; text from trajectories is always inserted as text, never HTML.
"use strict";

const PAGE_SIZE = 50;
const state = { request: 0, offset: 0, total: 0, info: null, metrics: [], metricsNext: 0 };

// Dashboard panels: [title, [[label, row => value | undefined], ...]]. Those of
// `agentgym plot` come from /api/info (one list for both); these are the viewer's own:
// throughput (sampled tokens per second of rollout wall time) and episode length.
const VIEWER_PANELS = [
  ["tokens/s (rollout)", [["tokens/s", (r) => (r.rollout_s > 0 ? r.generated_tokens / r.rollout_s : undefined)]]],
  ["mean turns", [["turns_mean", (r) => r.turns_mean]]],
];

function panels() {
  const plotted = state.info.panels.map(([title, keys]) => [title, keys.map((key) => [key, (r) => r[key]])]);
  return [...plotted, ...VIEWER_PANELS];
}

// ----- small helpers ------------------------------------------------------------------

// el("div", {class: "x"}, "text", child) -> element; strings become text nodes (never HTML).
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value !== undefined && value !== null) node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

async function getJSON(url) {
  const response = await fetch(url);
  const body = await response.json();
  if (!response.ok) throw new Error(body.error ? body.error.message : response.statusText);
  return body;
}

const num = (x, digits = 3) => (x === null || x === undefined ? "–" : Number(x).toFixed(digits));
const outcome = (ep) => el("span", { class: ep.success ? "ok" : "fail" }, ep.success ? "success" : "failed");

// Replace a <select>'s options after its first ("any"), keeping the current choice.
function fillSelect(select, values) {
  const keep = select.value;
  while (select.options.length > 1) select.remove(1);
  for (const value of values) select.append(el("option", { value }, value));
  select.value = values.map(String).includes(keep) ? keep : "";
}

// ----- episode list -------------------------------------------------------------------

function filterQuery() {
  const params = new URLSearchParams();
  for (const [key, value] of new FormData(document.getElementById("filters"))) {
    if (value !== "") params.set(key, value);
  }
  return params;
}

async function loadPage() {
  const params = filterQuery();
  params.set("offset", state.offset);
  params.set("limit", PAGE_SIZE);
  const request = ++state.request;
  const page = await getJSON(`/api/episodes?${params}`);
  if (request !== state.request) return;  // a newer filter's answer wins, whatever the arrival order
  state.total = page.total;
  const body = document.querySelector("#episode-list tbody");
  body.replaceChildren(...page.episodes.map(episodeRow));
  const last = Math.min(state.offset + PAGE_SIZE, page.total);
  document.getElementById("page-info").textContent =
    page.total ? `${state.offset + 1}–${last} of ${page.total}` : "no episodes match";
  document.getElementById("prev").disabled = state.offset === 0;
  document.getElementById("next").disabled = last >= page.total;
}

function episodeRow(ep) {
  const row = el(
    "tr",
    { "data-id": ep.id },
    el("td", {}, ep.id),
    el("td", {}, ep.step ?? "–"),
    el("td", { title: `${ep.env} · ${ep.source}` }, ep.task_id, ep.sample ? ` #${ep.sample}` : ""),
    el("td", {}, outcome(ep)),
    el("td", {}, num(ep.reward, 2)),
    el("td", {}, ep.turns),
  );
  row.addEventListener("click", () => openEpisode(ep.id));
  return row;
}

// ----- one episode --------------------------------------------------------------------

async function openEpisode(id) {
  for (const row of document.querySelectorAll("#episode-list tr.selected")) row.classList.remove("selected");
  document.querySelector(`#episode-list tr[data-id="${id}"]`)?.classList.add("selected");
  const episode = await getJSON(`/api/episodes/${id}`);
  const pane = document.getElementById("detail-pane");
  pane.replaceChildren(comparePicker(episode), renderEpisode(episode));
  const link = episodeLink(episode);
  if (location.hash !== link) history.pushState(null, "", link);  // shareable; Back returns
}

// ----- deep links: #<file>/<n> is the n-th episode (0-based) of that file --------------
// (file and position, not the index id, so a link still names the same episode after a restart)

const episodeLink = (ep) => `#${encodeURI(ep.source)}/${ep.ordinal}`;

async function openLinkedEpisode() {
  const match = /^#(.+)\/(\d+)$/.exec(location.hash);
  if (!match) return;
  const params = new URLSearchParams({ source: decodeURI(match[1]), offset: match[2], limit: 1 });
  const page = await getJSON(`/api/episodes?${params}`);
  if (page.episodes.length) {
    showTab("episodes");
    await openEpisode(page.episodes[0].id);
  } else {
    document.getElementById("detail-pane").replaceChildren(
      el("p", { class: "fail" }, `no episode ${match[2]} in ${decodeURI(match[1])}`));
  }
}

function renderEpisode(ep) {
  const box = el("div", { class: "episode", "data-episode": ep.id });
  box.append(
    el(
      "div",
      { class: "episode-head" },
      el("b", {}, `${ep.env} · ${ep.task_id}`),
      ep.step !== null ? ` · step ${ep.step}` : "",
      " · ", outcome(ep),
      ` · score ${num(ep.score, 2)} · reward ${num(ep.reward, 2)} · ${ep.turn_count} turns · ${ep.end_reason}`,
      el("div", { class: "muted" }, `${ep.source} · policy ${ep.policy} · format ${ep.format}`,
        ep.tokenizer ? ` · tokens decoded with ${ep.tokenizer}` : ""),
      ep.error ? el("div", { class: "fail" }, ep.error) : null,
    ),
  );
  if (ep.system) box.append(el("details", {}, el("summary", {}, "system prompt"), el("pre", {}, ep.system)));
  ep.turns.forEach((turn) => box.append(renderTurn(turn)));
  if (ep.final_observation) {
    box.append(el("div", { class: "turn final" }, el("h4", {}, "final observation"),
      el("pre", { class: "observation" }, ep.final_observation)));
  }
  if (ep.token_runs.length) box.append(renderAllTokens(ep.token_runs));
  return box;
}

// el() drops null children (Node.append would print them as the text "null").
function renderTurn(turn) {
  return el("div", { class: "turn", "data-turn": turn.index },
    el("h4", {}, `turn ${turn.index + 1}`, turn.reward !== null ? ` · reward ${num(turn.reward, 2)}` : "",
      turn.mean_logprob !== null ? ` · mean log-prob ${num(turn.mean_logprob)}` : ""),
    turn.observation !== null ? el("pre", { class: "observation" }, turn.observation) : null,
    turn.thought !== null ? el("div", { class: "field thought" }, el("b", {}, "thought"), turn.thought) : null,
    el("div", { class: "field action" }, el("b", {}, "action"),
      turn.action ?? el("span", { class: "fail" }, "(reply did not parse)")),
    // The reply as trained tokens when the record has them, else as text.
    turn.tokens ? el("div", { class: "tokens reply" }, ...turn.tokens.map((t) => tokenSpan(t, true)))
      : el("pre", { class: "reply" }, turn.reply),
  );
}

// Every token of the episode: prompt/observation tokens grey, trained (loss mask 1) highlighted.
function renderAllTokens(runs) {
  const spans = runs.flatMap((run) => run.tokens.map((t) => tokenSpan(t, run.trained)));
  return el("details", { class: "all-tokens" },
    el("summary", {}, "all tokens (highlighted: trained, loss mask 1)"),
    el("div", { class: "tokens" }, ...spans));
}

function tokenSpan(token, trained) {
  const span = el("span", { class: `tok ${trained ? "trained" : "prompt"}`, "data-id": token.id },
    token.text ?? `⟨${token.id}⟩`);
  if (token.logprob !== null) span.dataset.logprob = token.logprob;
  return span;
}

// Hovering a token shows its id, and for trained tokens its log-prob and probability.
// (Charts run their own hover: see charts.js.)
function showTooltip(event) {
  if (event.target.closest?.(".chart")) return;
  const tok = event.target.closest?.(".tok");
  if (!tok) { document.getElementById("tooltip").hidden = true; return; }
  const lp = tok.dataset.logprob;
  placeTooltip(event, lp !== undefined
    ? `log-prob ${Number(lp).toFixed(4)} · p ${Math.exp(Number(lp)).toFixed(3)} · id ${tok.dataset.id}`
    : `id ${tok.dataset.id} · not trained (loss mask 0)`);
}

// ----- side-by-side comparison ---------------------------------------------------------

// A menu of the other episodes of the same task (other steps, checkpoints or files).
function comparePicker(ep) {
  const select = el("select", { id: "compare-with" }, el("option", { value: "" }, "compare with…"));
  const params = new URLSearchParams({ task: ep.task_id, limit: 500 });
  getJSON(`/api/episodes?${params}`).then((page) => {
    for (const other of page.episodes) {
      if (other.id === ep.id || other.task_id !== ep.task_id) continue;
      const label = `#${other.id} · ${other.step !== null ? `step ${other.step}` : other.source}` +
        ` · ${other.success ? "success" : "failed"} · reward ${num(other.reward, 2)}`;
      select.append(el("option", { value: other.id }, label));
    }
  });
  select.addEventListener("change", () => select.value && openCompare(ep.id, select.value));
  return el("div", { class: "compare-bar" }, select);
}

async function openCompare(a, b) {
  const pair = await getJSON(`/api/compare?a=${a}&b=${b}`);
  const back = el("button", { id: "compare-close" }, "◀ back to episode");
  back.addEventListener("click", () => openEpisode(a));
  document.getElementById("detail-pane").replaceChildren(
    back, el("div", { class: "compare" }, renderEpisode(pair.a), renderEpisode(pair.b)));
}

// ----- run dashboard -------------------------------------------------------------------

// Fetch the metrics rows appended since the last poll and redraw every panel with data.
async function pollMetrics() {
  const fresh = await getJSON(`/api/metrics?since=${state.metricsNext}`);
  state.metrics.push(...fresh.rows);
  state.metricsNext = fresh.next;
  const status = document.getElementById("dashboard-status");
  status.textContent = state.metrics.length
    ? `${state.metrics.length} steps logged · refreshed ${new Date().toLocaleTimeString()}`
    : "no metrics.jsonl rows yet (view a run folder to see training curves)";
  if (fresh.rows.length || !document.querySelector("#charts .chart")) drawDashboard();
}

function drawDashboard() {
  const charts = document.getElementById("charts");
  charts.replaceChildren();
  for (const [title, lines] of panels()) {
    const series = lines.flatMap(([name, get]) => seriesOf(name, get)).filter((s) => s.points.length);
    const rate = lines.every(([name]) => state.info.rate_keys.includes(name));
    for (const [heading, some] of chartsOf(title, lines, series)) {
      const box = el("div", { class: "chart", "data-panel": heading });
      charts.append(box);
      drawChart(box, heading, some, rate, rlStart());
    }
  }
}

// The first RL step (a dashed line before it marks where cloning ends), or null.
function rlStart() {
  const first = state.metrics.find((row) => row.phase === "rl" && Number.isFinite(row.step));
  return first ? first.step : null;
}

// A panel of per-phase keys (the loss) is one chart per phase, as in curves.png: a
// behaviour-cloning NLL and an RL loss are different quantities, and on one axis the
// smaller looks flat.
function chartsOf(title, lines, series) {
  if (!series.length) return [];
  if (!lines.some(([name]) => state.info.phase_keys.includes(name))) return [[title, series]];
  return series.map((s) => [s.name, [s]]);
}

// One series; or, for the keys the server names (the loss), one per training phase
// (bc, rl, ...): a behaviour-cloning NLL and an RL loss are different quantities.
function seriesOf(name, get) {
  const rows = state.metrics.filter((row) => Number.isFinite(row.step) && Number.isFinite(get(row)));
  const points = (some) => some.map((row) => [row.step, get(row)]);
  // Held-out rates come with their 95% interval (KEY_interval, from the server): error bars.
  const intervals = rows.map((row) => row[`${name}_interval`]).filter(Array.isArray);
  if (intervals.length === rows.length && rows.length) return [{ name, points: points(rows), intervals }];
  if (!state.info.phase_keys.includes(name)) return [{ name, points: points(rows) }];
  const phases = [...new Set(rows.map((row) => row.phase ?? ""))];
  return phases.map((phase) => ({ name: `${name} · ${phase}`, points: points(rows.filter((row) => (row.phase ?? "") === phase)) }));
}

// New rollouts appear while a run trains: refresh the menus and the current page.
async function pollEpisodes() {
  const info = await getJSON("/api/info");
  if (["episodes", "next_id", "skipped_lines"].some((key) => info[key] !== state.info[key])) {
    state.info = info;
    showCounts(info);
    fillMenus(info);
    await loadPage();
  }
}

// Malformed lines are skipped, never shown: the header says how many.
function showCounts(info) {
  const skipped = info.skipped_lines ? ` · ${info.skipped_lines} malformed skipped` : "";
  document.getElementById("root").textContent = `${info.root} · ${info.episodes} episodes${skipped}`;
}

function fillMenus(info) {
  const form = document.getElementById("filters");
  fillSelect(form.elements.env, info.envs);
  fillSelect(form.elements.step, info.steps);
  fillSelect(form.elements.source, info.sources);
}

// ----- wiring --------------------------------------------------------------------------

function showTab(name) {
  for (const tab of document.querySelectorAll(".tab")) tab.classList.toggle("active", tab.dataset.tab === name);
  for (const panel of document.querySelectorAll(".panel")) panel.classList.toggle("active", panel.id === name);
}

async function main() {
  state.info = await getJSON("/api/info");
  showCounts(state.info);
  fillMenus(state.info);
  let typing;
  const form = document.getElementById("filters");
  const refilter = () => { state.offset = 0; loadPage(); };
  form.addEventListener("change", (event) => event.target.tagName === "SELECT" && refilter());
  // Menus apply at once; typed values wait for a pause in typing.
  form.addEventListener("input", (event) => {
    if (event.target.tagName === "SELECT") return;
    clearTimeout(typing);
    typing = setTimeout(refilter, 300);
  });
  form.addEventListener("submit", (event) => event.preventDefault());
  document.getElementById("prev").addEventListener("click", () => { state.offset -= PAGE_SIZE; loadPage(); });
  document.getElementById("next").addEventListener("click", () => { state.offset += PAGE_SIZE; loadPage(); });
  for (const tab of document.querySelectorAll(".tab")) tab.addEventListener("click", () => showTab(tab.dataset.tab));
  document.addEventListener("mouseover", showTooltip);
  if (state.info.run && !state.info.episodes) showTab("dashboard");
  window.addEventListener("popstate", openLinkedEpisode);  // Back/Forward, or a link typed in
  await Promise.all([loadPage(), pollMetrics(), openLinkedEpisode()]);
  setInterval(() => { pollMetrics(); pollEpisodes(); }, state.info.poll_s * 1000);
  document.body.dataset.ready = "true";  // tests wait for this before interacting
}

main();
