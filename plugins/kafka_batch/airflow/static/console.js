// The console's only script: reads the JSON endpoints beside it (relative URLs) and draws tables and
// one SVG chart. It changes nothing: actions are links to Airflow or CLI lines to copy.
"use strict";

const $ = (selector) => document.querySelector(selector);
// The Airflow UI is one level up from this page (<base>/kafka-batch/ -> <base>/).
const airflow = (path) => "../" + path;
// A pipeline's partitions are listed at once up to this many (the CLI's `status` shows as many).
const SHOWN_PARTITIONS = 12;

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

const num = (value) => (value === null || value === undefined ? "–" : Number(value).toLocaleString("en-US"));
const cell = (value, cls) => el("td", {class: cls}, value === null || value === undefined ? "–" : value);
const numCell = (value, cls) => el("td", {class: "num " + (cls || "")}, num(value));

function age(iso) {
  if (!iso) return "–";
  let seconds = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
  const parts = [];
  for (const [unit, size] of [["d", 86400], ["h", 3600], ["m", 60]]) {
    if (seconds >= size) { parts.push(Math.floor(seconds / size) + unit); seconds %= size; }
  }
  if (parts.length < 2) parts.push(seconds + "s");
  return parts.slice(0, 2).join(" ") + " ago";
}

// Times as Airflow's UI shows them: 24-hour, in the timezone chosen there (its "timezone" setting,
// kept in this origin's local storage), else the browser's.
function airflowTimezone() {
  try {
    const chosen = JSON.parse(localStorage.getItem("timezone"));
    if (chosen) {
      new Intl.DateTimeFormat("en-US", {timeZone: chosen});  // throws for a zone this browser does not know
      return chosen;
    }
  } catch (error) { /* not set, not JSON, or not a zone: the browser's */ }
  return Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC";
}

function clock(date, withDay = true) {
  const zone = airflowTimezone();
  const parts = Object.fromEntries(new Intl.DateTimeFormat("en-US", {
    timeZone: zone, hourCycle: "h23", year: "numeric", month: "2-digit", day: "2-digit",
    hour: "2-digit", minute: "2-digit", second: "2-digit"}).formatToParts(date).map((p) => [p.type, p.value]));
  const time = parts.hour + ":" + parts.minute + ":" + parts.second;
  return (withDay ? parts.year + "-" + parts.month + "-" + parts.day + " " : "") + time + " " + zone;
}

const when = (iso) => (iso ? el("span", {title: clock(new Date(iso))}, age(iso)) : "–");

// Inside Airflow the console is an iframe sandboxed without allow-top-navigation, so a link cannot take
// the top window to an Airflow page. The page is the same origin: the link is followed by an anchor of
// Airflow's own document, and Airflow shows its page. Alone, or with a modifier key, links act as usual.
function followInAirflow(event) {
  if (window.top === window || event.button !== 0 || event.ctrlKey || event.metaKey || event.shiftKey) return;
  let top;
  try {
    top = window.top.document;
  } catch (error) {
    return;  // another origin frames the console: the browser decides
  }
  event.preventDefault();
  const anchor = top.createElement("a");
  anchor.href = event.currentTarget.href;
  top.body.append(anchor);
  anchor.click();
  anchor.remove();
}

function airflowLink(path, text, attrs = {}) {
  const link = el("a", {...attrs, href: airflow(path), target: "_top"}, text);
  link.addEventListener("click", followInAirflow);
  return link;
}

const dagLink = (dagId) => airflowLink("dags/" + encodeURIComponent(dagId), dagId, {class: "dag-link"});
const runLink = (dagId, runId) => (dagId
  ? airflowLink("dags/" + encodeURIComponent(dagId) + "/runs/" + encodeURIComponent(runId), runId, {class: "run-link"})
  : el("span", {title: "run by the CLI"}, runId));

async function getJSON(url) {
  const response = await fetch(url, {credentials: "same-origin", headers: {Accept: "application/json"}});
  if (response.status === 401) throw new Error("Not logged in to Airflow (HTTP 401): log in, then reload this page.");
  if (response.status === 403) {  // Airflow's auth manager does not let this user read the pipeline's DAG
    const body = await response.json().catch(() => ({}));
    throw new Error("Not allowed (HTTP 403): " + (body.detail || "you may not read this pipeline's DAG") + ".");
  }
  if (!response.ok) throw new Error("HTTP " + response.status + " for " + url);
  return response.json();
}

function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
  if (!rows.length) {
    const columns = tbody.parentElement.querySelectorAll("thead th").length;
    tbody.append(el("tr", {class: "empty"}, el("td", {colspan: columns, class: "note"}, "none")));
  }
}

