import { json, SessionMetrics, sessionPath } from "../api";
import { h, say, status } from "../dom";
import { Scope } from "../nav";

const SVG = "http://www.w3.org/2000/svg";
const KEEP = 60;

interface Sample {
  t: number;
  cpuPercent: number;
  memoryMib: number;
}

/** A line chart of the last samples, drawn as SVG (no library, no inline styles). */
function chart(title: string, unit: string, values: number[], ceiling: number): HTMLElement {
  const w = 480;
  const ht = 140;
  const max = Math.max(ceiling, ...values, 1);
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", `0 0 ${w} ${ht}`);
  svg.setAttribute("role", "img");
  const last = values.length ? values[values.length - 1] : 0;
  svg.setAttribute("aria-label", `${title}: ${last.toFixed(1)} ${unit} now, scale 0 to ${max.toFixed(0)} ${unit}`);
  const line = document.createElementNS(SVG, "polyline");
  const step = w / (KEEP - 1);
  const offset = KEEP - values.length;
  line.setAttribute("points", values.map((v, i) => `${((offset + i) * step).toFixed(1)},${(ht - (v / max) * (ht - 4) - 2).toFixed(1)}`).join(" "));
  line.setAttribute("class", "series");
  const frame = document.createElementNS(SVG, "rect");
  frame.setAttribute("width", String(w));
  frame.setAttribute("height", String(ht));
  frame.setAttribute("class", "frame");
  svg.append(frame, line);
  return h("figure", {}, svg, h("figcaption", {}, `${title}: ${last.toFixed(1)} ${unit} (max ${max.toFixed(0)})`));
}

export function metricsPanel(root: HTMLElement, id: string, scope: Scope): void {
  const region = status();
  const charts = h("div", { class: "charts" });
  const facts = h("p", {});
  const samples: Sample[] = [];
  let previous: { t: number; cpu: number } | null = null;
  let limitMib = 0;
  root.append(h("p", {}, "CPU and memory of the session's processes, sampled every second."), charts, facts, region);
  scope.every(1000, async () => {
    try {
      const m = await json<SessionMetrics>("GET", `${sessionPath(id)}/metrics`);
      const t = performance.now();
      const cpuPercent = previous ? (Math.max(0, m.cpu_used_ms - previous.cpu) / (t - previous.t)) * 100 : 0;
      previous = { t, cpu: m.cpu_used_ms };
      limitMib = m.memory_limit_kib ? m.memory_limit_kib / 1024 : 0;
      samples.push({ t, cpuPercent, memoryMib: m.memory_current_kib / 1024 });
      if (samples.length > KEEP) samples.shift();
      charts.replaceChildren(
        chart("CPU", "%", samples.map((s) => s.cpuPercent), 100),
        chart("Memory", "MiB", samples.map((s) => s.memoryMib), limitMib),
      );
      facts.textContent = `peak ${(m.memory_peak_kib / 1024).toFixed(1)} MiB · ${m.pids_current} processes${m.pids_limit ? ` of ${m.pids_limit}` : ""} · disk ${(m.disk_used_kib / 1024).toFixed(1)} of ${(m.disk_total_kib / 1024).toFixed(0)} MiB · OOM kills ${m.oom_kills}`;
      say(region, "");
    } catch (e) {
      say(region, String(e), true);
    }
  });
}
