// Line charts drawn by hand as inline SVG: no chart library, so the page works offline.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const COLORS = ["#4a6fd8", "#d8664a", "#2a9d5c", "#9b4ad8"];
const W = 400, H = 160, PAD = { left: 44, right: 8, top: 8, bottom: 22 };
const X_TICKS = 5;  // at most, on the step axis

function svgEl(name, attrs) {
  const el = document.createElementNS(SVG_NS, name);
  for (const [key, value] of Object.entries(attrs)) el.setAttribute(key, value);
  return el;
}

// Short axis labels: 3 significant digits, no trailing noise like 0.30000000000000004.
function fmt(value) {
  return Math.abs(value) >= 1000 ? value.toFixed(0) : String(Number(value.toPrecision(3)));
}

// The page's one tooltip (tokens and charts share it), placed next to the pointer.
function placeTooltip(event, text) {
  const tip = document.getElementById("tooltip");
  tip.textContent = text;
  tip.style.left = `${event.clientX + 12}px`;
  tip.style.top = `${event.clientY + 12}px`;
  tip.hidden = false;
}

// Steps are integers: a single step gets a neighbour on each side rather than step 0.5..1.5.
function stepExtent(steps) {
  const lo = Math.min(...steps), hi = Math.max(...steps);
  return lo === hi ? [lo - 1, hi + 1] : [lo, hi];
}

// Rates span 0..1 whatever their values; other series their own range, widened when flat
// (by 10% of the value) so a constant line is still drawn mid-height.
function valueExtent(values, rate) {
  const lo = Math.min(...values), hi = Math.max(...values);
  if (rate) return [Math.min(0, lo), Math.max(1, hi)];
  if (lo !== hi) return [lo, hi];
  const pad = Math.abs(lo) * 0.1 || 0.5;
  return [lo - pad, hi + pad];
}

// Integer ticks from x0 to x1, at most X_TICKS of them.
function stepTicks(x0, x1) {
  const every = Math.max(1, Math.ceil((x1 - x0) / (X_TICKS - 1)));
  const ticks = [];
  for (let x = Math.ceil(x0); x <= x1; x += every) ticks.push(x);
  return ticks;
}

/**
 * Draw `series` ([{name, points: [[step, value], ...]}]) as one SVG line chart into
 * `container` (replacing what was there). `rate`: the values are shares, drawn on 0..1.
 * Hovering the chart shows every series' value at the nearest step.
 */
// `rlStart`: the first RL step; a dashed line marks it where the chart shows steps before it.
function drawChart(container, title, series, rate = false, rlStart = null) {
  container.replaceChildren();
  const heading = document.createElement("h3");
  heading.textContent = title;
  container.append(heading);
  const points = series.flatMap((s) => s.points);
  const svg = svgEl("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none" });
  container.append(svg);
  if (!points.length) return;
  const [x0, x1] = stepExtent(points.map((p) => p[0]));
  const bounds = series.flatMap((s) => (s.intervals ?? []).flat());
  const [y0, y1] = valueExtent([...points.map((p) => p[1]), ...bounds], rate);
  const sx = (x) => PAD.left + ((x - x0) / (x1 - x0)) * (W - PAD.left - PAD.right);
  const sy = (y) => H - PAD.bottom - ((y - y0) / (y1 - y0)) * (H - PAD.top - PAD.bottom);
  drawAxes(svg, sx, x0, x1, y0, y1);
  if (rlStart !== null && rlStart - 0.5 > x0 && rlStart - 0.5 < x1) {
    const x = sx(rlStart - 0.5);
    svg.append(svgEl("line", { x1: x, y1: PAD.top, x2: x, y2: H - PAD.bottom, stroke: "#999", "stroke-dasharray": "4 3", class: "rl-start" }));
  }
  series.forEach((s, i) => {
    const color = COLORS[i % COLORS.length];
    const line = s.points.map((p) => `${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(" ");
    svg.append(svgEl("polyline", { points: line, fill: "none", stroke: color, "stroke-width": 1.5, class: "series" }));
    for (const [x, y] of s.points) svg.append(svgEl("circle", { cx: sx(x), cy: sy(y), r: 2.5, fill: color }));
    (s.intervals ?? []).forEach(([low, high], j) => {
      const x = sx(s.points[j][0]);
      svg.append(svgEl("line", { x1: x, y1: sy(low), x2: x, y2: sy(high), stroke: color, class: "interval" }));
    });
  });
  attachHover(svg, series, sx);
  if (series.length > 1) container.append(legend(series));
}

function drawAxes(svg, sx, x0, x1, y0, y1) {
  const axis = { stroke: "#999", "stroke-width": 1 };
  svg.append(svgEl("line", { x1: PAD.left, y1: H - PAD.bottom, x2: W - PAD.right, y2: H - PAD.bottom, ...axis }));
  svg.append(svgEl("line", { x1: PAD.left, y1: PAD.top, x2: PAD.left, y2: H - PAD.bottom, ...axis }));
  const label = (x, y, text, anchor, kind) => {
    const el = svgEl("text", { x, y, "font-size": 10, fill: "#555", "text-anchor": anchor, class: kind });
    el.textContent = text;
    svg.append(el);
  };
  label(PAD.left - 4, PAD.top + 8, fmt(y1), "end", "y-tick");
  label(PAD.left - 4, H - PAD.bottom, fmt(y0), "end", "y-tick");
  for (const x of stepTicks(x0, x1)) label(sx(x), H - 6, String(x), "middle", "x-tick");
  label(W - PAD.right, H - PAD.bottom - 4, "step", "end", "x-title");
}

// A vertical guide at the step nearest the pointer, and the tooltip with each series' value there.
function attachHover(svg, series, sx) {
  const steps = [...new Set(series.flatMap((s) => s.points.map((p) => p[0])))];
  const guide = svgEl("line", { y1: PAD.top, y2: H - PAD.bottom, stroke: "#888", "stroke-dasharray": "3 2", visibility: "hidden" });
  svg.append(guide);
  svg.addEventListener("mousemove", (event) => {
    const box = svg.getBoundingClientRect();
    const x = ((event.clientX - box.left) / box.width) * W;  // viewBox units (the svg stretches)
    const step = steps.reduce((best, s) => (Math.abs(sx(s) - x) < Math.abs(sx(best) - x) ? s : best));
    guide.setAttribute("x1", sx(step));
    guide.setAttribute("x2", sx(step));
    guide.setAttribute("visibility", "visible");
    const values = series.flatMap((s) => s.points.filter((p) => p[0] === step).map((p) => `${s.name} ${Number(p[1].toPrecision(4))}`));
    placeTooltip(event, [`step ${step}`, ...values].join(" · "));
  });
  svg.addEventListener("mouseleave", () => {
    guide.setAttribute("visibility", "hidden");
    document.getElementById("tooltip").hidden = true;
  });
}

function legend(series) {
  const box = document.createElement("div");
  box.className = "legend";
  series.forEach((s, i) => {
    const item = document.createElement("span");
    item.style.color = COLORS[i % COLORS.length];
    item.textContent = `— ${s.name}`;
    box.append(item);
  });
  return box;
}