async function showOverview() {
  $("#detail").hidden = true;
  const data = await getJSON("api/overview");
  fill($("#pipelines tbody"), data.pipelines.map((p) => {
    const last = p.last_batch;
    return el("tr", {"data-pipeline": p.name},
      el("td", {}, el("a", {href: "#pipeline=" + encodeURIComponent(p.name), class: "pipeline-link"}, p.name)),
      el("td", {}, dagLink(p.dag_id), el("br"), dagLink(p.replay_dag_id)),
      last ? el("td", {class: "last-batch status-" + last.status}, last.kind + " " + last.id + " " + last.status)
        : cell(p.not_started, "last-batch not-started"),
      numCell(p.lag, p.behind.length ? "lag behind" : "lag"),
      el("td", {class: "oldest"}, when(p.oldest_unread_at)),
      el("td", {class: "last-commit"}, when(p.last_commit_at)),
      numCell(p.failed_batches, "failed"), numCell(p.data_loss, "data-loss"), numCell(p.resets, "resets"),
      numCell(p.quarantined, "quarantined"),
      el("td", {class: "error problem"}, p.error || p.kafka_error || p.pool_error || (p.behind.length ? "behind: " + p.behind.join("; ") : "")));
  }));
  $("#invalid-files").replaceChildren(...data.invalid_files.map(
    (f) => el("p", {class: "error"}, "Invalid pipeline file " + f.file + ": " + f.error)));
  $("#overview").hidden = false;
}

function chart(history) {
  const width = 760, height = 180, left = 50, right = 50, top = 10, bottom = 20;
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", width); svg.setAttribute("height", height); svg.setAttribute("id", "chart-svg");
  svg.setAttribute("role", "img");
  const add = (tag, attrs, text) => {
    const node = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    svg.append(node);
    return node;
  };
  if (!history.length) { add("text", {x: left, y: height / 2}, "no committed batch yet"); return svg; }
  const records = history.map((h) => Number(h.records_read || 0));
  const lags = history.map((h) => (h.lag_at_plan === null ? null : Number(h.lag_at_plan)));
  const maxRecords = Math.max(1, ...records), maxLag = Math.max(1, ...lags.filter((l) => l !== null));
  const plotW = width - left - right, plotH = height - top - bottom, step = plotW / history.length;
  add("line", {x1: left, y1: top + plotH, x2: left + plotW, y2: top + plotH, stroke: "#8c959f"});
  add("text", {x: 2, y: top + 8}, num(maxRecords));
  add("text", {x: 2, y: top + plotH}, "0");
  add("text", {x: left + plotW + 4, y: top + 8, fill: "#cf222e"}, num(maxLag));
  history.forEach((h, i) => {
    const barH = (records[i] / maxRecords) * plotH;
    const barW = Math.max(1, Math.min(step * 0.7, 40));
    const bar = add("rect", {x: left + i * step + (step - barW) / 2, y: top + plotH - barH, width: barW,
      height: barH, fill: h.kind === "replay" ? "#bf8700" : "#0969da", "data-batch-id": h.batch_id,
      "data-records": records[i]});
    const title = document.createElementNS(ns, "title");
    title.textContent = h.kind + " " + h.batch_id + ": " + num(records[i]) + " records, lag when planned "
      + num(lags[i]) + ", committed " + h.committed_at;
    bar.append(title);
  });
  const points = lags.map((l, i) => (l === null ? null
    : (left + i * step + step / 2).toFixed(1) + "," + (top + plotH - (l / maxLag) * plotH).toFixed(1))).filter(Boolean);
  if (points.length) add("polyline", {points: points.join(" "), fill: "none", stroke: "#cf222e", "stroke-width": 2});
  add("text", {x: left, y: height - 4}, "records read per committed batch (bars, blue; replays amber), oldest first;"
    + " lag in offsets when each batch was planned (red line, right scale)");
  return svg;
}

async function showLedger(name, value) {
  const [topic, partition] = JSON.parse(value);
  const data = await getJSON("api/pipelines/" + encodeURIComponent(name) + "/ledger?topic="
    + encodeURIComponent(topic) + "&partition=" + partition);
  if (data.error) $("#detail-error").textContent = data.error;
  fill($("#ledger tbody"), data.ranges.map((r) => el("tr", {class: r.state, "data-range-id": r.range_id},
    cell(r.state), numCell(r.from_offset), numCell(r.until_offset), numCell(r.records_read),
    cell(r.schema_ids ? r.schema_ids.join(", ") : null), numCell(r.batch_id),
    cell(r.kind), el("td", {}, when(r.committed_at)),
    cell(r.retired_at ? r.retired_by + " (" + age(r.retired_at) + ")" : null),
    el("td", {},
      airflowLink("dags/" + encodeURIComponent(currentReplayDag), "replay DAG", {class: "replay-link",
        title: "Trigger the replay DAG with these params: " + JSON.stringify(r.replay_params)}),
      " params ", el("code", {class: "replay-params"}, JSON.stringify(r.replay_params)), el("br"),
      el("code", {class: "replay-cli"}, r.replay_cli), el("br"),
      el("code", {class: "rewind-cli"}, r.rewind_cli)))));
}

let currentReplayDag = "";

