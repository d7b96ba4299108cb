// caidllm live denoising view: races one to three methods on one prompt through the server's
// streaming chat endpoint with commit events, drawing every commit as it lands. A uniform-state decoder
// (DiffusionGemma's: no mask token) is drawn from its draft stream instead: each step's argmax canvas, the
// positions the step accepted and those it renoised, until the canvas ends.
"use strict";

const $ = (sel, root = document) => root.querySelector(sel);
const params = new URLSearchParams(location.search);
const lanesEl = $("#lanes");
let info = { model: "?", methods: [], gen_length: 256, block_length: 64, one_block_methods: [], uniform_methods: [] };

function confidenceClass(s) {
  if (s === null || s === undefined) return "masked";
  return s > 0.5 ? "high" : s >= 0.25 ? "mid" : "low";
}

function shown(text) {
  return text.replace(/\n/g, "↵").replace(/ /g, "·") || "∅";
}

function numberOrRaw(value) {
  // Numbers go as numbers; anything else goes as typed, so the server names what is wrong with it.
  return /^\s*\d+\s*$/.test(value) ? Number(value) : value;
}

async function init() {
  try {
    const r = await fetch("/caidllm/info");
    info = await r.json();
  } catch (e) { /* the lanes will show the server's error */ }
  $("#model-name").textContent = info.model;
  const wanted = (params.get("methods") || "vanilla,cai").split(",").map(s => s.trim()).filter(Boolean);
  for (let i = 0; i < 3; i++) {
    const select = $(`#method-${i}`);
    const names = ["", ...info.methods];
    if (wanted[i] && !names.includes(wanted[i])) names.push(wanted[i]);  // keep a bad name: the server refuses it
    for (const name of names) {
      const opt = document.createElement("option");
      opt.value = name; opt.textContent = name || "(none)";
      select.appendChild(opt);
    }
    select.value = wanted[i] || "";
  }
  if (params.has("prompt")) $("#prompt").value = params.get("prompt");
  $("#gen_length").value = params.get("gen_length") || info.gen_length;
  $("#block_length").value = params.get("block_length") || info.block_length;
  $("#controls").addEventListener("submit", ev => { ev.preventDefault(); runAll(); });
  if (params.get("autorun") === "1") runAll();
}

function runAll() {
  const methods = [0, 1, 2].map(i => $(`#method-${i}`).value).filter(Boolean);
  const settings = {
    prompt: $("#prompt").value,
    gen_length: numberOrRaw($("#gen_length").value),
    block_length: numberOrRaw($("#block_length").value),
    key: $("#api_key").value,
  };
  lanesEl.replaceChildren();
  const lanes = methods.map(m => new Lane(m, settings));
  Promise.all(lanes.map(l => l.run())).then(() => {
    const base = lanes[0];
    for (const lane of lanes) lane.showSpeedup(base);
  });
}

class Lane {
  constructor(method, settings) {
    this.method = method;
    this.settings = settings;
    // Elastic-Cache's official loop decodes gen_length as one block: the page's block_length is the others'.
    this.oneBlock = (info.one_block_methods || []).includes(method);
    // A uniform-state decoder: canvases of the checkpoint's length (the server's block_length), drawn as drafts.
    this.uniform = (info.uniform_methods || []).includes(method);
    this.drafts = 0;
    this.el = $("#lane-template").content.firstElementChild.cloneNode(true);
    this.el.dataset.method = method;
    $(".lane-method", this.el).textContent = method;
    lanesEl.appendChild(this.el);
    this.steps = 0; this.committed = 0; this.answer = ""; this.points = [];
    this.cells = []; this.blocks = [];
    this.setState("running");
    this.buildCanvas();
  }

  role(name) { return $(`[data-role="${name}"]`, this.el); }

  setState(state) {
    this.el.dataset.state = state;
    $(".state-label", this.el).textContent = state;
  }

  // lead: prompt positions in the first block (block-diffusion models lay blocks from the prompt's
  // start, so their first block is part prompt: it shows only its answer positions).
  buildCanvas(lead = 0) {
    const g = this.settings.gen_length;
    const b = this.uniform ? info.block_length : this.oneBlock ? g : this.settings.block_length;
    if (!Number.isInteger(g) || !Number.isInteger(b) || g < 1 || b < 1 || g > 4096) return;
    if (g % b && !this.uniform) return;  // the server names the problem; a canvas's answer may end mid-canvas
    const canvas = this.role("canvas");
    canvas.replaceChildren();
    this.cells = []; this.blocks = []; this.lead = lead;
    for (let start = -lead; start < g; start += b) {
      const block = document.createElement("div");
      block.className = "block";
      for (let i = Math.max(start, 0); i < Math.min(start + b, g); i++) {
        const cell = document.createElement("span");
        cell.className = "cell masked";
        cell.textContent = "·";
        block.appendChild(cell);
        this.cells.push(cell);
      }
      canvas.appendChild(block);
      this.blocks.push(block);
    }
  }

