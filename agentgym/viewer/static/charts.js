// Line charts drawn by hand as inline SVG: no chart library, so the page works offline.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const COLORS = ["#4a6fd8", "#d8664a", "#2a9d5c", "#9b4ad8"];
const W = 400, H = 160, PAD = { left: 44, right: 8, top: 8, bottom: 22 };

function svgEl(name, attrs) {
  const el = document.createElementNS(SVG_NS, name);
  for (const [key, value] of Object.entries(attrs)) el.setAttribute(key, value);
  return el;
}

// Short axis labels: 3 significant digits, no trailing noise like 0.30000000000000004.
function fmt(value) {
  return Math.abs(value) >= 1000 ? value.toFixed(0) : String(Number(value.toPrecision(3)));
}

// [min, max] over every point, widened when flat so a constant series is still drawn mid-height.
function extent(values) {
  let lo = Math.min(...values), hi = Math.max(...values);
  if (lo === hi) { lo -= 0.5; hi += 0.5; }
  return [lo, hi];
}

/**
 * Draw `series` ([{name, points: [[step, value], ...]}]) as one SVG line chart into
 * `container` (replacing what was there). Each point has a <title> with its exact value.
 */
function drawChart(container, title, series) {
  container.replaceChildren();
  const heading = document.createElement("h3");
  heading.textContent = title;
  container.append(heading);
  const points = series.flatMap((s) => s.points);
  const svg = svgEl("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none" });
  container.append(svg);
  if (!points.length) return;
  const [x0, x1] = extent(points.map((p) => p[0]));
  const [y0, y1] = extent(points.map((p) => p[1]));
  const sx = (x) => PAD.left + ((x - x0) / (x1 - x0)) * (W - PAD.left - PAD.right);
  const sy = (y) => H - PAD.bottom - ((y - y0) / (y1 - y0)) * (H - PAD.top - PAD.bottom);
  drawAxes(svg, x0, x1, y0, y1);
  series.forEach((s, i) => {
    const color = COLORS[i % COLORS.length];
    const line = s.points.map((p) => `${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(" ");
    svg.append(svgEl("polyline", { points: line, fill: "none", stroke: color, "stroke-width": 1.5, class: "series" }));
    for (const [x, y] of s.points) {
      const dot = svgEl("circle", { cx: sx(x), cy: sy(y), r: 2.5, fill: color });
      dot.append(svgEl("title", {}));
      dot.firstChild.textContent = `${s.name} @ step ${x}: ${y}`;
      svg.append(dot);
    }
  });
  if (series.length > 1) container.append(legend(series));
}

function drawAxes(svg, x0, x1, y0, y1) {
  const axis = { stroke: "#999", "stroke-width": 1 };
  svg.append(svgEl("line", { x1: PAD.left, y1: H - PAD.bottom, x2: W - PAD.right, y2: H - PAD.bottom, ...axis }));
  svg.append(svgEl("line", { x1: PAD.left, y1: PAD.top, x2: PAD.left, y2: H - PAD.bottom, ...axis }));
  const label = (x, y, text, anchor) => {
    const el = svgEl("text", { x, y, "font-size": 10, fill: "#555", "text-anchor": anchor });
    el.textContent = text;
    svg.append(el);
  };
  label(PAD.left - 4, PAD.top + 8, fmt(y1), "end");
  label(PAD.left - 4, H - PAD.bottom, fmt(y0), "end");
  label(PAD.left, H - 6, fmt(x0), "start");
  label(W - PAD.right, H - 6, `step ${fmt(x1)}`, "end");
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