async function showPipeline(name) {
  $("#overview").hidden = true;
  const data = await getJSON("api/pipelines/" + encodeURIComponent(name) + "?limit=20");
  const p = data.pipeline;
  currentReplayDag = p.replay_dag_id;
  $("#detail-title").textContent = p.name + " — " + p.topics + " → " + p.tables.join(", ");
  $("#detail-links").replaceChildren("DAGs: ", dagLink(p.dag_id), " · ", dagLink(p.replay_dag_id),
    " (replay: open it and press Trigger; the form takes topic, partitions, offsets or times, reason, dry run)");
  $("#detail-error").textContent = [data.error || data.kafka_error, data.pool_error].filter(Boolean).join(" · ");
  $("#detail").hidden = false;
  if (data.error) return;
  fill($("#topics tbody"), data.topics.map((t) => el("tr", {"data-topic": t.topic}, cell(t.topic),
    numCell(t.partitions, "partitions"), numCell(t.lag, "lag"), numCell(t.behind, "behind"),
    cell(t.worst.map(([n, lag]) => n + " (" + lag.toLocaleString() + ")").join(", ") || "–", "worst"),
    numCell(t.last_batch_id))));
  // Every partition is listed on demand; a pipeline of a few shows them at once.
  $("#partitions-section").open = data.partitions.length <= SHOWN_PARTITIONS;
  fill($("#partitions tbody"), data.partitions.map((r) => el("tr", {"data-topic": r.topic, "data-partition": r.partition},
    cell(r.topic), numCell(r.partition), numCell(r.position, "position" + (r.stored ? "" : " not-stored")),
    numCell(r.log_start, "log-start"), numCell(r.last_stable, "last-stable"), numCell(r.lag, "lag"),
    el("td", {class: "oldest"}, when(r.oldest_unread_at)), numCell(r.last_batch_id))));
  $("#kafka-sinks-section").hidden = !data.kafka_sinks.length;
  fill($("#kafka-sinks tbody"), data.kafka_sinks.map((k) => el("tr", {"data-topic": k.topic}, cell(k.topic),
    numCell(k.last_published ? k.last_published.batch_id : null, "last-published"),
    el("td", {class: "open-transactions"}, ...(k.open_transactions.length ? k.open_transactions.map((t) => el("div", {},
      "partition " + t.partition + ": readers held at " + t.stable + " (end " + t.end + "), open ", when(t.since)))
      : ["none"])))));
  $("#chart").replaceChildren(chart(data.history));
  fill($("#batches tbody"), data.batches.map((b) => el("tr", {"data-batch-id": b.id},
    numCell(b.id), cell(b.kind), el("td", {}, b.dag_id ? dagLink(b.dag_id) : "CLI"), el("td", {}, runLink(b.dag_id, b.run_id)),
    numCell(b.try_number), cell(b.status, "status status-" + b.status),
    cell(b.ranges.map((r) => r.topic + "[" + r.partition + "] " + r.from_offset + ".." + r.until_offset).join("\n") || "–", "ranges"),
    numCell(b.records_read, "records"), numCell(b.records_invalid, "invalid"),
    el("td", {class: "num duration"}, b.duration_s === null ? "–" : b.duration_s.toFixed(1) + " s"),
    cell(b.error, "err error"))));
  const select = $("#ledger-partition");
  const seen = data.partitions.map((r) => JSON.stringify([r.topic, r.partition]));
  select.replaceChildren(...seen.map((v) => { const [t, n] = JSON.parse(v); return el("option", {value: v}, t + "[" + n + "]"); }));
  select.onchange = () => showLedger(p.name, select.value).catch(report);
  if (seen.length) await showLedger(p.name, seen[0]);
  else fill($("#ledger tbody"), []);
  fill($("#data-loss tbody"), data.data_loss.map((d) => el("tr", {}, cell(d.topic), numCell(d.partition),
    numCell(d.lost_from), numCell(d.lost_until), el("td", {}, when(d.detected_at)), numCell(d.batch_id))));
  fill($("#resets tbody"), data.resets.map((r) => el("tr", {}, cell(r.topic), numCell(r.partition), cell(r.direction),
    numCell(r.from_position), numCell(r.to_position), numCell(r.ranges_retired), cell(r.requested_by), cell(r.reason),
    el("td", {}, when(r.reset_at)))));
  fill($("#previews tbody"), data.replay_previews.map((r) => el("tr", {}, numCell(r.batch_id), cell(r.table),
    cell(JSON.stringify(r.group_key)), cell(JSON.stringify(r.before)), cell(JSON.stringify(r.after)))));
}

function report(error) {
  $("#message").textContent = error.message;
  $("#message").className = "error";
}

async function route() {
  $("#message").textContent = "Loading…";
  $("#message").className = "note";
  try {
    const match = location.hash.match(/^#pipeline=(.+)$/);
    if (match) await showPipeline(decodeURIComponent(match[1]));
    else await showOverview();
    $("#message").textContent = "";
    $("#updated").textContent = "as of " + clock(new Date(), false);
    document.body.dataset.loaded = location.hash || "#";
  } catch (error) {
    report(error);
  }
}

window.addEventListener("hashchange", route);
route();