  async run() {
    const s = this.settings;
    const body = { messages: [{ role: "user", content: s.prompt }], stream: true, commit_events: true,
                   method: this.method, gen_length: s.gen_length,
                   ...(this.oneBlock || this.uniform ? {} : { block_length: s.block_length }),
                   ...(this.uniform ? { stream_draft: true } : {}) };
    const headers = { "Content-Type": "application/json" };
    if (s.key) headers.Authorization = `Bearer ${s.key}`;
    this.started = performance.now();
    const ticker = setInterval(() => this.tick(), 100);
    try {
      const res = await fetch("/v1/chat/completions", { method: "POST", headers, body: JSON.stringify(body) });
      if (!res.ok) {
        const err = await res.json().catch(() => ({ error: { message: res.statusText } }));
        throw new Error(err.error ? err.error.message : `HTTP ${res.status}`);
      }
      await this.read(res.body.getReader());
    } catch (e) {
      this.fail(e.message || String(e));
    } finally {
      clearInterval(ticker);
      this.tick();
    }
  }

  async read(reader) {
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const line = buffer.slice(0, cut).trim();
        buffer = buffer.slice(cut + 2);
        if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
        this.chunk(JSON.parse(line.slice(6)));
      }
    }
    if (this.el.dataset.state === "running") this.fail("the stream ended without an answer");
  }

  chunk(c) {
    if (c.error) throw new Error(c.error.message);
    const choice = (c.choices || [])[0];
    if (!choice) return;
    if (c.caidllm && c.caidllm.prefix_cache) this.showPrompt(c.caidllm.prefix_cache);
    if (c.caidllm && c.caidllm.draft) this.showDraft(c.caidllm.draft);
    const events = c.caidllm && c.caidllm.commit_events;
    if (events) {
      this.steps += 1;
      for (const e of events) this.commit(e);
      if (events.length) this.highlight(events[0].block);
    }
    if (choice.delta && choice.delta.content) this.answer += choice.delta.content;
    if (choice.finish_reason) this.finish(c.caidllm || {});
  }

  commit(e) {
    if (e.block === 0 && e.block_start < 0 && this.lead !== -e.block_start) this.buildCanvas(-e.block_start);
    const cell = this.cells[e.position];
    if (e.s_i === null) {  // a uniform-state decoder's finished canvas: no first-step confidence
      if (cell) { this.committed += 1; cell.className = "cell final"; cell.textContent = shown(e.text); cell.title = `position ${e.position}: ${JSON.stringify(e.text)}, canvas ${e.block} ended at step ${e.step + 1}`; }
      return;
    }
    this.committed += 1;
    this.points.push([e.s_i, e.step]);
    if (!cell) return;
    cell.className = `cell ${confidenceClass(e.s_i)}`;
    cell.textContent = shown(e.text);
    cell.title = `position ${e.position}: ${JSON.stringify(e.text)} at step ${e.step} of block ${e.block}, s_i ${e.s_i.toFixed(3)}`;
  }

  // One denoising step of a uniform-state decoder: its draft (the argmax canvas), each position accepted by
  // the step or renoised with a random token (the draft shows the argmax either way; an accepted position's
  // title names the token it kept when that is not the argmax: a sample).
  showDraft(d) {
    this.drafts += 1;
    this.el.dataset.draftSteps = this.drafts;
    const accepted = new Set(d.accepted);
    const kept = new Map(d.accepted.map((p, k) => [p, (d.kept || [])[k]]));
    d.text.forEach((text, i) => {
      const cell = this.cells[d.start + i];
      if (!cell) return;  // past gen_length: the answer is cut there
      cell.className = `cell ${accepted.has(i) ? "accepted" : "renoised"}`;
      cell.textContent = shown(text);
      const other = accepted.has(i) && kept.get(i) !== undefined && kept.get(i) !== d.tokens[i];
      cell.title = `position ${d.start + i}: draft ${JSON.stringify(text)} at step ${d.step} of canvas ${d.canvas}, ${accepted.has(i) ? "accepted" : "renoised"}${other ? ` (kept token ${kept.get(i)}, a sample)` : ""}`;
    });
    this.highlight(d.canvas);
  }

  // The prompt's blocks, those whose keys and values came from the prefix cache drawn as such (one tile
  // per block; the block holding the prompt's end is decoded, so it is always prefilled).
  showPrompt(info) {
    const el = this.role("prompt-blocks");
    const b = info.block_length, n = Math.ceil(info.prompt_positions / b), reused = info.reused_positions / b;
    el.replaceChildren();
    for (let i = 0; i < Math.min(n, 256); i++) {
      const tile = document.createElement("span");
      tile.className = `tile ${i < reused ? "reused" : "prefilled"}`;
      tile.title = `prompt block ${i}: ${i < reused ? "from the prefix cache" : "prefilled"}`;
      el.appendChild(tile);
    }
    const caption = document.createElement("span");
    caption.className = "caption";
    caption.dataset.role = "prompt-caption";
    caption.textContent = `prompt: ${info.reused_positions} of ${info.prompt_positions} positions from the prefix cache`;
    el.appendChild(caption);
    el.hidden = false;
  }

  highlight(block) {
    this.blocks.forEach((el, i) => el.classList.toggle("current", i === block));
  }

  tick() {
    const seconds = ((this.finished || performance.now()) - this.started) / 1000;
    this.elapsed = seconds;
    this.role("step").textContent = this.steps;
    this.role("nfe").textContent = this.nfe !== undefined ? this.nfe : this.steps;
    this.role("committed").textContent = this.committed;
    this.role("elapsed").textContent = `${seconds.toFixed(2)} s`;
    this.role("tps").textContent = seconds > 0 ? (this.committed / seconds).toFixed(0) : "0";
  }

  finish(stats) {
    this.finished = performance.now();
    this.nfe = stats.nfe !== undefined ? stats.nfe : this.steps;
    for (const cell of this.cells) {  // positions after the end token: filled, never decoded
      if (cell.classList.contains("masked")) { cell.className = "cell filled"; cell.textContent = "∅"; }
    }
    this.highlight(-1);
    this.role("answer").textContent = this.answer;
    const unit = this.uniform ? "canvas" : "block";
    if (stats.steps_per_block) this.role("steps-per-block").textContent = `(steps per ${unit} ${JSON.stringify(stats.steps_per_block)})`;
    if (this.uniform) $("figure", this.el).hidden = true;  // no first-step confidence to plot against
    else this.drawChart();
    this.tick();
    this.setState("done");
  }

  fail(message) {
    const el = this.role("error");
    el.textContent = message;
    el.hidden = false;
    this.setState("error");
  }

  showSpeedup(base) {
    if (this.el.dataset.state !== "done" || base.el.dataset.state !== "done") return;
    const speed = base.elapsed / this.elapsed;
    this.role("speedup").textContent = `${speed.toFixed(2)}x`;
    this.role("speedup").title = `wall time against ${base.method}; forward passes ${base.nfe} → ${this.nfe}`;
  }

  drawChart() {
    const svg = this.role("chart");
    const ns = "http://www.w3.org/2000/svg";
    const add = (tag, attrs, text) => {
      const el = document.createElementNS(ns, tag);
      for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
      if (text !== undefined) el.textContent = text;
      svg.appendChild(el);
      return el;
    };
    svg.replaceChildren();
    const maxStep = Math.max(1, ...this.points.map(p => p[1]));
    const x = s => 34 + s * 276, y = t => 140 - (t / maxStep) * 124;
    add("line", { x1: 34, y1: 140, x2: 310, y2: 140, stroke: "#8a93a3" });
    add("line", { x1: 34, y1: 16, x2: 34, y2: 140, stroke: "#8a93a3" });
    for (const s of [0.25, 0.5]) add("line", { x1: x(s), y1: 16, x2: x(s), y2: 140, stroke: "#c9ced6", "stroke-dasharray": "3 3" });
    add("text", { x: 172, y: 156, "font-size": 10, "text-anchor": "middle", fill: "#5b6474" }, "s_i (first-step confidence)");
    add("text", { x: 10, y: 80, "font-size": 10, "text-anchor": "middle", fill: "#5b6474", transform: "rotate(-90 10 80)" }, "commit step");
    add("text", { x: 30, y: 20, "font-size": 9, "text-anchor": "end", fill: "#5b6474" }, String(maxStep));
    add("text", { x: 30, y: 142, "font-size": 9, "text-anchor": "end", fill: "#5b6474" }, "0");
    const colour = { high: "#1b7f3b", mid: "#b07700", low: "#a1192d" };
    for (const [s, t] of this.points) {
      add("circle", { cx: x(s).toFixed(1), cy: y(t).toFixed(1), r: 2.4, fill: colour[confidenceClass(s)], "fill-opacity": 0.75 });
    }
  }
}

init();
